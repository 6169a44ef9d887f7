// The CPU's bf16 rounding: the CPU device keeps every tensor as floats, so where the
// mixed-precision recipe stores bf16 it rounds the values in place (bf16.h).
#include <cstddef>

#include "cpu_kernels.h"
#include "dufu/trainer/bf16.h"

namespace dufu::trainer::cpu {

// Memory-bound and short: a quickstart activation (under a million floats) takes a few
// hundred microseconds on one thread, less than a parallel region's fork and barrier
// cost on a loaded machine, so only arrays beyond that go to the OpenMP threads.
inline constexpr std::size_t kParallelFrom = std::size_t{1} << 20;

DUFU_CPU_CLONES void round_to_bf16(float* values, std::size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelFrom)
  for (std::size_t i = 0; i < n; ++i) values[i] = ::dufu::trainer::round_to_bf16(values[i]);
}

}  // namespace dufu::trainer::cpu
