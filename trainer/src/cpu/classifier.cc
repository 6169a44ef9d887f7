// CPU fused softmax + cross-entropy + its gradient, in place over the logits: the
// [N, Vp] logits are the largest activation of GPT-2, so they are read and written
// in three passes over one row (max; exp and sum; scale) while it is in cache, and
// no separate probabilities buffer exists.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cpu_backend.h"
#include "dufu/common/error.h"
#include "dufu/trainer/kernel_math.h"
#include "dufu/trainer/kernels.h"

namespace dufu::trainer {

DUFU_CPU_CLONES void classifier_forward_backward(float* logits, float* losses, const std::int32_t* targets,
                                                 float dloss_scale, int N, int V, int Vp) {
  DUFU_CHECK(V >= 1 && V <= Vp, "vocabulary ", V, " must be in [1, padded vocabulary ", Vp, "]");
  // A bad target would index outside the row; check them all before any thread runs,
  // because an exception cannot leave an OpenMP region.
  for (int n = 0; n < N; ++n) {
    DUFU_CHECK(targets[n] == -1 || (targets[n] >= 0 && targets[n] < V), "target ", targets[n], " at row ", n,
               " is outside the vocabulary [0, ", V, ") and is not the ignore value -1");
  }
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* row = logits + static_cast<std::size_t>(n) * Vp;
    const int target = targets[n];
    for (int i = V; i < Vp; ++i) row[i] = 0.0f;
    if (target < 0) {
      for (int i = 0; i < V; ++i) row[i] = 0.0f;
      losses[n] = 0.0f;
      continue;
    }
    float max_logit = row[0];
#pragma omp simd reduction(max : max_logit)
    for (int i = 1; i < V; ++i) max_logit = row[i] > max_logit ? row[i] : max_logit;
    const float target_logit = row[target];
    // The sum runs over ~50k terms: double keeps the loss exact to float precision.
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; ++i) {
      const float e = exp_approx(row[i] - max_logit);
      row[i] = e;
      sum += e;
    }
    // -log softmax[target] = log(sum) - (logit[target] - max)
    losses[n] = static_cast<float>(std::log(sum) - (static_cast<double>(target_logit) - max_logit));
    const float grad_scale = static_cast<float>(dloss_scale / sum);
    for (int i = 0; i < V; ++i) row[i] *= grad_scale;
    row[target] -= dloss_scale;
  }
}

}  // namespace dufu::trainer
