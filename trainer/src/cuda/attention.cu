// CUDA causal self-attention, flash-style (the algorithm and the per-element math are
// in device/flash_attention.h, shared with the CPU kernel and tested there): no T x T
// matrix exists; the forward keeps each row's log-sum-exp, the backward recomputes
// the probabilities tile by tile.
//
// fp32 on the CUDA cores: K and V (or Q and dout) tiles go through shared memory,
// and each query (or key) row is owned by a quad of 4 threads, each holding every
// fourth element of the row in registers, so a dot product is 4 partial sums and two
// quad shuffles. No tensor-core MMA yet (the bf16 mma.sync version is the next step,
// see docs/architecture.md). Blocks whose rows see no key of a tile skip it: the
// masked upper half of the causal square is never computed.
//
// The backward is deterministic, without atomics: one kernel owns a query tile and
// sums its dq over the key tiles in order; another owns a key tile of one K/V head and
// sums its dk and dv over the query heads of the head's group (grouped-query
// attention), lowest first, and for each over the query tiles in order (both
// recompute the scores).
#include <cuda_runtime.h>

#include <cmath>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/device/flash_attention.h"
#include "dufu/trainer/device/kernel_math.h"

namespace dufu::trainer::cuda {

namespace {

constexpr int kThreadsPerRow = 4;  // a quad: its lanes are adjacent, one shuffle group
constexpr int kTileRows = 32;      // query rows (or keys) a block owns
constexpr int kKeyTile = 32;       // keys (or query rows) per shared-memory tile
constexpr int kThreads = kTileRows * kThreadsPerRow;
constexpr int kMaxHeadSize = 128;

// The sum over the quad of each lane's partial dot product.
__device__ inline float quad_sum(float partial) {
  partial += __shfl_xor_sync(0xffffffffu, partial, 1);
  return partial + __shfl_xor_sync(0xffffffffu, partial, 2);
}

// Element i of a thread's share of a row is element lane + 4 i of the row.
template <int kDims>
__device__ inline void load_row_share(float (&share)[kDims], const float* row, int lane, int hs, bool active,
                                      float factor = 1.0f) {
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + kThreadsPerRow * i;
    share[i] = active && d < hs ? row[d] * factor : 0.0f;
  }
}

template <int kDims>
__device__ inline void store_row_share(float* row, const float (&share)[kDims], int lane, int hs, float factor = 1.0f) {
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + kThreadsPerRow * i;
    if (d < hs) row[d] = share[i] * factor;
  }
}

template <int kDims>
__device__ inline float share_dot(const float (&share)[kDims], const float* tile_row, int lane) {
  float partial = 0.0f;
#pragma unroll
  for (int i = 0; i < kDims; ++i) partial += share[i] * tile_row[lane + kThreadsPerRow * i];
  return quad_sum(partial);
}

template <int kDims>
__device__ inline void add_scaled(float (&share)[kDims], float weight, const float* tile_row, int lane) {
#pragma unroll
  for (int i = 0; i < kDims; ++i) share[i] += weight * tile_row[lane + kThreadsPerRow * i];
}

// Copies rows [r0, r0 + kKeyTile) of one head's slice (base: its row 0; rows
// row_stride apart, qkv_stride() in qkv, out_stride() in dout) into a tile; rows past
// T and columns past hs are zeros.
template <int kWidth>
__device__ inline void load_tile(float (*tile)[kWidth], const float* base, std::size_t row_stride, int r0, int T,
                                 int hs) {
  for (int e = threadIdx.x; e < kKeyTile * kWidth; e += kThreads) {
    const int r = e / kWidth;
    const int d = e % kWidth;
    tile[r][d] = r0 + r < T && d < hs ? base[static_cast<std::size_t>(r0 + r) * row_stride + d] : 0.0f;
  }
}

