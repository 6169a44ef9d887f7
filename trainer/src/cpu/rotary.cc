// CPU rotary position embedding, forward and backward, in place on the q and k heads
// of a fused qkv buffer. The cosines and sines are computed on the fly, once per
// position and pair, and then applied to every q and k head of the row: no table to
// allocate or keep in step with T and theta, and the cost (hs/2 double cos/sin per
// row) is small beside reading and writing (NH + NKV) hs values.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu_kernels.h"
#include "device/llama_math.h"

namespace dufu::trainer::cpu {

namespace {

// direction +1 turns by +angle (forward), -1 by -angle (backward: the transpose). Each
// row kept whole as `kept` says, its v heads too.
// positions null: row t's position is t.
void rotate_rows(TensorOut kept, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs, float theta,
                 float direction) {
  const int half = hs / 2;
  const int rotated_heads = NH + NKV;  // q heads, then k heads; v follows, untouched
  const std::size_t row_width = static_cast<std::size_t>(NH + 2 * NKV) * hs;
#pragma omp parallel
  {
    std::vector<float> cos_t(half), sin_t(half);
#pragma omp for schedule(static)
    for (int n = 0; n < B * T; ++n) {
      const int t = positions == nullptr ? n % T : positions[n];
      for (int i = 0; i < half; ++i) {
        rotary_cos_sin(t, i, hs, theta, cos_t[i], sin_t[i]);
        sin_t[i] *= direction;
      }
      float* row = kept.values + static_cast<std::size_t>(n) * row_width;
      for (int head = 0; head < rotated_heads; ++head) {
        float* x = row + static_cast<std::size_t>(head) * hs;
        for (int i = 0; i < half; ++i) rotate_pair(x[i], x[i + half], cos_t[i], sin_t[i]);
      }
      keep_row(kept, static_cast<std::size_t>(n) * row_width, static_cast<int>(row_width));
    }
  }
}

}  // namespace

void rotary_forward(TensorOut qkv, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs,
                    float theta) {
  rotate_rows(qkv, positions, B, T, NH, NKV, hs, theta, 1.0f);
}

void rotary_backward(TensorOut dqkv, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs,
                     float theta) {
  rotate_rows(dqkv, positions, B, T, NH, NKV, hs, theta, -1.0f);
}

}  // namespace dufu::trainer::cpu
