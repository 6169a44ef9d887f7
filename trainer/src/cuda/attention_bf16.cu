// CUDA causal self-attention with bf16 products (bf16 qkv, kernel_table.h): the
// flash-style algorithm of attention.cu (device/flash_attention.h's recurrence, the
// masked half skipped, only the row log-sum-exp kept, a deterministic two-kernel
// backward) with every tile product on the tensor cores: mma.sync.m16n8k16, bf16
// operands, fp32 accumulation (sm_80 and later).
//
// A block of 4 warps owns 64 query rows (forward, dq) or 64 keys (dk, dv); each warp
// owns 16 of them, the M side of its products, and walks 64-row tiles of the other
// side in shared memory (bf16, rows padded by 8 elements so that a fragment's 8 rows
// land 4 banks apart). The fragments follow the PTX ISA's layout for m16n8k16:
// lane = 4 group + quad; A holds rows group and group + 8, columns 2 quad (+1) and
// 2 quad + 8 (+1); B holds column group, rows 2 quad (+1) and 2 quad + 8 (+1); the
// accumulator rows group and group + 8, columns 2 quad (+1). A score tile's
// accumulators are thus, pair for pair, the A fragment of the next product (FlashAttention-2's
// register reuse); a B operand whose reduction runs over the tile's rows (V in P V,
// K in dS K, dout and Q in the dk/dv products) is kept transposed as well.
//
// The recipe, the same as the CPU device's: scores, probabilities and their sums in
// fp32; P (and dS) rounded to bf16 to enter a product; dout rounded to bf16 on load;
// D = dout · out from the fp32 values.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention_bf16.h"
#include "attention_launch.cuh"
#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "device/bf16.h"
#include "device/flash_attention.h"
#include "device/kernel_math.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

using Bits = std::uint16_t;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 16 * kWarps;  // rows a block owns; rows of every shared tile
static_assert(kTile == kAttentionTile, "a warp owns 16 rows of the tile attention_launch.cuh cuts");
constexpr int kPad = 8;
constexpr int kColumnStride = kTile + kPad;  // of a transposed tile [dims][kTile]
template <int kDims>
constexpr int kRowStride = kDims + kPad;  // of a row tile [kTile][dims]
template <int kDims>
constexpr int kRowTile = kTile * kRowStride<kDims>;
template <int kDims>
constexpr int kColumnTile = kDims * kColumnStride;

__device__ inline std::uint32_t pair_at(const Bits* p) { return *reinterpret_cast<const std::uint32_t*>(p); }

// Two fp32 values as a bf16 pair, the lower column in the low half, rounded as
// round_to_bf16 rounds on the CPU.
__device__ inline std::uint32_t bf16_pair(float low, float high) {
  return float_to_bf16_bits(low) | static_cast<std::uint32_t>(float_to_bf16_bits(high)) << 16;
}

// d += a b for one 16 x 8 x 16 tile.
__device__ inline void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment of rows [0, 16) of `rows` (stride elements apart), columns [k0, k0 + 16).
__device__ inline void load_a(std::uint32_t (&a)[4], const Bits* rows, int stride, int k0, int group, int quad) {
  const Bits* upper = rows + group * stride + k0 + 2 * quad;
  const Bits* lower = upper + 8 * stride;
  a[0] = pair_at(upper);
  a[1] = pair_at(lower);
  a[2] = pair_at(upper + 8);
  a[3] = pair_at(lower + 8);
}

