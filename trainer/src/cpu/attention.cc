// CPU causal self-attention, flash-style (the algorithm and its math are in
// device/flash_attention.h, shared with the CUDA kernel): a block of query rows meets
// the key/value tiles left of its diagonal one at a time, with an online softmax, so
// no T x T matrix exists, stored or not; each thread keeps one score tile. The tile
// products run in sgemm rather than in scalar dot-product loops.
//
// Forward: one task per (batch, query head, query block), the blocks with the most
// keys first so the threads finish together; only the rows' log-sum-exp is kept.
//
// Backward: one task per (batch, K/V head), which owns its slices of dk and dv and the
// dq of its group's query heads, so each of them accumulates over the heads and tiles
// in one fixed order, whatever the thread count, without atomics. Grouped heads thus
// cut the backward's parallelism to B NKV tasks (B for multi-query attention): the
// price of a fixed order without a per-head copy of dk and dv to reduce.
//
// bf16 qkv (bf16 products, kernel_table.h): qkv is widened once, dout is rounded to
// bf16 for the products it enters (D = dout · out keeps its fp32 values), and the
// tiles that enter a second product (P for P V and dV, dS for dQ and dK) are rounded
// to bf16 after they are computed in fp32: the values a tensor core would be given.
//
// Document masking (document_starts): a query row sees the keys of its own document
// only, from its start to the row itself. A query block's key tiles then begin at the
// start of its first row's document (the earliest any of its rows sees), so the tiles
// of earlier documents are never computed; in the tiles it does compute, each row's
// keys outside its range are masked as the causal part of the diagonal tile is.
#include <cblas.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu_kernels.h"
#include "device/bf16.h"
#include "device/flash_attention.h"

