// CUDA token + position embedding, serial and vocab-parallel. The backward's dwte
// scatter collides where positions share a token; instead of atomics each thread owns
// one channel and walks the rows in order, so the sums are the same on every run.
// That leaves only C threads of parallelism for dwte: correct, not yet fast (llm.c
// sorts positions by token to do better). The forwards also read the bf16 working copy
// of the weights (train.precision = bf16), widened with bf16.h's function.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/device/bf16.h"
#include "dufu/trainer/device/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

constexpr unsigned kBlock = 256;

__device__ float as_float(float value) { return value; }
__device__ float as_float(std::uint16_t bits) { return ::dufu::trainer::bf16_bits_to_float(bits); }

template <typename Weight>
__global__ void embed_kernel(float* out, const std::int32_t* tokens, const Weight* wte, const Weight* wpe,
                             int vocab_begin, int vocab_end, int B, int T, int C) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(B) * T * C) return;
  const std::size_t row = i / C;
  const int c = static_cast<int>(i % C);
  const int t = static_cast<int>(row % T);
  const std::int32_t id = tokens[row];
  const bool in_range = id >= vocab_begin && id < vocab_end;
  const float token = in_range ? as_float(wte[static_cast<std::size_t>(id - vocab_begin) * C + c]) : 0.0f;
  out[i] = wpe != nullptr ? token + as_float(wpe[static_cast<std::size_t>(t) * C + c]) : token;
}

__global__ void dwte_kernel(float* dwte, const float* dout, const std::int32_t* tokens, int vocab_begin,
                            int vocab_end, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int n = 0; n < N; ++n) {
    const std::int32_t id = tokens[n];
    if (id < vocab_begin || id >= vocab_end) continue;
    dwte[static_cast<std::size_t>(id - vocab_begin) * C + c] += dout[static_cast<std::size_t>(n) * C + c];
  }
}

__global__ void dwpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(T) * C) return;
  float sum = 0.0f;
  for (int b = 0; b < B; ++b) sum += dout[static_cast<std::size_t>(b) * T * C + i];
  dwpe[i] += sum;
}

template <typename Weight>
void embed(float* out, const std::int32_t* tokens, const Weight* wte, const Weight* wpe, int vocab_begin, int vocab_end,
           int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  if (n == 0) return;
  embed_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(out, tokens, wte, wpe, vocab_begin, vocab_end, B, T, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

void scatter(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int vocab_begin, int vocab_end,
             int B, int T, int C) {
  if (B * T == 0 || C == 0) return;
  dwte_kernel<<<blocks_for(static_cast<std::size_t>(C), kBlock), kBlock, 0, stream()>>>(dwte, dout, tokens,
                                                                                       vocab_begin, vocab_end, B * T, C);
  DUFU_CUDA_CHECK_LAUNCH();
  if (dwpe == nullptr) return;
  dwpe_kernel<<<blocks_for(static_cast<std::size_t>(T) * C, kBlock), kBlock, 0, stream()>>>(dwpe, dout, B, T, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) {
  embed(out, tokens, wte, wpe, 0, 0x7fffffff, B, T, C);
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C) {
  scatter(dwte, dwpe, dout, tokens, 0, 0x7fffffff, B, T, C);
}

void vocab_parallel_embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                      int vocab_begin, int V_local, int B, int T, int C) {
  embed(out, tokens, wte, wpe, vocab_begin, vocab_begin + V_local, B, T, C);
}

void embedding_forward_bf16(float* out, const std::int32_t* tokens, const std::uint16_t* wte, const std::uint16_t* wpe,
                            int B, int T, int C) {
  embed(out, tokens, wte, wpe, 0, 0x7fffffff, B, T, C);
}

void vocab_parallel_embedding_forward_bf16(float* out, const std::int32_t* tokens, const std::uint16_t* wte,
                                           const std::uint16_t* wpe, int vocab_begin, int V_local, int B, int T,
                                           int C) {
  embed(out, tokens, wte, wpe, vocab_begin, vocab_begin + V_local, B, T, C);
}

void vocab_parallel_embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                       int vocab_begin, int V_local, int B, int T, int C) {
  scatter(dwte, dwpe, dout, tokens, vocab_begin, vocab_begin + V_local, B, T, C);
}

}  // namespace dufu::trainer::cuda