// The A fragment of 16 columns of a 16 x 64 accumulator tile (n-tiles 2 kk and
// 2 kk + 1), rounded to bf16.
__device__ inline void accumulators_as_a(std::uint32_t (&a)[4], const float (&acc)[8][4], int kk) {
  a[0] = bf16_pair(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = bf16_pair(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = bf16_pair(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = bf16_pair(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// acc[nt] += rows (16 x kDims, the warp's) times other^T, other a row tile of kTile
// rows: a 16 x kTile tile of dot products.
template <int kDims>
__device__ inline void add_row_dots(float (&acc)[8][4], const Bits* rows, const Bits* other, int group, int quad) {
#pragma unroll
  for (int ks = 0; ks < kDims / 16; ++ks) {
    std::uint32_t a[4];
    load_a(a, rows, kRowStride<kDims>, ks * 16, group, quad);
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
      const Bits* b = other + (nt * 8 + group) * kRowStride<kDims> + ks * 16 + 2 * quad;
      mma(acc[nt], a, pair_at(b), pair_at(b + 8));
    }
  }
}

// out[dt] += weights (16 x kTile accumulators, rounded to bf16) times a tile whose
// transpose `columns` ([kDims][kTile]) holds: a 16 x kDims tile.
template <int kDims>
__device__ inline void add_weighted(float (&out)[kDims / 8][4], const float (&weights)[8][4], const Bits* columns,
                                    int group, int quad) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    std::uint32_t a[4];
    accumulators_as_a(a, weights, kk);
#pragma unroll
    for (int dt = 0; dt < kDims / 8; ++dt) {
      const Bits* b = columns + (dt * 8 + group) * kColumnStride + kk * 16 + 2 * quad;
      mma(out[dt], a, pair_at(b), pair_at(b + 8));
    }
  }
}

// Element e of an accumulator is in row group (e < 2) or group + 8, column 2 quad + (e & 1).
__device__ inline int row_of(int e, int group) { return group + (e < 2 ? 0 : 8); }
__device__ inline int column_of(int nt, int e, int quad) { return nt * 8 + 2 * quad + (e & 1); }

// The sum (max) over the quad's 4 lanes, which hold one row's columns.
__device__ inline float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}
__device__ inline float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

// Rows [r0, r0 + kTile) of one head's slice (rows row_stride apart) into a row tile
// and, where `columns` is given, its transpose; rows past T and columns past hs are
// zeros. fp32 sources are rounded to bf16.
template <int kDims, typename Source>
__device__ inline void load_tile(Bits* rows, Bits* columns, const Source* base, std::size_t row_stride, int r0, int T,
                                 int hs) {
  for (int e = threadIdx.x; e < kTile * kDims; e += kThreads) {
    const int r = e / kDims;
    const int d = e % kDims;
    Bits value = 0;
    if (r0 + r < T && d < hs) {
      const Source source = base[static_cast<std::size_t>(r0 + r) * row_stride + d];
      if constexpr (sizeof(Source) == sizeof(float)) {
        value = float_to_bf16_bits(source);
      } else {
        value = source;
      }
    }
    if (rows != nullptr) rows[r * kRowStride<kDims> + d] = value;
    if (columns != nullptr) columns[d * kColumnStride + r] = value;
  }
}

// Writes a 16 x kDims accumulator tile to rows r0 + group (+ 8) below T, columns below
// hs: store(row offset, column, value) for each, row offset = row * row_stride.
template <int kDims, typename Store>
__device__ inline void store_tile(std::size_t row_stride, const float (&acc)[kDims / 8][4], int r0, int T, int hs,
                                  int group, int quad, const float (&factor)[2], Store store) {
#pragma unroll
  for (int dt = 0; dt < kDims / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + row_of(e, group);
      const int d = column_of(dt, e, quad);
      if (r < T && d < hs) store(static_cast<std::size_t>(r) * row_stride + d, acc[dt][e] * factor[e / 2]);
    }
  }
}

// A gradient tile as it is summed (the entry keeps the whole gradient afterwards: the
// dkv kernel at hs = 128 has no register left for the rounding).
template <int kDims>
__device__ inline void store_gradient_tile(float* base, std::size_t row_stride, const float (&acc)[kDims / 8][4],
                                           int r0, int T, int hs, int group, int quad) {
  const float ones[2] = {1.0f, 1.0f};
  store_tile<kDims>(row_stride, acc, r0, T, hs, group, quad, ones,
                    [base](std::size_t at, float value) { base[at] = value; });
}

// D = dout · out of row t (0 past T), summed over the quad's lanes.
__device__ inline float row_dot(const float* dout_row, const float* out_row, bool valid, int hs, int quad) {
  float partial = 0.0f;
  if (valid) {
    for (int d = quad; d < hs; d += 4) partial += dout_row[d] * out_row[d];
  }
  return quad_sum(partial);
}

