// CPU causal self-attention, one (batch, head) at a time, in blocks of query rows so
// the products run in sgemm instead of scalar dot-product loops.
//
// Forward, per block of rows [t0, t1): the scaled scores against keys [0, t1) come
// from one sgemm into a per-thread tile; then one pass per row over its visible keys
// k <= t (max; exp and sum; normalize) writes the probabilities to att and to the
// tile, whose masked tail is zeroed so a second sgemm gives out = P V. Only the tile
// sees scores above the diagonal; att's masked entries are never written or read.
//
// Backward: each (batch, head) is one task that owns its slices of dq, dk and dv, so
// dk and dv accumulate across query blocks inside the task, without atomics and in an
// order that does not depend on the thread count.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "cpu_kernels.h"
#include "dufu/trainer/device/kernel_math.h"

namespace dufu::trainer::cpu {

namespace {

// Rows per block: enough for sgemm to run near speed with hs = 64 as the inner
// dimension, few enough that the zero-filled triangle of the diagonal block is small.
constexpr int kQueryBlock = 64;

// Where each head's rows live in qkv [B, T, 3C], att [B, NH, T, T] and out [B, T, C].
struct Layout {
  int T, C, NH, hs;
  std::size_t C3;
  float scale;  // of the scores, 1/sqrt(hs)
  // Head h's q of batch b at position 0; k and v follow at +C and +2C.
  std::size_t head_offset(int b, int h) const {
    return static_cast<std::size_t>(b) * T * C3 + static_cast<std::size_t>(h) * hs;
  }
  // Row t of att for (b, h).
  std::size_t att_row(int b, int h, int t) const {
    return ((static_cast<std::size_t>(b) * NH + h) * T + t) * static_cast<std::size_t>(T);
  }
  // Head h's slice of out/dout row (b, t).
  std::size_t out_offset(int b, int t, int h) const {
    return (static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs;
  }
};

Layout make_layout(int T, int C, int NH) {
  const int hs = C / NH;
  return {T, C, NH, hs, 3 * static_cast<std::size_t>(C), 1.0f / std::sqrt(static_cast<float>(hs))};
}

}  // namespace

DUFU_CPU_CLONES void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  use_single_threaded_blas();
  const Layout L = make_layout(T, C, NH);
  const int ldqkv = static_cast<int>(L.C3);
  const int blocks = (T + kQueryBlock - 1) / kQueryBlock;
  const int heads = B * NH;
#pragma omp parallel
  {
    std::vector<float> tile(static_cast<std::size_t>(std::min(kQueryBlock, T)) * T);
    // The last blocks see the most keys: hand them out first so the threads finish together.
#pragma omp for schedule(dynamic)
    for (int task = 0; task < heads * blocks; ++task) {
      const int block = blocks - 1 - task / heads;
      const int b = task % heads / NH;
      const int h = task % NH;
      const int t0 = block * kQueryBlock;
      const int t1 = std::min(T, t0 + kQueryBlock);
      const int rows = t1 - t0;
      const float* q = qkv + L.head_offset(b, h);
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* scores = tile.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, L.hs, L.scale, q + t0 * L.C3, ldqkv, k, ldqkv,
                  0.0f, scores, t1);
      for (int r = 0; r < rows; ++r) {
        const int t = t0 + r;
        float* s = scores + static_cast<std::size_t>(r) * t1;
        float max_score = s[0];
#pragma omp simd reduction(max : max_score)
        for (int j = 1; j <= t; ++j) max_score = s[j] > max_score ? s[j] : max_score;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j <= t; ++j) {
          const float e = exp_approx(s[j] - max_score);
          s[j] = e;
          sum += e;
        }
        const float inv_sum = 1.0f / sum;
        float* a = att + L.att_row(b, h, t);
#pragma omp simd
        for (int j = 0; j <= t; ++j) {
          s[j] *= inv_sum;
          a[j] = s[j];
        }
        std::fill(s + t + 1, s + t1, 0.0f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, L.hs, t1, 1.0f, scores, t1, v, ldqkv, 0.0f,
                  out + L.out_offset(b, t0, h), C);
    }
  }
}

DUFU_CPU_CLONES void attention_backward(float* dqkv, [[maybe_unused]] float* datt_scratch, const float* dout,
                                        const float* qkv, const float* att, int B, int T, int C, int NH) {
  use_single_threaded_blas();
  const Layout L = make_layout(T, C, NH);
  const int ldqkv = static_cast<int>(L.C3);
  const int blocks = (T + kQueryBlock - 1) / kQueryBlock;
#pragma omp parallel
  {
    const std::size_t tile_size = static_cast<std::size_t>(std::min(kQueryBlock, T)) * T;
    std::vector<float> probs(tile_size), grads(tile_size);
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const float* q = qkv + L.head_offset(b, h);
        const float* k = q + C;
        const float* v = q + 2 * C;
        float* dq = dqkv + L.head_offset(b, h);
        float* dk = dq + C;
        float* dv = dq + 2 * C;
        // dk and dv accumulate over the query blocks; dq is written once per block.
        for (int t = 0; t < T; ++t) {
          std::fill(dk + t * L.C3, dk + t * L.C3 + L.hs, 0.0f);
          std::fill(dv + t * L.C3, dv + t * L.C3 + L.hs, 0.0f);
        }
        for (int block = 0; block < blocks; ++block) {
          const int t0 = block * kQueryBlock;
          const int t1 = std::min(T, t0 + kQueryBlock);
          const int rows = t1 - t0;
          const float* g = dout + L.out_offset(b, t0, h);
          // P: the saved probabilities, zero above the diagonal.
          float* p = probs.data();
          for (int r = 0; r < rows; ++r) {
            const int t = t0 + r;
            const float* a = att + L.att_row(b, h, t);
            float* pr = p + static_cast<std::size_t>(r) * t1;
            std::copy(a, a + t + 1, pr);
            std::fill(pr + t + 1, pr + t1, 0.0f);
          }
          // dP = dout V^T, dV += P^T dout
          float* dp = grads.data();
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, L.hs, 1.0f, g, C, v, ldqkv, 0.0f, dp, t1);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, L.hs, rows, 1.0f, p, t1, g, C, 1.0f, dv, ldqkv);
          // Softmax backward in O(t) per row: dscore_j = P_j (dP_j - sum_i P_i dP_i),
          // times the 1/sqrt(hs) of the scores; zero above the diagonal.
          for (int r = 0; r < rows; ++r) {
            const int t = t0 + r;
            const float* pr = p + static_cast<std::size_t>(r) * t1;
            float* dr = dp + static_cast<std::size_t>(r) * t1;
            float weighted = 0.0f;
#pragma omp simd reduction(+ : weighted)
            for (int j = 0; j <= t; ++j) weighted += pr[j] * dr[j];
#pragma omp simd
            for (int j = 0; j <= t; ++j) dr[j] = pr[j] * (dr[j] - weighted) * L.scale;
            std::fill(dr + t + 1, dr + t1, 0.0f);
          }
          // dQ = dS K, dK += dS^T Q
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, L.hs, t1, 1.0f, dp, t1, k, ldqkv, 0.0f,
                      dq + t0 * L.C3, ldqkv);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, L.hs, rows, 1.0f, dp, t1, q + t0 * L.C3, ldqkv, 1.0f,
                      dk, ldqkv);
        }
      }
    }
  }
}

}  // namespace dufu::trainer::cpu
