// The CPU's matmuls with bf16 operands (train.precision = bf16): OpenBLAS has no bf16
// product this build can rely on, so the operands are widened to floats in a scratch
// buffer and go through the fp32 kernels, which is the recipe's arithmetic exactly (a
// bf16 value widens to the same float). The scratch grows to the largest product and
// is kept, so a training step allocates nothing after the first.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu_kernels.h"

namespace dufu::trainer::cpu {

namespace {

// x and weight as floats, one after the other in the scratch. The kernels run on the
// thread that calls them (they parallelise inside), one at a time.
struct WidenedOperands {
  const float* x;
  const float* weight;
  WidenedOperands(const std::uint16_t* x_bits, const std::uint16_t* weight_bits, int N, int C, int OC) {
    static std::vector<float> scratch;
    const auto rows = static_cast<std::size_t>(N);
    const auto inputs = static_cast<std::size_t>(C);
    const std::size_t needed = widened_operand_floats(rows, inputs, static_cast<std::size_t>(OC));
    if (scratch.size() < needed) scratch.resize(needed);
    load_bf16(scratch.data(), x_bits, rows * inputs);
    load_bf16(scratch.data() + rows * inputs, weight_bits, needed - rows * inputs);
    x = scratch.data();
    weight = scratch.data() + rows * inputs;
  }
};

}  // namespace

void matmul_forward_bf16(float* out, const std::uint16_t* x, const std::uint16_t* weight, const float* bias, int N,
                         int C, int OC) {
  const WidenedOperands operands(x, weight, N, C, OC);
  matmul_forward(out, operands.x, operands.weight, bias, N, C, OC);
}

void matmul_bias_gelu_forward_bf16(float* out, float* pre, const std::uint16_t* x, const std::uint16_t* weight,
                                   const float* bias, int N, int C, int OC) {
  const WidenedOperands operands(x, weight, N, C, OC);
  matmul_bias_gelu_forward(out, pre, operands.x, operands.weight, bias, N, C, OC);
}

void matmul_backward_bf16(float* dx, float* dweight, float* dbias, const float* dout, const std::uint16_t* x,
                          const std::uint16_t* weight, int N, int C, int OC) {
  const WidenedOperands operands(x, weight, N, C, OC);
  matmul_backward(dx, dweight, dbias, dout, operands.x, operands.weight, N, C, OC);
}

void matmul_gelu_backward_bf16(float* dpre, float* dweight, float* dbias, const float* dout, const std::uint16_t* x,
                               const std::uint16_t* weight, const float* pre, int N, int C, int OC) {
  const WidenedOperands operands(x, weight, N, C, OC);
  matmul_gelu_backward(dpre, dweight, dbias, dout, operands.x, operands.weight, pre, N, C, OC);
}

}  // namespace dufu::trainer::cpu
