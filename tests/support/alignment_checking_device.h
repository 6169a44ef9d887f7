// A test Device that runs the CPU's kernels and notes every matmul whose activation
// operands (x, out, dout, dx, the GELU's pre-activation) do not start on
// kTensorAlignmentBytes: the tensors the model carves out of its activation buffers
// (buffer_carver.h), which cuBLASLt reads on a GPU. The weights, laid out by the
// parameter layout, are not checked (cuBLASLt is told their real alignment).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "support/forwarding_cpu_device.h"

namespace dufu::testing {

class AlignmentCheckingDevice final : public ForwardingCpuDevice {
 public:
  AlignmentCheckingDevice() : table_(cpu().kernels()) {
    using trainer::KeptIn;
    using trainer::KernelTable;
    using trainer::TensorIn;
    using trainer::TensorOut;
    // A kept output's bits are written by the GEMM itself on a GPU (bf16 D): checked too.
    table_.matmul_forward = [](TensorOut out, TensorIn x, TensorIn weight, const float* bias, int N, int C, int OC) {
      check("matmul_forward", {out.values, x.data, out.bits});
      cpu().kernels().matmul_forward(out, x, weight, bias, N, C, OC);
    };
    table_.matmul_bias_gelu_forward = [](TensorOut out, TensorOut pre, TensorIn x, TensorIn weight, const float* bias,
                                         int N, int C, int OC) {
      check("matmul_bias_gelu_forward", {out.values, pre.values, x.data, out.bits, pre.bits});
      cpu().kernels().matmul_bias_gelu_forward(out, pre, x, weight, bias, N, C, OC);
    };
    // dout's bits go to the GEMM as they are on a GPU: checked too.
    table_.matmul_backward = [](TensorOut dx, float* dweight, float* dbias, KeptIn dout, TensorIn x, TensorIn weight,
                                int N, int C, int OC) {
      check("matmul_backward", {dx.values, dout.values, x.data, dout.bits});
      cpu().kernels().matmul_backward(dx, dweight, dbias, dout, x, weight, N, C, OC);
    };
    table_.matmul_gelu_backward = [](TensorOut dpre, float* dweight, float* dbias, KeptIn dout, TensorIn x,
                                     TensorIn weight, const float* pre, int N, int C, int OC) {
      check("matmul_gelu_backward", {dpre.values, dout.values, x.data, pre, dout.bits});
      cpu().kernels().matmul_gelu_backward(dpre, dweight, dbias, dout, x, weight, pre, N, C, OC);
    };
  }
  std::string describe() const override { return "cpu checking the matmuls' operand alignment"; }
  const trainer::KernelTable& kernels() const override { return table_; }

  // "matmul_forward operand 2 at ...04" for every misaligned operand seen, then cleared.
  static std::vector<std::string> take_misaligned() {
    std::vector<std::string> seen;
    seen.swap(misaligned());
    return seen;
  }

 private:
  static std::vector<std::string>& misaligned() {
    static std::vector<std::string> seen;
    return seen;
  }
  static void check(const char* kernel, std::initializer_list<const void*> operands) {
    int position = 0;
    for (const void* operand : operands) {
      ++position;
      const auto address = reinterpret_cast<std::uintptr_t>(operand);
      if (operand != nullptr && address % trainer::kTensorAlignmentBytes != 0) {
        misaligned().push_back(str_cat(kernel, " operand ", position, " at ", operand));
      }
    }
  }

  trainer::KernelTable table_;
};

}  // namespace dufu::testing
