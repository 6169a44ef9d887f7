// CUDA token + position embedding, serial and vocab-parallel. The backward's dwte
// scatter collides where positions share a token; instead of atomics the positions
// are bucketed by token as llm.c does (embedding_buckets.h): cub's stable radix sort of
// (key, position) pairs, then blocks that each add one bucket's rows in position
// order, one thread per channel: the CPU device's chain of additions, on every run.
// dwpe is a sum over B per (position, channel), one thread each, in b order; with
// position ids (document masking) positions collide as tokens do, and dwpe is
// bucketed by position id the same way. The
// forwards also read the bf16 working copy of the weights (train.precision = bf16),
// widened with bf16.h's function.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cstdint>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "device/bf16.h"
#include "device/embedding_buckets.h"
#include "device/kernel_partition.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr unsigned kBlock = 256;
// The bucket sums: channels per block, and blocks along the sorted positions (each
// visits every kBucketBlocks-th; 1024 x 6 tiles at C = 768 keeps 132 SMs busy).
constexpr unsigned kBucketThreads = 128;
constexpr int kBucketBlocks = 1024;

__device__ float as_float(float value) { return value; }
__device__ float as_float(std::uint16_t bits) { return ::dufu::trainer::bf16_bits_to_float(bits); }

template <typename Weight>
__global__ void embed_kernel(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions,
                             const Weight* wte, const Weight* wpe, int vocab_begin, int vocab_end, int B, int T,
                             int C) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(B) * T * C) return;
  const std::size_t row = i / C;
  const int c = static_cast<int>(i % C);
  const int t = positions == nullptr ? static_cast<int>(row % T) : positions[row];
  const std::int32_t id = tokens[row];
  const bool in_range = id >= vocab_begin && id < vocab_end;
  const float token = in_range ? as_float(wte[static_cast<std::size_t>(id - vocab_begin) * C + c]) : 0.0f;
  keep_store(out, i, wpe != nullptr ? token + as_float(wpe[static_cast<std::size_t>(t) * C + c]) : token);
}

__global__ void bucket_keys_kernel(std::int32_t* keys, std::int32_t* positions, const std::int32_t* tokens,
                                   int vocab_begin, int vocab_end, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  keys[n] = embedding_bucket_key(tokens[n], vocab_begin, vocab_end);
  positions[n] = n;
}

// Block (x, tile) visits sorted positions x, x + gridDim.x, ...; where one opens a
// bucket its threads (one per channel of the tile) sum the bucket into dwte. Each
// dwte value belongs to one bucket, so to one thread.
__global__ void __launch_bounds__(kBucketThreads) dwte_bucket_kernel(float* dwte, const float* dout,
                                                                     const std::int32_t* sorted_keys,
                                                                     const std::int32_t* sorted_positions, int N,
                                                                     int C) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int i = blockIdx.x; i < N; i += gridDim.x) {
    if (!opens_bucket(sorted_keys, i)) continue;
    float* g = dwte + static_cast<std::size_t>(sorted_keys[i]) * C + c;
    *g = sum_bucket_channel(*g, dout, sorted_keys, sorted_positions, i, N, C, c);
  }
}

__global__ void dwpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(T) * C) return;
  float sum = dwpe[i];  // the CPU's chain: dwpe += dout of b = 0, 1, ...
  for (int b = 0; b < B; ++b) sum += dout[static_cast<std::size_t>(b) * T * C + i];
  dwpe[i] = sum;
}

