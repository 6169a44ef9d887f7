// CPU sum of squares (for the gradient norm used in clipping) and in-place scaling.
// The sum is cut into fixed-size chunks, each summed in double, and the chunk sums
// are added in order: the same bits for any thread count.
#include <cstddef>
#include <vector>

#include "cpu_kernels.h"

namespace dufu::trainer::cpu {

namespace {
// Large enough that the per-chunk bookkeeping is noise, small enough that a model's
// gradients make hundreds of chunks to share among threads.
constexpr std::size_t kChunk = 1 << 16;
}  // namespace

double sum_of_squares(const float* values, std::size_t n) {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
    const std::size_t begin = chunk * kChunk;
    const std::size_t end = begin + kChunk < n ? begin + kChunk : n;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (std::size_t i = begin; i < end; ++i) sum += static_cast<double>(values[i]) * values[i];
    partial[chunk] = sum;
  }
  double total = 0.0;
  for (const double p : partial) total += p;
  return total;
}

void scale_in_place(float* values, float scale, std::size_t n) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) values[i] *= scale;
}

}  // namespace dufu::trainer::cpu
