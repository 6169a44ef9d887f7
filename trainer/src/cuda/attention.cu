// CUDA causal self-attention, flash-style (the algorithm and the per-element math are
// in device/flash_attention.h, shared with the CPU kernel and tested there): no T x T
// matrix exists; the forward keeps each row's log-sum-exp, the backward recomputes
// the probabilities tile by tile.
//
// fp32 on the CUDA cores, register-tiled like a GEMM: a block of 256 threads owns 64
// query rows (or keys) and walks 64-key (or 64-query) tiles held in shared memory.
// Thread (ty, tx) of the 16 x 16 grid computes the scores of rows ty + 16 i and keys
// tx + 16 j (i, j < 4), so each shared-memory load feeds two multiply-adds (the
// first version gave each row to a quad of threads, one load per multiply-add, and
// ran GPT-2's attention at under 1 TFLOP/s on an H100). A row's 16 threads are 16
// adjacent lanes of one warp: its max and sum are four shuffles. The tile's
// probabilities (or score gradients) go through shared memory into the second product,
// whose outputs (dims tx + 16 k) share the rows' threads, so the online softmax's
// rescale stays in registers. No tensor-core MMA yet (the bf16 mma.sync version is
// the next step, see docs/architecture.md). Tiles above the causal diagonal are never
// visited.
//
// The backward is deterministic, without atomics: one kernel owns a query tile and
// sums its dq over the key tiles in order; another owns a key tile of one K/V head and
// sums its dk and dv over the query heads of the head's group (grouped-query
// attention), lowest first, and for each over the query tiles in order (both
// recompute the scores). bf16 qkv runs attention_bf16.cu's tensor-core kernels.
#include <cuda_runtime.h>

#include <cmath>

#include "attention_bf16.h"
#include "attention_launch.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "device/flash_attention.h"
#include "device/kernel_math.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr int kTile = kAttentionTile;  // query rows and keys per tile (attention_launch.cuh)
constexpr int kSide = 16;              // the thread grid is kSide x kSide
constexpr int kThreads = kSide * kSide;
constexpr int kPer = kTile / kSide;  // rows (and keys) per thread

// A tile of kTile rows of kDims floats, one float of padding per row so that the
// threads of a row group, which read one column of 16 different rows, hit 16 banks.
template <int kDims>
using Rows = float (*)[kDims + 1];
using Square = float (*)[kTile + 1];

template <int kDims>
constexpr int kRowsFloats = kTile * (kDims + 1);
constexpr int kSquareFloats = kTile * (kTile + 1);

