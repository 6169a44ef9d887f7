// CUDA rotary position embedding, forward and backward, in place on the q and k heads
// of a fused qkv buffer. One thread per (row, pair i): it computes the pair's cos and
// sin once (llama_math.h, the CPU's formula) and turns that pair in every q and k
// head of the row, so the double-precision cos/sin is paid once per NH + NKV heads;
// consecutive threads take consecutive i, so each head's loads and stores coalesce.
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "device/kernel_partition.h"
#include "device/llama_math.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr unsigned kBlock = 256;

// positions null: row n's position is n % T.
__global__ void rotary_kernel(TensorOut qkv, const std::int32_t* positions, int N, int T, int NH, int NKV, int hs,
                              float theta, float direction) {
  const int half = hs / 2;
  const std::size_t index = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (index >= static_cast<std::size_t>(N) * half) return;
  const int n = static_cast<int>(index / half);
  const int i = static_cast<int>(index % half);
  float cos_a, sin_a;
  rotary_cos_sin(positions == nullptr ? n % T : positions[n], i, hs, theta, cos_a, sin_a);
  sin_a *= direction;
  const std::size_t row = static_cast<std::size_t>(n) * (NH + 2 * NKV) * hs;
  for (int head = 0; head < NH + NKV; ++head) {
    const std::size_t x = row + static_cast<std::size_t>(head) * hs;
    float x1 = qkv.values[x + i];
    float x2 = qkv.values[x + i + half];
    rotate_pair(x1, x2, cos_a, sin_a);
    keep_store(qkv, x + i, x1);
    keep_store(qkv, x + i + half, x2);
  }
  // The v heads are not turned, but kept with the rest: the same pair of each.
  if (qkv.type != ElementType::kBf16) return;
  for (int head = NH + NKV; head < NH + 2 * NKV; ++head) {
    const std::size_t x = row + static_cast<std::size_t>(head) * hs;
    keep_store(qkv, x + i, qkv.values[x + i]);
    keep_store(qkv, x + i + half, qkv.values[x + i + half]);
  }
}

void rotate(TensorOut qkv, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs, float theta,
            float direction) {
  const std::size_t pairs = static_cast<std::size_t>(B) * T * (hs / 2);
  if (pairs == 0) return;
  rotary_kernel<<<blocks_for(pairs, kBlock), kBlock, 0, stream()>>>(qkv, positions, B * T, T, NH, NKV, hs, theta,
                                                                    direction);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rotary_forward(TensorOut qkv, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs,
                    float theta) {
  rotate(qkv, positions, B, T, NH, NKV, hs, theta, 1.0f);
}

void rotary_backward(TensorOut dqkv, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs,
                     float theta) {
  rotate(dqkv, positions, B, T, NH, NKV, hs, theta, -1.0f);
}

}  // namespace dufu::trainer::cuda