template <typename Weight>
void embed(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions, const Weight* wte,
           const Weight* wpe, int vocab_begin, int vocab_end, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  if (n == 0) return;
  embed_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(out, tokens, positions, wte, wpe, vocab_begin,
                                                               vocab_end, B, T, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

// dtable[row of ids[n]] += dout[n] for the N = B T positions whose id is in [begin, end),
// bucketed by id (embedding_buckets.h).
void bucket_scatter(float* dtable, const float* dout, const std::int32_t* ids, int begin, int end, int N, int C) {
  // The scratch: two arrays of keys and two of positions (cub's double buffers), then
  // cub's own storage.
  const std::size_t arrays = embedding_bucket_arrays_bytes(static_cast<std::size_t>(N));
  auto* base = static_cast<char*>(scratch(embedding_backward_scratch_bytes(static_cast<std::size_t>(N))));
  const auto array = [&](int k) { return reinterpret_cast<std::int32_t*>(base + k * (arrays / 4)); };
  cub::DoubleBuffer<std::int32_t> keys(array(0), array(1));
  cub::DoubleBuffer<std::int32_t> positions(array(2), array(3));
  std::size_t sort_bytes = 0;
  DUFU_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, positions, N, 0, kEmbeddingKeyBits,
                                                  stream()));
  DUFU_CHECK(sort_bytes <= kEmbeddingSortTemporaryBytes, "the embedding backward's sort of ", N,
             " positions asks for ", sort_bytes, " bytes of scratch, more than the ", kEmbeddingSortTemporaryBytes,
             " the memory plan holds (embedding_buckets.h)");
  bucket_keys_kernel<<<blocks_for(static_cast<std::size_t>(N), kBlock), kBlock, 0, stream()>>>(
      keys.Current(), positions.Current(), ids, begin, end, N);
  DUFU_CUDA_CHECK_LAUNCH();
  DUFU_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + arrays, sort_bytes, keys, positions, N, 0,
                                                  kEmbeddingKeyBits, stream()));
  const std::int32_t* sorted_keys = keys.Current();  // the sort says which buffer holds its result
  const std::int32_t* sorted_positions = positions.Current();
  const dim3 grid(static_cast<unsigned>(N < kBucketBlocks ? N : kBucketBlocks),
                  blocks_for(static_cast<std::size_t>(C), kBucketThreads));
  dwte_bucket_kernel<<<grid, kBucketThreads, 0, stream()>>>(dtable, dout, sorted_keys, sorted_positions, N, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

void scatter(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, const std::int32_t* positions,
             int vocab_begin, int vocab_end, int B, int T, int C) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  bucket_scatter(dwte, dout, tokens, vocab_begin, vocab_end, N, C);
  if (dwpe == nullptr) return;
  if (positions != nullptr) {
    bucket_scatter(dwpe, dout, positions, 0, 0x7fffffff, N, C);
    return;
  }
  dwpe_kernel<<<blocks_for(static_cast<std::size_t>(T) * C, kBlock), kBlock, 0, stream()>>>(dwpe, dout, B, T, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace

void vocab_parallel_embedding_forward(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions,
                                      TensorIn wte, TensorIn wpe, int vocab_begin, int V_local, int B, int T, int C) {
  const int vocab_end = vocab_begin + V_local;
  if (bf16_operands("vocab_parallel_embedding_forward", wte, wpe)) {
    embed(out, tokens, positions, wte.bits(), wpe.bits(), vocab_begin, vocab_end, B, T, C);
  } else {
    embed(out, tokens, positions, wte.values(), wpe.values(), vocab_begin, vocab_end, B, T, C);
  }
}

void embedding_forward(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions, TensorIn wte,
                       TensorIn wpe, int B, int T, int C) {
  if (bf16_operands("embedding_forward", wte, wpe)) {
    embed(out, tokens, positions, wte.bits(), wpe.bits(), 0, 0x7fffffff, B, T, C);
  } else {
    embed(out, tokens, positions, wte.values(), wpe.values(), 0, 0x7fffffff, B, T, C);
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        const std::int32_t* positions, int B, int T, int C) {
  scatter(dwte, dwpe, dout, tokens, positions, 0, 0x7fffffff, B, T, C);
}

void vocab_parallel_embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                       const std::int32_t* positions, int vocab_begin, int V_local, int B, int T,
                                       int C) {
  scatter(dwte, dwpe, dout, tokens, positions, vocab_begin, vocab_begin + V_local, B, T, C);
}

}  // namespace dufu::trainer::cuda