// The sum (or max) over the 16 lanes of a row group (lanes 0-15 or 16-31 of a warp).
__device__ inline float row_sum(float value) {
#pragma unroll
  for (int offset = kSide / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ inline float row_max(float value) {
#pragma unroll
  for (int offset = kSide / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Copies rows [r0, r0 + kTile) of one head's slice (base: its row 0; rows row_stride
// apart: qkv_stride() in qkv, out_stride() in dout) into a tile, times factor; rows
// past T and columns past hs are zeros.
template <int kDims>
__device__ inline void load_rows(Rows<kDims> tile, const float* base, std::size_t row_stride, int r0, int T, int hs,
                                 float factor = 1.0f) {
  for (int e = threadIdx.x; e < kTile * kDims; e += kThreads) {
    const int r = e / kDims;
    const int d = e % kDims;
    tile[r][d] = r0 + r < T && d < hs ? base[static_cast<std::size_t>(r0 + r) * row_stride + d] * factor : 0.0f;
  }
}

// acc[i][j] += sum_d a[ty + 16 i][d] b[tx + 16 j][d]: the 4 x 4 register tile of a
// product of two row tiles.
template <int kDims>
__device__ inline void add_row_products(float (&acc)[kPer][kPer], Rows<kDims> a, Rows<kDims> b, int ty, int tx) {
#pragma unroll 8
  for (int d = 0; d < kDims; ++d) {
    float av[kPer], bv[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) av[i] = a[ty + kSide * i][d];
#pragma unroll
    for (int j = 0; j < kPer; ++j) bv[j] = b[tx + kSide * j][d];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc[i][j] += av[i] * bv[j];
    }
  }
}

// acc[i][k] += sum_c weights[ty + 16 i][c] values[c][tx + 16 k]: the second product,
// whose output dims share the thread's rows.
template <int kDims>
__device__ inline void add_weighted_rows(float (&acc)[kPer][kDims / kSide], Square weights, Rows<kDims> values,
                                         int ty, int tx) {
#pragma unroll 4
  for (int c = 0; c < kTile; ++c) {
    float w[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) w[i] = weights[ty + kSide * i][c];
#pragma unroll
    for (int k = 0; k < kDims / kSide; ++k) {
      const float v = values[c][tx + kSide * k];
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i][k] += w[i] * v;
    }
  }
}

// Writes rows [r0, r0 + kTile) of a register tile (rows ty + 16 i, dims tx + 16 k)
// below T and hs, times factor[i].
template <int kDims>
__device__ inline void store_rows(const TensorOut& kept, std::size_t base, std::size_t row_stride,
                                  const float (&acc)[kPer][kDims / kSide], int r0, int T, int hs, int ty, int tx,
                                  const float (&factor)[kPer]) {
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int r = r0 + ty + kSide * i;
    if (r >= T) continue;
#pragma unroll
    for (int k = 0; k < kDims / kSide; ++k) {
      const int d = tx + kSide * k;
      if (d < hs) keep_store(kept, base + static_cast<std::size_t>(r) * row_stride + d, acc[i][k] * factor[i]);
    }
  }
}

// D = dout · out of query row ty + 16 i of a tile (dout's tile in shared memory, out
// read from global), the same value in every thread of the row group.
template <int kDims>
__device__ inline void row_dots(float (&dots)[kPer], Rows<kDims> grads, const float* out_base,
                                std::size_t row_stride, int r0, int T, int hs, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int r = ty + kSide * i;
    float partial = 0.0f;
    if (r0 + r < T) {
#pragma unroll
      for (int k = 0; k < kDims / kSide; ++k) {
        const int d = tx + kSide * k;
        if (d < hs) partial += grads[r][d] * out_base[static_cast<std::size_t>(r0 + r) * row_stride + d];
      }
    }
    dots[i] = row_sum(partial);
  }
}

// Grid: (query tiles, B NH); the tiles with the most keys start first.
template <int kDims>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(TensorOut out, float* lse, const float* qkv,
                                                                 FlashAttentionShape shape) {
  extern __shared__ float shared[];
  const Rows<kDims> queries = reinterpret_cast<Rows<kDims>>(shared);
  const Rows<kDims> keys = reinterpret_cast<Rows<kDims>>(shared + kRowsFloats<kDims>);
  const Rows<kDims> values = reinterpret_cast<Rows<kDims>>(shared + 2 * kRowsFloats<kDims>);
  const Square weights = reinterpret_cast<Square>(shared + 3 * kRowsFloats<kDims>);
  const int T = shape.T, hs = shape.hs;
  const int b = blockIdx.y / shape.NH;
  const int h = blockIdx.y % shape.NH;
  const int t0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  // The scale goes into q once, so a dot product is the scaled score.
  load_rows<kDims>(queries, qkv + shape.q_offset(b, 0, h), shape.qkv_stride(), t0, T, hs, shape.scale());
  float o[kPer][kDims / kSide] = {};
  OnlineSoftmax softmax[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) softmax[i] = online_softmax_start();
  const float* k_base = qkv + shape.k_offset(b, 0, shape.kv_head(h));
  const float* v_base = qkv + shape.v_offset(b, 0, shape.kv_head(h));
  const int keys_seen = min(T, t0 + kTile);  // by the tile's last row
  for (int j0 = shape.first_key_tile(b, t0, kTile); j0 < keys_seen; j0 += kTile) {
    __syncthreads();
    load_rows<kDims>(keys, k_base, shape.qkv_stride(), j0, T, hs);
    load_rows<kDims>(values, v_base, shape.qkv_stride(), j0, T, hs);
    __syncthreads();
    float scores[kPer][kPer] = {};
    add_row_products<kDims>(scores, queries, keys, ty, tx);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      // Without document masking every row of the tile sees key j0 (the tiles are
      // aligned, j0 <= t0 <= t), so the tile's max is finite; with it a row may see
      // none of the tile (max -inf), which leaves its running softmax as it was.
      const int t = t0 + ty + kSide * i;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int key = j0 + tx + kSide * j;
        if (key < T && shape.sees(b, t, key)) tile_max = fmaxf(tile_max, scores[i][j]);
      }
      const float factor = online_softmax_rescale(softmax[i], row_max(tile_max));
#pragma unroll
      for (int k = 0; k < kDims / kSide; ++k) o[i][k] *= factor;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int key = j0 + tx + kSide * j;
        const float w = key < T && shape.sees(b, t, key) ? online_softmax_weight(softmax[i], scores[i][j]) : 0.0f;
        weights[ty + kSide * i][tx + kSide * j] = w;
        sum += w;
      }
      softmax[i].sum += row_sum(sum);
    }
    __syncthreads();
    add_weighted_rows<kDims>(o, weights, values, ty, tx);
  }
  float inverse[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    inverse[i] = 1.0f / softmax[i].sum;
    const int t = t0 + ty + kSide * i;
    if (tx == 0 && t < T) lse[shape.lse_offset(b, h, t)] = online_softmax_lse(softmax[i]);
  }
  store_rows<kDims>(out, shape.out_offset(b, 0, h), shape.out_stride(), o, t0, T, hs, ty, tx, inverse);
}

