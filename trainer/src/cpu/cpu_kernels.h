// The CPU backend's kernels: the implementations behind the CPU device's KernelTable
// (kernel_table.h documents each op), one file per op family in this folder, and the
// decisions they share.
//
// Threading: every kernel runs on OpenMP's threads (omp_get_max_threads(), i.e.
// OMP_NUM_THREADS or omp_set_num_threads). matmul sets OpenBLAS to one thread on first
// use and splits each product across the OpenMP threads itself, so the two thread
// pools never compete for the cores; don't call these kernels from inside an OpenMP
// parallel region. Except for matmul (OpenBLAS picks kernels by block size), results
// are also bitwise identical across thread counts. AdamW runs as one parallel region
// with the elements split evenly over the threads, whatever the segments: a fork/join
// per tensor costs more than the update of a small tensor, and far more when another
// process holds a core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "dufu/trainer/kernel_table.h"

namespace dufu::trainer::cpu {

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B, int T, int C);
void vocab_parallel_embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                      int vocab_begin, int V_local, int B, int T, int C);
void vocab_parallel_embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                       int vocab_begin, int V_local, int B, int T, int C);
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                       int N, int C);
void residual_layernorm_forward(float* residual_out, float* norm_out, float* mean, float* rstd, const float* residual,
                                const float* branch, const float* weight, const float* bias, int N, int C);
void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x, const float* weight,
                        const float* mean, const float* rstd, int N, int C);
void matmul_forward(float* out, const float* x, const float* weight, const float* bias, int N, int C, int OC);
void matmul_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x, const float* weight,
                     int N, int C, int OC);
void bias_gelu_forward(float* out, float* pre, const float* x, const float* bias, int N, int C);
void bias_gelu_backward(float* dx, float* dbias, const float* dout, const float* pre, int N, int C);
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* datt_scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);
void classifier_forward_backward(float* logits, float* losses, const std::int32_t* targets, float dloss_scale, int N,
                                 int V, int Vp);
void vocab_parallel_classifier_max(float* row_max, const float* logits, const std::int32_t* targets, int N, int V,
                                   int vocab_begin, int Vl);
void vocab_parallel_classifier_exp_sum(double* stats, float* logits, const float* row_max, const std::int32_t* targets,
                                       int N, int V, int vocab_begin, int Vl);
void vocab_parallel_classifier_finish(float* logits, float* losses, const double* stats, const float* row_max,
                                      const std::int32_t* targets, float dloss_scale, int N, int V, int vocab_begin,
                                      int Vl);
double sum_of_squares(const float* values, std::size_t n);
void scale_in_place(float* values, float scale, std::size_t n);
void adamw_update(float* params, const float* grads, float* m, float* v, std::span<const AdamWSegment> segments,
                  float lr, float beta1, float beta2, float eps, int t, float grad_scale = 1.0f);
void add(float* out, const float* a, const float* b, std::size_t n);
void masked_mean_loss(float* mean_out, const float* losses, const std::int32_t* targets, int N);

// The table of the functions above, for the CPU device.
const KernelTable& kernel_table();

// The CPU kernels call sgemm from inside their own OpenMP threads (matmul splits its
// products, attention runs one head per thread), so OpenBLAS itself must stay
// single-threaded: its pthread pool would oversubscribe the cores and fight OpenMP's
// spinning workers. Sets OpenBLAS to one thread the first time it is called (cheap
// afterwards); call it before any sgemm.
void use_single_threaded_blas();

}  // namespace dufu::trainer::cpu

// The build targets baseline x86-64 (SSE2), where a vectorized exp or GELU runs at a
// third of the speed AVX2 gives. Kernels marked with this are compiled twice, for
// x86-64-v3 (AVX2, FMA) and for the baseline, and the dynamic loader picks the copy
// the machine supports (GCC target_clones). Results may then differ in rounding
// between machines, never between runs or thread counts on one machine.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DUFU_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DUFU_CPU_CLONES
#endif