template <int kDims>
__global__ void __launch_bounds__(kThreads, 2) bf16_forward_kernel(TensorOut out, float* lse, const Bits* qkv,
                                                                FlashAttentionShape shape) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Bits* const queries = reinterpret_cast<Bits*>(shared_bytes);
  Bits* const keys = queries + kRowTile<kDims>;
  Bits* const values_t = keys + kRowTile<kDims>;
  const int T = shape.T, hs = shape.hs;
  const float scale = shape.scale();
  const int b = blockIdx.y / shape.NH;
  const int h = blockIdx.y % shape.NH;
  const int t0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int warp = threadIdx.x / 32, group = threadIdx.x % 32 / 4, quad = threadIdx.x % 4;
  const int first_row = t0 + 16 * warp;  // of the warp's 16
  load_tile<kDims>(queries, nullptr, qkv + shape.q_offset(b, 0, h), shape.qkv_stride(), t0, T, hs);
  float o[kDims / 8][4] = {};
  OnlineSoftmax softmax[2] = {online_softmax_start(), online_softmax_start()};
  const Bits* k_base = qkv + shape.k_offset(b, 0, shape.kv_head(h));
  const Bits* v_base = qkv + shape.v_offset(b, 0, shape.kv_head(h));
  const int keys_seen = min(T, t0 + kTile);
  for (int j0 = shape.first_key_tile(b, t0, kTile); j0 < keys_seen; j0 += kTile) {
    __syncthreads();
    load_tile<kDims>(keys, nullptr, k_base, shape.qkv_stride(), j0, T, hs);
    load_tile<kDims>(nullptr, values_t, v_base, shape.qkv_stride(), j0, T, hs);
    __syncthreads();
    float s[8][4] = {};
    add_row_dots<kDims>(s, queries + 16 * warp * kRowStride<kDims>, keys, group, quad);
    // Without document masking every row sees key j0 (j0 <= t0 <= its row, j0 < T):
    // each row's max is finite. With it a row may see none of the tile (max -inf),
    // which leaves its running softmax as it was.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= scale;
        const int key = j0 + column_of(nt, e, quad);
        if (key < T && shape.sees(b, first_row + row_of(e, group), key)) {
          tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
        }
      }
    }
    float factor[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) factor[r] = online_softmax_rescale(softmax[r], quad_max(tile_max[r]));
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j0 + column_of(nt, e, quad);
        const bool visible = key < T && shape.sees(b, first_row + row_of(e, group), key);
        s[nt][e] = visible ? online_softmax_weight(softmax[e / 2], s[nt][e]) : 0.0f;
        sum[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) softmax[r].sum += quad_sum(sum[r]);
#pragma unroll
    for (int dt = 0; dt < kDims / 8; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] *= factor[e / 2];
    }
    add_weighted<kDims>(o, s, values_t, group, quad);
  }
  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    inverse[r] = 1.0f / softmax[r].sum;
    const int t = first_row + group + 8 * r;
    if (quad == 0 && t < T) lse[shape.lse_offset(b, h, t)] = online_softmax_lse(softmax[r]);
  }
  const std::size_t out_base = shape.out_offset(b, 0, h);
  store_tile<kDims>(shape.out_stride(), o, first_row, T, hs, group, quad, inverse,
                    [&out, out_base](std::size_t at, float value) { keep_store(out, out_base + at, value); });
}