// dq of one query tile, summed over the key tiles left of its diagonal in order.
template <int kDims>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(TensorOut dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             FlashAttentionShape shape) {
  extern __shared__ float shared[];
  const Rows<kDims> queries = reinterpret_cast<Rows<kDims>>(shared);
  const Rows<kDims> grads = reinterpret_cast<Rows<kDims>>(shared + kRowsFloats<kDims>);
  const Rows<kDims> keys = reinterpret_cast<Rows<kDims>>(shared + 2 * kRowsFloats<kDims>);
  const Rows<kDims> values = reinterpret_cast<Rows<kDims>>(shared + 3 * kRowsFloats<kDims>);
  const Square score_grads = reinterpret_cast<Square>(shared + 4 * kRowsFloats<kDims>);
  const int T = shape.T, hs = shape.hs;
  const float scale = shape.scale();
  const int b = blockIdx.y / shape.NH;
  const int h = blockIdx.y % shape.NH;
  const int t0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  load_rows<kDims>(queries, qkv + shape.q_offset(b, 0, h), shape.qkv_stride(), t0, T, hs, scale);
  load_rows<kDims>(grads, dout + shape.out_offset(b, 0, h), shape.out_stride(), t0, T, hs);
  __syncthreads();
  float dots[kPer], row_lse[kPer];
  row_dots<kDims>(dots, grads, out + shape.out_offset(b, 0, h), shape.out_stride(), t0, T, hs, ty, tx);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int t = t0 + ty + kSide * i;
    row_lse[i] = t < T ? lse[shape.lse_offset(b, h, t)] : 0.0f;
  }
  float dq[kPer][kDims / kSide] = {};
  const float* k_base = qkv + shape.k_offset(b, 0, shape.kv_head(h));
  const float* v_base = qkv + shape.v_offset(b, 0, shape.kv_head(h));
  const int keys_seen = min(T, t0 + kTile);
  for (int j0 = shape.first_key_tile(b, t0, kTile); j0 < keys_seen; j0 += kTile) {
    __syncthreads();
    load_rows<kDims>(keys, k_base, shape.qkv_stride(), j0, T, hs);
    load_rows<kDims>(values, v_base, shape.qkv_stride(), j0, T, hs);
    __syncthreads();
    float scores[kPer][kPer] = {}, dprobs[kPer][kPer] = {};
    add_row_products<kDims>(scores, queries, keys, ty, tx);
    add_row_products<kDims>(dprobs, grads, values, ty, tx);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int t = t0 + ty + kSide * i;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int key = j0 + tx + kSide * j;
        const bool visible = t < T && shape.sees(b, t, key);
        score_grads[ty + kSide * i][tx + kSide * j] =
            visible ? flash_score_grad(flash_probability(scores[i][j], row_lse[i]), dprobs[i][j], dots[i], scale)
                    : 0.0f;
      }
    }
    __syncthreads();
    add_weighted_rows<kDims>(dq, score_grads, keys, ty, tx);
  }
  const float ones[kPer] = {1.0f, 1.0f, 1.0f, 1.0f};
  store_rows<kDims>(dqkv, shape.q_offset(b, 0, h), shape.qkv_stride(), dq, t0, T, hs, ty, tx, ones);
}