// Grid: (query tiles, B NH); the tiles with the most keys start first. The launch
// bounds (4 blocks per SM: at most 128 registers; 3 for hs <= 128: 168) are there
// because ptxas spilled without them (sm_90, hs <= 32: it chose 96 registers) and
// with 128 for hs <= 128 (sm_80).
template <int kDims>
__global__ void __launch_bounds__(kThreads, kDims >= 32 ? 3 : 4)
    flash_forward_kernel(float* out, float* lse, const float* qkv, FlashAttentionShape shape) {
  constexpr int kWidth = kThreadsPerRow * kDims;
  __shared__ float keys[kKeyTile][kWidth];
  __shared__ float values[kKeyTile][kWidth];
  const int hs = shape.hs;
  const int b = blockIdx.y / shape.NH;
  const int h = blockIdx.y % shape.NH;
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int lane = threadIdx.x % kThreadsPerRow;
  const int t = tile * kTileRows + threadIdx.x / kThreadsPerRow;
  const bool active = t < shape.T;
  float q[kDims], o[kDims];
  // The scale goes into q once, so a dot product is the scaled score.
  load_row_share(q, qkv + shape.q_offset(b, active ? t : 0, h), lane, hs, active, shape.scale());
#pragma unroll
  for (int i = 0; i < kDims; ++i) o[i] = 0.0f;
  OnlineSoftmax softmax = online_softmax_start();
  const float* k_base = qkv + shape.k_offset(b, 0, shape.kv_head(h));
  const float* v_base = qkv + shape.v_offset(b, 0, shape.kv_head(h));
  const int keys_seen = min(shape.T, (tile + 1) * kTileRows);  // by the block's last row
  for (int j0 = 0; j0 < keys_seen; j0 += kKeyTile) {
    __syncthreads();
    load_tile<kWidth>(keys, k_base, shape.qkv_stride(), j0, shape.T, hs);
    load_tile<kWidth>(values, v_base, shape.qkv_stride(), j0, shape.T, hs);
    __syncthreads();
    float scores[kKeyTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kKeyTile; ++c) {
      scores[c] = share_dot(q, keys[c], lane);
      if (j0 + c <= t) tile_max = fmaxf(tile_max, scores[c]);
    }
    if (tile_max == -INFINITY) continue;  // the row sees no key of this tile
    const float factor = online_softmax_rescale(softmax, tile_max);
#pragma unroll
    for (int i = 0; i < kDims; ++i) o[i] *= factor;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kKeyTile; ++c) {
      const float w = j0 + c <= t ? online_softmax_weight(softmax, scores[c]) : 0.0f;
      sum += w;
      add_scaled(o, w, values[c], lane);
    }
    softmax.sum += sum;
  }
  if (!active) return;
  store_row_share(out + shape.out_offset(b, t, h), o, lane, hs, 1.0f / softmax.sum);
  if (lane == 0) lse[shape.lse_offset(b, h, t)] = online_softmax_lse(softmax);
}

// dq of one query tile, summed over the key tiles left of its diagonal in order.
template <int kDims>
__global__ void __launch_bounds__(kThreads) flash_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv,
                                                                     const float* out, const float* lse,
                                                                     FlashAttentionShape shape) {
  constexpr int kWidth = kThreadsPerRow * kDims;
  __shared__ float keys[kKeyTile][kWidth];
  __shared__ float values[kKeyTile][kWidth];
  const int hs = shape.hs;
  const float scale = shape.scale();
  const int b = blockIdx.y / shape.NH;
  const int h = blockIdx.y % shape.NH;
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int lane = threadIdx.x % kThreadsPerRow;
  const int t = tile * kTileRows + threadIdx.x / kThreadsPerRow;
  const bool active = t < shape.T;
  const int row = active ? t : 0;
  float q[kDims], g[kDims], dq[kDims];
  load_row_share(q, qkv + shape.q_offset(b, row, h), lane, hs, active, scale);
  load_row_share(g, dout + shape.out_offset(b, row, h), lane, hs, active);
  // D = dout · out of the row, through dq's registers for the moment.
  load_row_share(dq, out + shape.out_offset(b, row, h), lane, hs, active);
  float partial = 0.0f;
#pragma unroll
  for (int i = 0; i < kDims; ++i) partial += g[i] * dq[i];
  const float row_dot = quad_sum(partial);
  const float row_lse = active ? lse[shape.lse_offset(b, h, t)] : 0.0f;
#pragma unroll
  for (int i = 0; i < kDims; ++i) dq[i] = 0.0f;
  const float* k_base = qkv + shape.k_offset(b, 0, shape.kv_head(h));
  const float* v_base = qkv + shape.v_offset(b, 0, shape.kv_head(h));
  const int keys_seen = min(shape.T, (tile + 1) * kTileRows);
  for (int j0 = 0; j0 < keys_seen; j0 += kKeyTile) {
    __syncthreads();
    load_tile<kWidth>(keys, k_base, shape.qkv_stride(), j0, shape.T, hs);
    load_tile<kWidth>(values, v_base, shape.qkv_stride(), j0, shape.T, hs);
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < kKeyTile; ++c) {
      const float score = share_dot(q, keys[c], lane);
      const float dp = share_dot(g, values[c], lane);
      const bool visible = active && j0 + c <= t;
      const float ds = visible ? flash_score_grad(flash_probability(score, row_lse), dp, row_dot, scale) : 0.0f;
      add_scaled(dq, ds, keys[c], lane);
    }
  }
  if (active) store_row_share(dqkv + shape.q_offset(b, t, h), dq, lane, hs);
}

