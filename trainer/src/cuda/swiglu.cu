// CUDA SwiGLU forward and backward on the fused gate/up buffer [N, 2H]: one thread per
// output element, the per-element formulas of llama_math.h (the CPU's).
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "device/kernel_partition.h"
#include "device/llama_math.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr unsigned kBlock = 256;

__global__ void swiglu_forward_kernel(TensorOut out, const float* gate_up, int N, int H) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(N) * H) return;
  const std::size_t gate = (i / H) * 2 * H + i % H;
  keep_store(out, i, swiglu(gate_up[gate], gate_up[gate + H]));
}

__global__ void swiglu_backward_kernel(TensorOut dgate_up, const float* dout, const float* gate_up, int N, int H) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(N) * H) return;
  const std::size_t gate = (i / H) * 2 * H + i % H;
  float dgate, dup;
  swiglu_grad(dout[i], gate_up[gate], gate_up[gate + H], dgate, dup);
  keep_store(dgate_up, gate, dgate);
  keep_store(dgate_up, gate + H, dup);
}

}  // namespace

void swiglu_forward(TensorOut out, const float* gate_up, int N, int H) {
  const std::size_t count = static_cast<std::size_t>(N) * H;
  if (count == 0) return;
  swiglu_forward_kernel<<<blocks_for(count, kBlock), kBlock, 0, stream()>>>(out, gate_up, N, H);
  DUFU_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(TensorOut dgate_up, const float* dout, const float* gate_up, int N, int H) {
  const std::size_t count = static_cast<std::size_t>(N) * H;
  if (count == 0) return;
  swiglu_backward_kernel<<<blocks_for(count, kBlock), kBlock, 0, stream()>>>(dgate_up, dout, gate_up, N, H);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