// dk and dv of one key tile of K/V head g, summed over the query heads of g's group
// in order and, for each, over the query tiles from the tile's diagonal on in order.
// Thread (ty, tx) holds keys ty + 16 i against query rows tx + 16 j of a query tile;
// each query row's D = dout · out and lse go through shared memory. Grid: (key tiles,
// B NKV); the first key tiles see the most queries and start first.
template <int kDims>
__global__ void __launch_bounds__(kThreads) flash_backward_dkv_kernel(TensorOut dqkv, const float* dout,
                                                                      const float* qkv, const float* out,
                                                                      const float* lse, FlashAttentionShape shape) {
  extern __shared__ float shared[];
  const Rows<kDims> keys = reinterpret_cast<Rows<kDims>>(shared);
  const Rows<kDims> values = reinterpret_cast<Rows<kDims>>(shared + kRowsFloats<kDims>);
  const Rows<kDims> queries = reinterpret_cast<Rows<kDims>>(shared + 2 * kRowsFloats<kDims>);
  const Rows<kDims> grads = reinterpret_cast<Rows<kDims>>(shared + 3 * kRowsFloats<kDims>);
  const Square probs = reinterpret_cast<Square>(shared + 4 * kRowsFloats<kDims>);
  const Square score_grads = reinterpret_cast<Square>(shared + 4 * kRowsFloats<kDims> + kSquareFloats);
  float* const row_dot = shared + 4 * kRowsFloats<kDims> + 2 * kSquareFloats;
  float* const row_lse = row_dot + kTile;
  int* const row_start = reinterpret_cast<int*>(row_lse + kTile);  // each query row's document start
  const int T = shape.T, hs = shape.hs;
  const float scale = shape.scale();
  const int b = blockIdx.y / shape.NKV;
  const int g = blockIdx.y % shape.NKV;
  const int j0 = blockIdx.x * kTile;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  load_rows<kDims>(keys, qkv + shape.k_offset(b, 0, g), shape.qkv_stride(), j0, T, hs, scale);
  load_rows<kDims>(values, qkv + shape.v_offset(b, 0, g), shape.qkv_stride(), j0, T, hs);
  float dk[kPer][kDims / kSide] = {}, dv[kPer][kDims / kSide] = {};
  for (int h = g * shape.group_size(); h < (g + 1) * shape.group_size(); ++h) {
    const float* q_base = qkv + shape.q_offset(b, 0, h);
    const float* dout_base = dout + shape.out_offset(b, 0, h);
    for (int t0 = j0; t0 < T; t0 += kTile) {
      // A query tile whose first row starts its document after the key tile's last
      // key sees none of it, nor do the tiles after it (the block leaves together).
      if (shape.document_start(b, t0) >= j0 + kTile) break;
      __syncthreads();
      load_rows<kDims>(queries, q_base, shape.qkv_stride(), t0, T, hs);
      load_rows<kDims>(grads, dout_base, shape.out_stride(), t0, T, hs);
      __syncthreads();
      {
        float dots[kPer];
        row_dots<kDims>(dots, grads, out + shape.out_offset(b, 0, h), shape.out_stride(), t0, T, hs, ty, tx);
        if (tx == 0) {
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
            const int r = ty + kSide * i;
            row_dot[r] = dots[i];
            row_lse[r] = t0 + r < T ? lse[shape.lse_offset(b, h, t0 + r)] : 0.0f;
            row_start[r] = shape.document_start(b, t0 + r);
          }
        }
      }
      __syncthreads();
      float scores[kPer][kPer] = {}, dprobs[kPer][kPer] = {};
      add_row_products<kDims>(scores, keys, queries, ty, tx);
      add_row_products<kDims>(dprobs, values, grads, ty, tx);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int key = j0 + ty + kSide * i;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          const int r = tx + kSide * j;
          const bool visible = key < T && t0 + r < T && key <= t0 + r && key >= row_start[r];
          const float p = visible ? flash_probability(scores[i][j], row_lse[r]) : 0.0f;
          probs[ty + kSide * i][r] = p;
          score_grads[ty + kSide * i][r] = visible ? flash_score_grad(p, dprobs[i][j], row_dot[r], scale) : 0.0f;
        }
      }
      __syncthreads();
      add_weighted_rows<kDims>(dv, probs, grads, ty, tx);
      add_weighted_rows<kDims>(dk, score_grads, queries, ty, tx);
    }
  }
  const float ones[kPer] = {1.0f, 1.0f, 1.0f, 1.0f};
  store_rows<kDims>(dqkv, shape.k_offset(b, 0, g), shape.qkv_stride(), dk, j0, T, hs, ty, tx, ones);
  store_rows<kDims>(dqkv, shape.v_offset(b, 0, g), shape.qkv_stride(), dv, j0, T, hs, ty, tx, ones);
}