// dk and dv of one key tile of K/V head g, summed over the query heads of g's group
// in order and, for each, over the query tiles right of the tile's diagonal in order.
// Each query tile's D = dout · out and lse go through shared memory. Grid: (key
// tiles, B NKV).
template <int kDims>
__global__ void __launch_bounds__(kThreads) flash_backward_dkv_kernel(float* dqkv, const float* dout,
                                                                      const float* qkv, const float* out,
                                                                      const float* lse, FlashAttentionShape shape) {
  constexpr int kWidth = kThreadsPerRow * kDims;
  __shared__ float queries[kKeyTile][kWidth];
  __shared__ float grads[kKeyTile][kWidth];
  __shared__ float row_dot[kKeyTile];
  __shared__ float row_lse[kKeyTile];
  const int hs = shape.hs;
  const float scale = shape.scale();
  const int b = blockIdx.y / shape.NKV;
  const int g = blockIdx.y % shape.NKV;
  // The first key tiles see the most queries: they start first.
  const int tile = blockIdx.x;
  const int lane = threadIdx.x % kThreadsPerRow;
  const int quad = threadIdx.x / kThreadsPerRow;
  const int j = tile * kTileRows + quad;
  const bool active = j < shape.T;
  float k[kDims], v[kDims], dk[kDims], dv[kDims];
  load_row_share(k, qkv + shape.k_offset(b, active ? j : 0, g), lane, hs, active, scale);
  load_row_share(v, qkv + shape.v_offset(b, active ? j : 0, g), lane, hs, active);
#pragma unroll
  for (int i = 0; i < kDims; ++i) dk[i] = dv[i] = 0.0f;
  for (int h = g * shape.group_size(); h < (g + 1) * shape.group_size(); ++h) {
    const float* q_base = qkv + shape.q_offset(b, 0, h);
    const float* dout_base = dout + shape.out_offset(b, 0, h);
    for (int t0 = tile * kTileRows; t0 < shape.T; t0 += kKeyTile) {
      __syncthreads();
      load_tile<kWidth>(queries, q_base, shape.qkv_stride(), t0, shape.T, hs);
      load_tile<kWidth>(grads, dout_base, shape.out_stride(), t0, shape.T, hs);
      __syncthreads();
      {
        // Quad r computes D and fetches lse of query row t0 + r.
        const int t = t0 + quad;
        float o[kDims];
        load_row_share(o, out + shape.out_offset(b, t < shape.T ? t : 0, h), lane, hs, t < shape.T);
        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < kDims; ++i) partial += o[i] * grads[quad][lane + kThreadsPerRow * i];
        const float dot = quad_sum(partial);
        if (lane == 0) {
          row_dot[quad] = dot;
          row_lse[quad] = t < shape.T ? lse[shape.lse_offset(b, h, t)] : 0.0f;
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int r = 0; r < kKeyTile; ++r) {
        const float score = share_dot(k, queries[r], lane);
        const float dp = share_dot(v, grads[r], lane);
        const bool visible = active && j <= t0 + r && t0 + r < shape.T;
        const float p = visible ? flash_probability(score, row_lse[r]) : 0.0f;
        const float ds = visible ? flash_score_grad(p, dp, row_dot[r], scale) : 0.0f;
        add_scaled(dv, p, grads[r], lane);
        add_scaled(dk, ds, queries[r], lane);
      }
    }
  }
  if (!active) return;
  store_row_share(dqkv + shape.k_offset(b, j, g), dk, lane, hs);
  store_row_share(dqkv + shape.v_offset(b, j, g), dv, lane, hs);
}

template <int kDims>
void launch_forward(float* out, float* lse, const float* qkv, int B, const FlashAttentionShape& shape) {
  const dim3 grid((shape.T + kTileRows - 1) / kTileRows, B * shape.NH);
  flash_forward_kernel<kDims><<<grid, kThreads, 0, stream()>>>(out, lse, qkv, shape);
  DUFU_CUDA_CHECK_LAUNCH();
}

template <int kDims>
void launch_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                     const FlashAttentionShape& shape) {
  const int tiles = (shape.T + kTileRows - 1) / kTileRows;
  flash_backward_dq_kernel<kDims><<<dim3(tiles, B * shape.NH), kThreads, 0, stream()>>>(dqkv, dout, qkv, out, lse,
                                                                                        shape);
  DUFU_CUDA_CHECK_LAUNCH();
  flash_backward_dkv_kernel<kDims><<<dim3(tiles, B * shape.NKV), kThreads, 0, stream()>>>(dqkv, dout, qkv, out, lse,
                                                                                         shape);
  DUFU_CUDA_CHECK_LAUNCH();
}

// The register share per thread: head sizes up to 32, 64 and 128.
template <typename Launch>
void with_head_size(int hs, Launch launch) {
  DUFU_CHECK(hs <= kMaxHeadSize, "CUDA attention supports head sizes up to ", kMaxHeadSize, ", not ", hs);
  if (hs <= 32) {
    launch.template operator()<8>();
  } else if (hs <= 64) {
    launch.template operator()<16>();
  } else {
    launch.template operator()<32>();
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV, int hs) {
  check_attention_heads(NH, NKV);
  if (B * T == 0) return;
  const FlashAttentionShape shape{T, NH, NKV, hs};
  with_head_size(hs, [&]<int kDims>() { launch_forward<kDims>(out, lse, qkv, B, shape); });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int NH, int NKV, int hs) {
  check_attention_heads(NH, NKV);
  if (B * T == 0) return;
  const FlashAttentionShape shape{T, NH, NKV, hs};
  with_head_size(hs, [&]<int kDims>() { launch_backward<kDims>(dqkv, dout, qkv, out, lse, B, shape); });
}

}  // namespace dufu::trainer::cuda
