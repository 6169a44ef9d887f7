// CPU token + position embedding, whole (serial) or vocab-parallel, where each
// tensor-parallel rank holds a range of wte's rows; the forwards also read the bf16
// working copy of the weights (train.precision = bf16). The backward scatters into dwte,
// where positions sharing a token collide; instead of atomics each thread owns a block
// of channels and walks the rows in order, so the sums are identical for any thread
// count. With position ids (document masking: positions restart in each document),
// dwpe's rows collide as dwte's do and are summed the same way.
#include <climits>
#include <cstddef>
#include <cstdint>

#include "cpu_kernels.h"
#include "device/bf16.h"

namespace dufu::trainer::cpu {

namespace {
// Wide enough that each row segment is a few cache lines, narrow enough that
// C = 768 still splits into 12 blocks for the threads to share.
constexpr int kChannelBlock = 64;

float as_float(float value) { return value; }
float as_float(std::uint16_t bits) { return bf16_bits_to_float(bits); }

// Every forward: tokens outside [vocab_begin, vocab_end) look up a zero row; wpe may
// be null, and positions (null: row t reads wpe's row t). The serial kernel passes the
// whole id range, so only the per-row test is added to its loop. Weight is float, or
// bf16 bits. Each row kept as `kept` says.
template <typename Weight>
void embed(TensorOut kept, const std::int32_t* tokens, const std::int32_t* positions, const Weight* wte,
           const Weight* wpe, int vocab_begin, int vocab_end, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t row = static_cast<std::size_t>(b) * T + t;
      float* o = kept.values + row * C;
      const std::int32_t id = tokens[row];
      const bool in_range = id >= vocab_begin && id < vocab_end;
      const Weight* token_row = in_range ? wte + static_cast<std::size_t>(id - vocab_begin) * C : nullptr;
      const std::size_t position = positions == nullptr ? static_cast<std::size_t>(t) : positions[row];
      const Weight* position_row = wpe == nullptr ? nullptr : wpe + position * C;
      if (in_range && position_row != nullptr) {
        for (int c = 0; c < C; ++c) o[c] = as_float(token_row[c]) + as_float(position_row[c]);
      } else if (in_range) {
        for (int c = 0; c < C; ++c) o[c] = as_float(token_row[c]);
      } else if (position_row != nullptr) {
        for (int c = 0; c < C; ++c) o[c] = as_float(position_row[c]);
      } else {
        for (int c = 0; c < C; ++c) o[c] = 0.0f;
      }
      keep_row(kept, row * C, C);
    }
  }
}

// Both backwards: only tokens in [vocab_begin, vocab_end) reach dwte; dwpe may be null.
void scatter(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, const std::int32_t* positions,
             int vocab_begin, int vocab_end, int B, int T, int C) {
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
  const std::size_t N = static_cast<std::size_t>(B) * T;
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int block = 0; block < blocks; ++block) {
      const int c0 = block * kChannelBlock;
      const int c1 = c0 + kChannelBlock < C ? c0 + kChannelBlock : C;
      for (std::size_t row = 0; row < N; ++row) {
        const float* d = dout + row * C;
        // Every row reaches dwpe, whichever rank's rows of wte its token is in.
        if (dwpe != nullptr && positions != nullptr) {
          float* gp = dwpe + static_cast<std::size_t>(positions[row]) * C;
          for (int c = c0; c < c1; ++c) gp[c] += d[c];
        }
        const std::int32_t id = tokens[row];
        if (id < vocab_begin || id >= vocab_end) continue;
        float* g = dwte + static_cast<std::size_t>(id - vocab_begin) * C;
        for (int c = c0; c < c1; ++c) g[c] += d[c];
      }
    }
    // Without position ids, rows of dwpe are disjoint per position, so positions split cleanly.
    if (dwpe != nullptr && positions == nullptr) {
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
}
}  // namespace

void embedding_forward(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions, TensorIn wte,
                       TensorIn wpe, int B, int T, int C) {
  if (bf16_operands("embedding_forward", wte, wpe)) {
    embed(out, tokens, positions, wte.bits(), wpe.bits(), 0, INT_MAX, B, T, C);
  } else {
    embed(out, tokens, positions, wte.values(), wpe.values(), 0, INT_MAX, B, T, C);
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        const std::int32_t* positions, int B, int T, int C) {
  scatter(dwte, dwpe, dout, tokens, positions, 0, INT_MAX, B, T, C);
}

void vocab_parallel_embedding_forward(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions,
                                      TensorIn wte, TensorIn wpe, int vocab_begin, int V_local, int B, int T, int C) {
  const int vocab_end = vocab_begin + V_local;
  if (bf16_operands("vocab_parallel_embedding_forward", wte, wpe)) {
    embed(out, tokens, positions, wte.bits(), wpe.bits(), vocab_begin, vocab_end, B, T, C);
  } else {
    embed(out, tokens, positions, wte.values(), wpe.values(), vocab_begin, vocab_end, B, T, C);
  }
}

void vocab_parallel_embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                       const std::int32_t* positions, int vocab_begin, int V_local, int B, int T,
                                       int C) {
  scatter(dwte, dwpe, dout, tokens, positions, vocab_begin, vocab_begin + V_local, B, T, C);
}

}  // namespace dufu::trainer::cpu
