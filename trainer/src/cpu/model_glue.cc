// The CPU's versions of the glue between the model's kernels: the plain residual add
// at the end of a pipeline stage and the mean of the per-row losses. They sit in the
// kernel table so that a device backend keeps them in its own memory.
#include <cstddef>
#include <cstdint>

#include "cpu_kernels.h"

namespace dufu::trainer::cpu {

void add(TensorOut out, const float* a, const float* b, std::size_t n) {
  float* sum = out.values;
  if (!out.bf16()) {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
    return;
  }
  std::uint16_t* bits = out.bits;
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) sum[i] = store_as_bf16(a[i] + b[i], bits == nullptr ? nullptr : bits + i);
}

void masked_mean_loss(float* mean_out, const float* losses, const std::int32_t* targets, int N) {
  // One thread, in row order: the sum is the loss the log prints, the same bits on
  // every run and thread count.
  double sum = 0.0;
  std::size_t counted = 0;
  for (int i = 0; i < N; ++i) {
    if (targets[i] == -1) continue;
    sum += losses[i];
    ++counted;
  }
  mean_out[0] = counted == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(counted));
}

}  // namespace dufu::trainer::cpu