// Bytes of `floats` of dynamic shared memory.
constexpr int float_bytes(int floats) { return floats * static_cast<int>(sizeof(float)); }

template <int kDims>
void launch_forward(TensorOut out, float* lse, const float* qkv, int B, const FlashAttentionShape& shape) {
  launch_tiles<kThreads>("the fp32 attention forward", kDims, flash_forward_kernel<kDims>,
                         dim3(tiles_of(shape.T), B * shape.NH), float_bytes(3 * kRowsFloats<kDims> + kSquareFloats),
                         out, lse, qkv, shape);
}

template <int kDims>
void launch_backward(TensorOut dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                     const FlashAttentionShape& shape) {
  launch_tiles<kThreads>("the fp32 attention backward (dq)", kDims, flash_backward_dq_kernel<kDims>,
                         dim3(tiles_of(shape.T), B * shape.NH), float_bytes(4 * kRowsFloats<kDims> + kSquareFloats),
                         dqkv, dout, qkv, out, lse, shape);
  launch_tiles<kThreads>("the fp32 attention backward (dk, dv)", kDims, flash_backward_dkv_kernel<kDims>,
                         dim3(tiles_of(shape.T), B * shape.NKV),
                         float_bytes(4 * kRowsFloats<kDims> + 2 * kSquareFloats + 3 * kTile), dqkv, dout, qkv, out,
                         lse, shape);
}

}  // namespace
void attention_forward(TensorOut out, float* lse, TensorIn qkv, const std::int32_t* document_starts, int B, int T,
                       int NH, int NKV, int hs) {
  check_attention_heads(NH, NKV);
  if (B * T == 0) return;
  const FlashAttentionShape shape{T, NH, NKV, hs, document_starts};
  if (qkv.bf16()) {
    bf16_attention_forward(out, lse, static_cast<const std::uint16_t*>(qkv.data), B, shape);
    return;
  }
  const auto* floats = static_cast<const float*>(qkv.data);
  with_head_size(hs, [&]<int kDims>() { launch_forward<kDims>(out, lse, floats, B, shape); });
}

void attention_backward(TensorOut dqkv, const float* dout, TensorIn qkv, const float* out, const float* lse,
                        const std::int32_t* document_starts, int B, int T, int NH, int NKV, int hs) {
  check_attention_heads(NH, NKV);
  if (B * T == 0) return;
  const FlashAttentionShape shape{T, NH, NKV, hs, document_starts};
  if (qkv.bf16()) {
    bf16_attention_backward(dqkv, dout, static_cast<const std::uint16_t*>(qkv.data), out, lse, B, shape);
    return;
  }
  const auto* floats = static_cast<const float*>(qkv.data);
  with_head_size(hs, [&]<int kDims>() { launch_backward<kDims>(dqkv, dout, floats, out, lse, B, shape); });
}

}  // namespace dufu::trainer::cuda
