// The CPU's bf16 rounding and storage: the kernels compute on floats, so where the
// mixed-precision recipe stores bf16 the values are rounded in place (bf16.h), and the
// activations kept for the backward are stored as bf16 bits.
#include <cstddef>
#include <cstdint>

#include "cpu_kernels.h"
#include "device/bf16.h"

namespace dufu::trainer::cpu {

// Memory-bound and short, so small arrays stay on one thread, where a parallel
// region's fork and barrier would cost more than the pass. The activations of the
// quickstart model (2e5 to 2e6 floats) are above the cut: measured there on 2 threads,
// splitting them kept a bf16 step within ~3% of fp32's, one thread for everything
// under 1M floats cost ~20%.
inline constexpr std::size_t kParallelFrom = std::size_t{1} << 16;

DUFU_CPU_CLONES void round_to_bf16(float* values, std::size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelFrom)
  for (std::size_t i = 0; i < n; ++i) values[i] = ::dufu::trainer::round_to_bf16(values[i]);
}

DUFU_CPU_CLONES void store_bf16(std::uint16_t* stored, float* values, std::size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelFrom)
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t bits = float_to_bf16_bits(values[i]);
    stored[i] = bits;
    values[i] = bf16_bits_to_float(bits);
  }
}

DUFU_CPU_CLONES void to_bf16(std::uint16_t* bits, const float* values, std::size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelFrom)
  for (std::size_t i = 0; i < n; ++i) bits[i] = float_to_bf16_bits(values[i]);
}

DUFU_CPU_CLONES void load_bf16(float* values, const std::uint16_t* stored, std::size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelFrom)
  for (std::size_t i = 0; i < n; ++i) values[i] = bf16_bits_to_float(stored[i]);
}

}  // namespace dufu::trainer::cpu
