// The CPU's bf16 rounding: the CPU device keeps every tensor as floats, so where the
// mixed-precision recipe stores bf16 it rounds the values in place (bf16.h).
#include <cstddef>

#include "cpu_kernels.h"
#include "dufu/trainer/bf16.h"

namespace dufu::trainer::cpu {

void round_to_bf16(float* values, std::size_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::size_t i = 0; i < n; ++i) values[i] = ::dufu::trainer::round_to_bf16(values[i]);
}

}  // namespace dufu::trainer::cpu