namespace dufu::trainer::cpu {

namespace {

// Query rows per block: enough for sgemm to run near speed with hs = 64 as the inner
// dimension. Keys per tile: wide, since a CPU thread's score tile stays in its cache
// anyway and fewer, larger sgemm calls cost less; the diagonal tile's masked part, at
// most kQueryBlock x kKeyTile, is the work this wastes.
constexpr int kQueryBlock = 64;
constexpr int kKeyTile = 256;

// Query rows [t0, t1) of one (batch, head).
struct QueryBlock {
  int t0, t1;
  int rows() const { return t1 - t0; }
};

// The largest of a score row's first `visible` entries (visible >= 1).
inline float visible_max(const float* row, int visible) {
  float max_score = row[0];
#pragma omp simd reduction(max : max_score)
  for (int j = 1; j < visible; ++j) max_score = row[j] > max_score ? row[j] : max_score;
  return max_score;
}

// The keys of the tile [j0, j0 + cols) that query t sees, as tile columns [first,
// end): from its document's start (0 without masking) to t itself. Empty when end <=
// first.
struct VisibleKeys {
  int first, end;
  int count() const { return end - first; }
};
inline VisibleKeys visible_keys(int t, int document_start, int j0, int cols) {
  return {std::clamp(document_start - j0, 0, cols), std::clamp(t - j0 + 1, 0, cols)};
}


// qkv as floats: fp32 as it is, bf16 bits widened into `widened`.
const float* qkv_floats(TensorIn qkv, int B, int T, const FlashAttentionShape& shape, std::vector<float>& widened) {
  if (!qkv.bf16()) return static_cast<const float*>(qkv.data);
  const auto* bits = static_cast<const std::uint16_t*>(qkv.data);
  widened.resize(static_cast<std::size_t>(B) * static_cast<std::size_t>(T) * shape.qkv_stride());
#pragma omp parallel for
  for (std::size_t i = 0; i < widened.size(); ++i) widened[i] = bf16_bits_to_float(bits[i]);
  return widened.data();
}

// The first `count` values of a tile row as bf16 products take them.
inline void round_row_to_bf16(float* row, int count) {
#pragma omp simd
  for (int j = 0; j < count; ++j) row[j] = ::dufu::trainer::round_to_bf16(row[j]);
}

}  // namespace

DUFU_CPU_CLONES void attention_forward(TensorOut kept_out, float* lse, TensorIn qkv_in,
                                       const std::int32_t* document_starts, int B, int T, int NH, int NKV, int hs) {
  float* out = kept_out.values;
  check_attention_heads(NH, NKV);
  use_single_threaded_blas();
  const FlashAttentionShape shape{T, NH, NKV, hs, document_starts};
  const bool bf16_products = qkv_in.bf16();
  std::vector<float> widened;
  const float* qkv = qkv_floats(qkv_in, B, T, shape, widened);
  const float scale = shape.scale();
  const int ld = static_cast<int>(shape.qkv_stride());
  const int out_ld = static_cast<int>(shape.out_stride());
  const int blocks = (T + kQueryBlock - 1) / kQueryBlock;
  const int heads = B * NH;
#pragma omp parallel
  {
    std::vector<float> tile(static_cast<std::size_t>(kQueryBlock) * kKeyTile);
    OnlineSoftmax softmax[kQueryBlock];
#pragma omp for schedule(dynamic)
    for (int task = 0; task < heads * blocks; ++task) {
      const int block = blocks - 1 - task / heads;
      const int b = task % heads / NH;
      const int h = task % NH;
      const QueryBlock qb{block * kQueryBlock, std::min(T, (block + 1) * kQueryBlock)};
      const float* q = qkv + shape.q_offset(b, qb.t0, h);
      const float* k = qkv + shape.k_offset(b, 0, shape.kv_head(h));
      const float* v = qkv + shape.v_offset(b, 0, shape.kv_head(h));
      float* o = out + shape.out_offset(b, qb.t0, h);
      for (int r = 0; r < qb.rows(); ++r) {
        softmax[r] = online_softmax_start();
        std::fill(o + static_cast<std::size_t>(r) * out_ld, o + static_cast<std::size_t>(r) * out_ld + hs, 0.0f);
      }
      for (int j0 = shape.document_start(b, qb.t0); j0 < qb.t1; j0 += kKeyTile) {
        const int cols = std::min(qb.t1 - j0, kKeyTile);
        float* scores = tile.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, qb.rows(), cols, hs, scale, q, ld,
                    k + static_cast<std::size_t>(j0) * ld, ld, 0.0f, scores, cols);
        for (int r = 0; r < qb.rows(); ++r) {
          float* s = scores + static_cast<std::size_t>(r) * cols;
          const int t = qb.t0 + r;
          const VisibleKeys visible = visible_keys(t, shape.document_start(b, t), j0, cols);
          if (visible.count() <= 0) {
            std::fill(s, s + cols, 0.0f);
            continue;
          }
          std::fill(s, s + visible.first, 0.0f);
          std::fill(s + visible.end, s + cols, 0.0f);
          float* seen = s + visible.first;
          OnlineSoftmax& row = softmax[r];
          const float factor = online_softmax_rescale(row, visible_max(seen, visible.count()));
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int j = 0; j < visible.count(); ++j) {
            const float w = online_softmax_weight(row, seen[j]);
            seen[j] = w;
            sum += w;
          }
          row.sum += sum;
          if (bf16_products) round_row_to_bf16(seen, visible.count());
          if (factor != 1.0f) {
            float* orow = o + static_cast<std::size_t>(r) * out_ld;
#pragma omp simd
            for (int i = 0; i < hs; ++i) orow[i] *= factor;
          }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, qb.rows(), hs, cols, 1.0f, scores, cols,
                    v + static_cast<std::size_t>(j0) * ld, ld, 1.0f, o, out_ld);
      }
      for (int r = 0; r < qb.rows(); ++r) {
        const float inverse = 1.0f / softmax[r].sum;
        float* orow = o + static_cast<std::size_t>(r) * out_ld;
#pragma omp simd
        for (int i = 0; i < hs; ++i) orow[i] *= inverse;
        keep_row(kept_out, static_cast<std::size_t>(orow - out), hs);
        lse[shape.lse_offset(b, h, qb.t0 + r)] = online_softmax_lse(softmax[r]);
      }
    }
  }
}

