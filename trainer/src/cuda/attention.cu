// CUDA causal self-attention, llm.c's recipe: the scores and the weighted values are
// strided-batched cuBLAS GEMMs (tensor cores, no hand tiling), and the masked softmax
// and its backward are one fused kernel per row. Chosen over flash-attention-style
// tiling because the kernel table keeps the probabilities [B, NH, T, T] for the
// backward (the CPU kernel's contract), which is what the GEMM recipe produces anyway,
// and because what cannot run here stays thin: the GEMMs' arguments come from
// attention_gemms.h, which a CPU test replays against the reference attention. The
// full T x T scores are computed (the masked half is wasted work, as in llm.c) and the
// kernels write zeros above the diagonal, which the value GEMMs then read. cuBLAS runs
// with atomics disallowed and the row reductions use fixed trees: a repeated run gives
// the same bits.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/device/attention_gemms.h"
#include "dufu/trainer/device/kernel_math.h"
#include "dufu/trainer/device/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 128;

// One block per (b, h, t) row of att, in place: the scaled scores of keys 0..t become
// their softmax, the masked keys t+1..T-1 become 0.
__global__ void causal_softmax_kernel(float* att, int T) {
  __shared__ float shared[kBlock];
  const int t = blockIdx.x % T;
  float* row = att + static_cast<std::size_t>(blockIdx.x) * T;
  float max_score = -INFINITY;
  for (int j = threadIdx.x; j <= t; j += kBlock) max_score = fmaxf(max_score, row[j]);
  max_score = block_max<kBlock>(max_score, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= t; j += kBlock) {
    const float e = exp_approx(row[j] - max_score);
    row[j] = e;
    sum += e;
  }
  const float inverse = 1.0f / block_sum<kBlock>(sum, shared);
  for (int j = threadIdx.x; j < T; j += kBlock) row[j] = j <= t ? row[j] * inverse : 0.0f;
}

// One block per row, in place on the scratch: datt becomes the scores' gradient
// att (datt - sum_j att datt), zero above the diagonal.
__global__ void causal_softmax_backward_kernel(float* dscores, const float* att, int T) {
  __shared__ float shared[kBlock];
  const int t = blockIdx.x % T;
  const float* row = att + static_cast<std::size_t>(blockIdx.x) * T;
  float* drow = dscores + static_cast<std::size_t>(blockIdx.x) * T;
  float dot_sum = 0.0f;
  for (int j = threadIdx.x; j <= t; j += kBlock) dot_sum += row[j] * drow[j];
  const float total = block_sum<kBlock>(dot_sum, shared);
  for (int j = threadIdx.x; j < T; j += kBlock) drow[j] = j <= t ? row[j] * (drow[j] - total) : 0.0f;
}

// The device pointers of one call, by the names attention_gemms.h gives them.
struct AttentionPointers {
  const float* qkv = nullptr;
  float* att = nullptr;
  float* out = nullptr;
  const float* dout = nullptr;
  float* scratch = nullptr;
  float* dqkv = nullptr;

  const float* read(const GemmOperand& operand) const {
    switch (operand.buffer) {
      case AttentionBuffer::kQkv:
        return qkv + operand.offset;
      case AttentionBuffer::kDout:
        return dout + operand.offset;
      default:
        return written(operand.buffer) + operand.offset;
    }
  }
  float* write(const GemmOperand& operand) const { return written(operand.buffer) + operand.offset; }

 private:
  float* written(AttentionBuffer buffer) const {
    switch (buffer) {
      case AttentionBuffer::kAtt:
        return att;
      case AttentionBuffer::kOut:
        return out;
      case AttentionBuffer::kScratch:
        return scratch;
      case AttentionBuffer::kDqkv:
        return dqkv;
      default:
        DUFU_FAIL("attention GEMM writes to a read-only buffer");
    }
  }
};

void run_gemm(const StridedBatchedGemm& gemm, const AttentionPointers& pointers) {
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  DUFU_CUBLAS_CHECK(cublasSgemmStridedBatched(
      blas, gemm.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, gemm.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, gemm.m, gemm.n,
      gemm.k, &gemm.alpha, pointers.read(gemm.a), gemm.a.ld, gemm.a.stride, pointers.read(gemm.b), gemm.b.ld,
      gemm.b.stride, &gemm.beta, pointers.write(gemm.c), gemm.c.ld, gemm.c.stride, gemm.batch_count));
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  if (B * T == 0) return;
  const AttentionShape shape{T, C, NH};
  const AttentionPointers pointers{.qkv = qkv, .att = att, .out = out};
  for (int b = 0; b < B; ++b) run_gemm(attention_scores_gemm(shape, b), pointers);
  causal_softmax_kernel<<<B * NH * T, kBlock, 0, stream()>>>(att, T);
  DUFU_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; ++b) run_gemm(attention_values_gemm(shape, b), pointers);
}

void attention_backward(float* dqkv, float* datt_scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  if (B * T == 0) return;
  const AttentionShape shape{T, C, NH};
  // att is only read; the pointer is non-const because the forward writes it.
  const AttentionPointers pointers{
      .qkv = qkv, .att = const_cast<float*>(att), .dout = dout, .scratch = datt_scratch, .dqkv = dqkv};
  for (int b = 0; b < B; ++b) {
    run_gemm(attention_datt_gemm(shape, b), pointers);
    run_gemm(attention_dv_gemm(shape, b), pointers);
  }
  causal_softmax_backward_kernel<<<B * NH * T, kBlock, 0, stream()>>>(datt_scratch, att, T);
  DUFU_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; ++b) {
    run_gemm(attention_dq_gemm(shape, b), pointers);
    run_gemm(attention_dk_gemm(shape, b), pointers);
  }
}

}  // namespace dufu::trainer::cuda
