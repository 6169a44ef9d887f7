// CPU AdamW: one pass over the parameters, reading each of params, grads, m and v
// once; the per-step scalars (bias corrections) are computed per segment, outside the
// element loop. The loop vectorizes only when built with -fno-math-errno:
// otherwise std::sqrt keeps a branch to set errno, and the update runs ~4x slower.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <span>

#include "cpu_kernels.h"
#include "dufu/common/error.h"
#include "device/kernel_math.h"

namespace dufu::trainer::cpu {

DUFU_CPU_CLONES void adamw_update(float* params, const float* grads, float* m, float* v,
                                  std::span<const AdamWSegment> segments, float lr, float beta1, float beta2, float eps,
                                  int t, float grad_scale) {
  DUFU_CHECK(t >= 1, "AdamW steps count from 1, got ", t);
  for (std::size_t s = 1; s < segments.size(); ++s) {
    DUFU_CHECK(segments[s - 1].end <= segments[s].end, "adamw_update: segment ", s, " ends at ", segments[s].end,
               ", before the previous one (", segments[s - 1].end, ")");
  }
  const std::size_t n = segments.empty() ? 0 : segments.back().end;
#pragma omp parallel
  {
    // Contiguous equal chunks, as schedule(static) would give, rounded to 16 floats (a
    // cache line) so that two threads share at most one line of each buffer.
    const std::size_t threads = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t chunk = ((n + threads - 1) / threads + 15) / 16 * 16;
    const std::size_t begin = std::min(n, chunk * static_cast<std::size_t>(omp_get_thread_num()));
    const std::size_t end = std::min(n, begin + chunk);
    // The first segment that reaches past `begin`; segments ending earlier (empty ones
    // included) are skipped.
    auto segment = std::upper_bound(segments.begin(), segments.end(), begin,
                                    [](std::size_t i, const AdamWSegment& s) { return i < s.end; });
    for (std::size_t i = begin; i < end; ++segment) {
      const std::size_t stop = std::min(end, segment->end);
      const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, segment->weight_decay, t);
      for (std::size_t j = i; j < stop; ++j) adamw_element(params[j], grads[j] * grad_scale, m[j], v[j], step);
      i = stop;
    }
  }
}

}  // namespace dufu::trainer::cpu
