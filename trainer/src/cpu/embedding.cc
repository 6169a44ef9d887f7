// CPU token + position embedding. The backward scatters into dwte, where positions
// sharing a token collide; instead of atomics each thread owns a block of channels
// and walks the rows in order, so the sums are identical for any thread count.
#include <cstddef>
#include <cstdint>

#include "dufu/trainer/kernels.h"

namespace dufu::trainer {

namespace {
// Wide enough that each row segment is a few cache lines, narrow enough that
// C = 768 still splits into 12 blocks for the threads to share.
constexpr int kChannelBlock = 64;
}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t row = static_cast<std::size_t>(b) * T + t;
      float* o = out + row * C;
      const float* token_row = wte + static_cast<std::size_t>(tokens[row]) * C;
      const float* position_row = wpe + static_cast<std::size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = token_row[c] + position_row[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C) {
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
  const std::size_t N = static_cast<std::size_t>(B) * T;
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int block = 0; block < blocks; ++block) {
      const int c0 = block * kChannelBlock;
      const int c1 = c0 + kChannelBlock < C ? c0 + kChannelBlock : C;
      for (std::size_t row = 0; row < N; ++row) {
        float* g = dwte + static_cast<std::size_t>(tokens[row]) * C;
        const float* d = dout + row * C;
        for (int c = c0; c < c1; ++c) g[c] += d[c];
      }
    }
    // Rows of dwpe are disjoint per position, so positions split cleanly.
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t) {
      float* g = dwpe + static_cast<std::size_t>(t) * C;
      for (int b = 0; b < B; ++b) {
        const float* d = dout + (static_cast<std::size_t>(b) * T + t) * C;
        for (int c = 0; c < C; ++c) g[c] += d[c];
      }
    }
  }
}

}  // namespace dufu::trainer
