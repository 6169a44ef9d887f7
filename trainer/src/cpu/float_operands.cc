// The CPU's matmuls read bf16 operands (train.precision = bf16) as floats: OpenBLAS has
// no bf16 product this build can rely on, so the operands are widened to floats in a
// scratch buffer and go through the fp32 products, which is the recipe's arithmetic
// exactly (a bf16 value widens to the same float). The scratch grows to the largest
// product and is kept, so a training step allocates nothing after the first.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu_kernels.h"

namespace dufu::trainer::cpu {

// The kernels run on the thread that calls them (they parallelise inside), one at a
// time, so one scratch serves every product.
FloatOperands::FloatOperands(const char* entry, TensorIn x_in, TensorIn weight_in, int N, int C, int OC) {
  if (!bf16_operands(entry, x_in, weight_in)) {
    x = x_in.values();
    weight = weight_in.values();
    return;
  }
  static std::vector<float> scratch;
  const auto rows = static_cast<std::size_t>(N);
  const auto inputs = static_cast<std::size_t>(C);
  const std::size_t needed = widened_operand_floats(rows, inputs, static_cast<std::size_t>(OC));
  if (scratch.size() < needed) scratch.resize(needed);
  load_bf16(scratch.data(), x_in.bits(), rows * inputs);
  load_bf16(scratch.data() + rows * inputs, weight_in.bits(), needed - rows * inputs);
  x = scratch.data();
  weight = scratch.data() + rows * inputs;
}

}  // namespace dufu::trainer::cpu
