// The CUDA backend's kernels: the implementations behind the CUDA device's
// KernelTable (kernel_table.h documents each op). Every pointer is device memory of
// the current device; every function enqueues its work on the device's stream and
// returns (download() and synchronize() wait). Launch geometry and the order of every
// reduction are fixed by the sizes alone (kernel_partition.h), and no reduction uses
// floating-point atomics, so a run repeated gives the same bits. Checks of targets and
// token ids are the caller's (GPT checks them on the host before any kernel).
//
// Compiled and linked in CI; no GPU has run them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "dufu/trainer/kernel_table.h"

namespace dufu::trainer::cuda {


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
                  float lr, float beta1, float beta2, float eps, int t, float grad_scale);
void add(float* out, const float* a, const float* b, std::size_t n);
void masked_mean_loss(float* mean_out, const float* losses, const std::int32_t* targets, int N);


const KernelTable& kernel_table();

// The stream and the cuBLAS(Lt) handles every kernel of this backend uses (created on
// first use, on the current device).
cudaStream_t stream();
void* cublaslt_handle();  // cublasLtHandle_t
void* cublas_handle();    // cublasHandle_t
// Scratch for cuBLASLt (a fixed size, allocated once).
void* matmul_workspace();
std::size_t matmul_workspace_bytes();

void fill(float* destination, float value, std::size_t count);

}  // namespace dufu::trainer::cuda

#include "dufu/trainer/device.h"

namespace dufu::trainer::cuda {
// Whether a CUDA device can be used here (the driver answers and has a device), and
// the process's CUDA device.
DeviceAvailability availability();
Device& device();
}  // namespace dufu::trainer::cuda