DUFU_CPU_CLONES void attention_backward(TensorOut kept_dqkv, const float* dout, TensorIn qkv_in, const float* out,
                                        const float* lse, const std::int32_t* document_starts, int B, int T, int NH,
                                        int NKV, int hs) {
  float* dqkv = kept_dqkv.values;
  check_attention_heads(NH, NKV);
  use_single_threaded_blas();
  const FlashAttentionShape shape{T, NH, NKV, hs, document_starts};
  const bool bf16_products = qkv_in.bf16();
  std::vector<float> widened, rounded_dout;
  const float* qkv = qkv_floats(qkv_in, B, T, shape, widened);
  const float* dout_products = dout;
  if (bf16_products) {
    rounded_dout.resize(static_cast<std::size_t>(B) * static_cast<std::size_t>(T) * shape.out_stride());
#pragma omp parallel for
    for (std::size_t i = 0; i < rounded_dout.size(); ++i) rounded_dout[i] = ::dufu::trainer::round_to_bf16(dout[i]);
    dout_products = rounded_dout.data();
  }
  const float scale = shape.scale();
  const int ld = static_cast<int>(shape.qkv_stride());
  const int out_ld = static_cast<int>(shape.out_stride());
  const int blocks = (T + kQueryBlock - 1) / kQueryBlock;
  const auto zero_rows = [&](float* d) {
    for (int t = 0; t < T; ++t) std::fill(d + t * shape.qkv_stride(), d + t * shape.qkv_stride() + hs, 0.0f);
  };
  // A head's gradient rows once the task has summed all of them.
  const auto keep_rows = [&](const float* d) {
    const auto first = static_cast<std::size_t>(d - dqkv);
    for (int t = 0; t < T; ++t) keep_row(kept_dqkv, first + t * shape.qkv_stride(), hs);
  };
#pragma omp parallel
  {
    const std::size_t tile_size = static_cast<std::size_t>(kQueryBlock) * kKeyTile;
    std::vector<float> probs(tile_size), grads(tile_size);
    float row_dot[kQueryBlock];
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; ++b) {
      for (int g = 0; g < NKV; ++g) {
        const float* k = qkv + shape.k_offset(b, 0, g);
        const float* v = qkv + shape.v_offset(b, 0, g);
        float* dk = dqkv + shape.k_offset(b, 0, g);
        float* dv = dqkv + shape.v_offset(b, 0, g);
        zero_rows(dk);
        zero_rows(dv);
        // The group's query heads in order: dk and dv sum over them in this order.
        for (int h = g * shape.group_size(); h < (g + 1) * shape.group_size(); ++h) {
          const float* q = qkv + shape.q_offset(b, 0, h);
          float* dq = dqkv + shape.q_offset(b, 0, h);
          zero_rows(dq);
          for (int block = 0; block < blocks; ++block) {
            const QueryBlock qb{block * kQueryBlock, std::min(T, (block + 1) * kQueryBlock)};
            const float* qi = q + static_cast<std::size_t>(qb.t0) * ld;
            float* dqi = dq + static_cast<std::size_t>(qb.t0) * ld;
            const float* grad_out = dout + shape.out_offset(b, qb.t0, h);
            const float* grad_products = dout_products + shape.out_offset(b, qb.t0, h);
            for (int r = 0; r < qb.rows(); ++r) {
              const float* gr = grad_out + static_cast<std::size_t>(r) * out_ld;
              const float* orow = out + shape.out_offset(b, qb.t0 + r, h);
              float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
              for (int i = 0; i < hs; ++i) dot += gr[i] * orow[i];
              row_dot[r] = dot;
            }
            for (int j0 = shape.document_start(b, qb.t0); j0 < qb.t1; j0 += kKeyTile) {
              const int cols = std::min(qb.t1 - j0, kKeyTile);
              const float* kj = k + static_cast<std::size_t>(j0) * ld;
              const float* vj = v + static_cast<std::size_t>(j0) * ld;
              float* p = probs.data();
              float* dp = grads.data();
              // P from the recomputed scores and the saved lse; dP = dout V^T.
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, qb.rows(), cols, hs, scale, qi, ld, kj, ld, 0.0f, p,
                          cols);
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, qb.rows(), cols, hs, 1.0f, grad_products, out_ld, vj,
                          ld, 0.0f, dp, cols);
              for (int r = 0; r < qb.rows(); ++r) {
                float* pr = p + static_cast<std::size_t>(r) * cols;
                float* dr = dp + static_cast<std::size_t>(r) * cols;
                const int t = qb.t0 + r;
                const VisibleKeys visible = visible_keys(t, shape.document_start(b, t), j0, cols);
                if (visible.count() <= 0) {
                  std::fill(pr, pr + cols, 0.0f);
                  std::fill(dr, dr + cols, 0.0f);
                  continue;
                }
                const float row_lse = lse[shape.lse_offset(b, h, t)];
                const float dot = row_dot[r];
#pragma omp simd
                for (int j = visible.first; j < visible.end; ++j) {
                  pr[j] = flash_probability(pr[j], row_lse);
                  dr[j] = flash_score_grad(pr[j], dr[j], dot, scale);
                }
                if (bf16_products) {
                  round_row_to_bf16(pr + visible.first, visible.count());
                  round_row_to_bf16(dr + visible.first, visible.count());
                }
                std::fill(pr, pr + visible.first, 0.0f);
                std::fill(dr, dr + visible.first, 0.0f);
                std::fill(pr + visible.end, pr + cols, 0.0f);
                std::fill(dr + visible.end, dr + cols, 0.0f);
              }
              // dV_j += P^T dout; dQ_i += dS K_j; dK_j += dS^T Q_i.
              cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, qb.rows(), 1.0f, p, cols, grad_products,
                          out_ld, 1.0f, dv + static_cast<std::size_t>(j0) * ld, ld);
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, qb.rows(), hs, cols, 1.0f, dp, cols, kj, ld, 1.0f,
                          dqi, ld);
              cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, qb.rows(), 1.0f, dp, cols, qi, ld, 1.0f,
                          dk + static_cast<std::size_t>(j0) * ld, ld);
            }
          }
          keep_rows(dq);
        }
        keep_rows(dk);
        keep_rows(dv);
      }
    }
  }
}

}  // namespace dufu::trainer::cpu
