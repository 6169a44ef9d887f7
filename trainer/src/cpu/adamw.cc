// CPU AdamW: one pass over the parameters, reading each of params, grads, m and v
// once; the per-step scalars (bias corrections) are computed once, outside the loop.
// The loop vectorizes only when built with -fno-math-errno: otherwise std::sqrt keeps
// a branch to set errno, and the update runs ~4x slower.
#include <cstddef>

#include "cpu_backend.h"
#include "dufu/common/error.h"
#include "dufu/trainer/kernel_math.h"
#include "dufu/trainer/kernels.h"

namespace dufu::trainer {

DUFU_CPU_CLONES void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t n, float lr,
                                  float beta1, float beta2, float eps, float weight_decay, int t) {
  DUFU_CHECK(t >= 1, "AdamW steps count from 1, got ", t);
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) adamw_element(params[i], grads[i], m[i], v[i], step);
}

}  // namespace dufu::trainer