// dq of one query tile, summed over the key tiles left of its diagonal in order. Each
// row's D = dout . out is written to row_dots ([B, NH, T], as lse) for the dk/dv
// kernel, whose every key tile needs the D of every query row after it: read there
// once, where recomputing it read dout and out in fp32 again for each key tile.
template <int kDims>
__global__ void __launch_bounds__(kThreads) bf16_backward_dq_kernel(float* dqkv, float* row_dots, const float* dout,
                                                                    const Bits* qkv, const float* out,
                                                                    const float* lse, FlashAttentionShape shape) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Bits* const queries = reinterpret_cast<Bits*>(shared_bytes);
  Bits* const grads = queries + kRowTile<kDims>;
  Bits* const keys = grads + kRowTile<kDims>;
  Bits* const values = keys + kRowTile<kDims>;
  Bits* const keys_t = values + kRowTile<kDims>;
  const int T = shape.T, hs = shape.hs;
  const float scale = shape.scale();
  const int b = blockIdx.y / shape.NH;
  const int h = blockIdx.y % shape.NH;
  const int t0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int warp = threadIdx.x / 32, group = threadIdx.x % 32 / 4, quad = threadIdx.x % 4;
  const int first_row = t0 + 16 * warp;
  load_tile<kDims>(queries, nullptr, qkv + shape.q_offset(b, 0, h), shape.qkv_stride(), t0, T, hs);
  load_tile<kDims>(grads, nullptr, dout + shape.out_offset(b, 0, h), shape.out_stride(), t0, T, hs);
  float dots[2], row_lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = first_row + group + 8 * r;
    const bool valid = t < T;
    dots[r] = row_dot(dout + shape.out_offset(b, valid ? t : 0, h), out + shape.out_offset(b, valid ? t : 0, h),
                      valid, hs, quad);
    if (quad == 0 && valid) row_dots[shape.lse_offset(b, h, t)] = dots[r];
    row_lse[r] = valid ? lse[shape.lse_offset(b, h, t)] : 0.0f;
  }
  float dq[kDims / 8][4] = {};
  const Bits* k_base = qkv + shape.k_offset(b, 0, shape.kv_head(h));
  const Bits* v_base = qkv + shape.v_offset(b, 0, shape.kv_head(h));
  const int keys_seen = min(T, t0 + kTile);
  for (int j0 = shape.first_key_tile(b, t0, kTile); j0 < keys_seen; j0 += kTile) {
    __syncthreads();
    load_tile<kDims>(keys, keys_t, k_base, shape.qkv_stride(), j0, T, hs);
    load_tile<kDims>(values, nullptr, v_base, shape.qkv_stride(), j0, T, hs);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
    add_row_dots<kDims>(s, queries + 16 * warp * kRowStride<kDims>, keys, group, quad);
    add_row_dots<kDims>(dp, grads + 16 * warp * kRowStride<kDims>, values, group, quad);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = first_row + row_of(e, group);
        const int key = j0 + column_of(nt, e, quad);
        const bool visible = t < T && shape.sees(b, t, key);
        const float p = visible ? flash_probability(s[nt][e] * scale, row_lse[e / 2]) : 0.0f;
        s[nt][e] = visible ? flash_score_grad(p, dp[nt][e], dots[e / 2], scale) : 0.0f;
      }
    }
    add_weighted<kDims>(dq, s, keys_t, group, quad);
  }
  store_gradient_tile<kDims>(dqkv + shape.q_offset(b, 0, h), shape.qkv_stride(), dq, first_row, T, hs, group, quad);
}

// dk and dv of one key tile of K/V head g, summed over the query heads of g's group
// in order and, for each, over the query tiles from the tile's diagonal on in order.
// Each warp's 16 keys are the M side; a query tile's D (the dq kernel's row_dots) and
// lse go through shared memory.
template <int kDims>
__global__ void __launch_bounds__(kThreads, 1)
    bf16_backward_dkv_kernel(float* dqkv, const float* row_dots, const float* dout, const Bits* qkv,
                             const float* lse, FlashAttentionShape shape) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Bits* const keys = reinterpret_cast<Bits*>(shared_bytes);
  Bits* const values = keys + kRowTile<kDims>;
  Bits* const queries = values + kRowTile<kDims>;
  Bits* const grads = queries + kRowTile<kDims>;
  Bits* const queries_t = grads + kRowTile<kDims>;
  Bits* const grads_t = queries_t + kColumnTile<kDims>;
  float* const tile_dot = reinterpret_cast<float*>(grads_t + kColumnTile<kDims>);
  float* const tile_lse = tile_dot + kTile;
  int* const tile_start = reinterpret_cast<int*>(tile_lse + kTile);  // each query row's document start
  const int T = shape.T, hs = shape.hs;
  const float scale = shape.scale();
  const int b = blockIdx.y / shape.NKV;
  const int g = blockIdx.y % shape.NKV;
  const int j0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / 32, group = threadIdx.x % 32 / 4, quad = threadIdx.x % 4;
  const int first_key = j0 + 16 * warp;
  load_tile<kDims>(keys, nullptr, qkv + shape.k_offset(b, 0, g), shape.qkv_stride(), j0, T, hs);
  load_tile<kDims>(values, nullptr, qkv + shape.v_offset(b, 0, g), shape.qkv_stride(), j0, T, hs);
  float dk[kDims / 8][4] = {}, dv[kDims / 8][4] = {};
  for (int h = g * shape.group_size(); h < (g + 1) * shape.group_size(); ++h) {
    const float* dout_base = dout + shape.out_offset(b, 0, h);
    for (int t0 = j0; t0 < T; t0 += kTile) {
      // A query tile whose first row starts its document after the key tile's last
      // key sees none of it, nor do the tiles after it (the block leaves together).
      if (shape.document_start(b, t0) >= j0 + kTile) break;
      __syncthreads();
      load_tile<kDims>(queries, queries_t, qkv + shape.q_offset(b, 0, h), shape.qkv_stride(), t0, T, hs);
      load_tile<kDims>(grads, grads_t, dout_base, shape.out_stride(), t0, T, hs);
      if (threadIdx.x < kTile) {
        const int t = t0 + static_cast<int>(threadIdx.x);
        tile_dot[threadIdx.x] = t < T ? row_dots[shape.lse_offset(b, h, t)] : 0.0f;
        tile_lse[threadIdx.x] = t < T ? lse[shape.lse_offset(b, h, t)] : 0.0f;
        tile_start[threadIdx.x] = shape.document_start(b, t);
      }
      __syncthreads();
      float s[8][4] = {}, dp[8][4] = {};
      add_row_dots<kDims>(s, keys + 16 * warp * kRowStride<kDims>, queries, group, quad);
      add_row_dots<kDims>(dp, values + 16 * warp * kRowStride<kDims>, grads, group, quad);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = first_key + row_of(e, group);
          const int r = column_of(nt, e, quad);
          const bool visible = key < T && t0 + r < T && key <= t0 + r && key >= tile_start[r];
          const float p = visible ? flash_probability(s[nt][e] * scale, tile_lse[r]) : 0.0f;
          dp[nt][e] = visible ? flash_score_grad(p, dp[nt][e], tile_dot[r], scale) : 0.0f;
          s[nt][e] = p;
        }
      }
      add_weighted<kDims>(dv, s, grads_t, group, quad);
      add_weighted<kDims>(dk, dp, queries_t, group, quad);
    }
  }
  store_gradient_tile<kDims>(dqkv + shape.k_offset(b, 0, g), shape.qkv_stride(), dk, first_key, T, hs, group, quad);
  store_gradient_tile<kDims>(dqkv + shape.v_offset(b, 0, g), shape.qkv_stride(), dv, first_key, T, hs, group, quad);
}

}  // namespace

