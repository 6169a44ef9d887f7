// CPU SwiGLU forward and backward on the fused gate/up buffer [N, 2H].
#include <cstddef>

#include "cpu_kernels.h"
#include "device/llama_math.h"

namespace dufu::trainer::cpu {

DUFU_CPU_CLONES void swiglu_forward(TensorOut kept, const float* gate_up, int N, int H) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* gate = gate_up + static_cast<std::size_t>(n) * 2 * H;
    const float* up = gate + H;
    float* o = kept.values + static_cast<std::size_t>(n) * H;
#pragma omp simd
    for (int h = 0; h < H; ++h) o[h] = swiglu(gate[h], up[h]);
    keep_row(kept, static_cast<std::size_t>(n) * H, H);
  }
}

DUFU_CPU_CLONES void swiglu_backward(TensorOut kept, const float* dout, const float* gate_up, int N, int H) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * 2 * H;
    const float* gate = gate_up + offset;
    const float* up = gate + H;
    float* dgate = kept.values + offset;
    float* dup = dgate + H;
    const float* g = dout + static_cast<std::size_t>(n) * H;
#pragma omp simd
    for (int h = 0; h < H; ++h) swiglu_grad(g[h], gate[h], up[h], dgate[h], dup[h]);
    keep_row(kept, offset, 2 * H);
  }
}

}  // namespace dufu::trainer::cpu