void bf16_attention_forward(TensorOut out, float* lse, const std::uint16_t* qkv, int B,
                            const FlashAttentionShape& shape) {
  with_head_size(shape.hs, [&]<int kDims>() {
    const int bytes = (2 * kRowTile<kDims> + kColumnTile<kDims>) * static_cast<int>(sizeof(Bits));
    launch_tiles<kThreads>("the bf16 attention forward", kDims, bf16_forward_kernel<kDims>,
                           dim3(tiles_of(shape.T), B * shape.NH), bytes, out, lse, qkv, shape);
  });
}

void bf16_attention_backward(TensorOut dqkv, const float* dout, const std::uint16_t* qkv, const float* out,
                             const float* lse, int B, const FlashAttentionShape& shape) {
  float* const row_dots = static_cast<float*>(scratch(attention_row_dots_scratch_bytes(
      static_cast<std::size_t>(B) * static_cast<std::size_t>(shape.NH) * static_cast<std::size_t>(shape.T))));
  with_head_size(shape.hs, [&]<int kDims>() {
    const int dq_bytes = (4 * kRowTile<kDims> + kColumnTile<kDims>) * static_cast<int>(sizeof(Bits));
    launch_tiles<kThreads>("the bf16 attention backward (dq)", kDims, bf16_backward_dq_kernel<kDims>,
                           dim3(tiles_of(shape.T), B * shape.NH), dq_bytes, dqkv.values, row_dots, dout, qkv, out, lse,
                           shape);
    const int dkv_bytes = (4 * kRowTile<kDims> + 2 * kColumnTile<kDims>) * static_cast<int>(sizeof(Bits)) +
                          2 * kTile * static_cast<int>(sizeof(float)) + kTile * static_cast<int>(sizeof(int));
    launch_tiles<kThreads>("the bf16 attention backward (dk, dv)", kDims, bf16_backward_dkv_kernel<kDims>,
                           dim3(tiles_of(shape.T), B * shape.NKV), dkv_bytes, dqkv.values, row_dots, dout, qkv, lse,
                           shape);
  });
  keep(dqkv, static_cast<std::size_t>(B) * static_cast<std::size_t>(shape.T) * shape.qkv_stride());
}

}  // namespace dufu::trainer::cuda
