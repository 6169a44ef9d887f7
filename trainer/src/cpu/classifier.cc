// CPU fused softmax + cross-entropy + its gradient, in place over the logits: the
// [N, Vp] logits are the largest activation of GPT-2, so they are read and written
// in three passes over one row (max; exp and sum; scale) while it is in cache, and
// no separate probabilities buffer exists. The vocab-parallel classifier below makes
// the same three passes as three kernels, so that the ranks holding the pieces of a
// row can combine their row statistics between them.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "cpu_kernels.h"
#include "dufu/common/error.h"
#include "device/kernel_math.h"

namespace dufu::trainer::cpu {

DUFU_CPU_CLONES void classifier_forward_backward(TensorOut kept_logits, float* losses, const std::int32_t* targets,
                                                 float dloss_scale, int N, int V, int Vp) {
  float* logits = kept_logits.values;
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
      // Kept too: the LM head's backward reads the bits of every row.
      keep_row(kept_logits, static_cast<std::size_t>(n) * Vp, Vp);
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
    keep_row(kept_logits, static_cast<std::size_t>(n) * Vp, Vp);
  }
}

namespace {
// How many of a rank's Vl columns, starting at vocabulary id vocab_begin, are real
// vocabulary (the rest are padding).
int real_columns(int V, int vocab_begin, int Vl) { return std::clamp(V - vocab_begin, 0, Vl); }
}  // namespace

DUFU_CPU_CLONES void vocab_parallel_classifier_max(float* row_max, const float* logits, const std::int32_t* targets,
                                                   int N, int V, int vocab_begin, int Vl) {
  DUFU_CHECK(V >= 1 && vocab_begin >= 0 && Vl >= 1, "vocabulary ", V, ", columns [", vocab_begin, ", +", Vl, ")");
  for (int n = 0; n < N; ++n) {
    DUFU_CHECK(targets[n] == -1 || (targets[n] >= 0 && targets[n] < V), "target ", targets[n], " at row ", n,
               " is outside the vocabulary [0, ", V, ") and is not the ignore value -1");
  }
  const int real = real_columns(V, vocab_begin, Vl);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + static_cast<std::size_t>(n) * Vl;
    float max_logit = -std::numeric_limits<float>::infinity();
    if (targets[n] >= 0) {
#pragma omp simd reduction(max : max_logit)
      for (int i = 0; i < real; ++i) max_logit = row[i] > max_logit ? row[i] : max_logit;
    }
    row_max[n] = max_logit;
  }
}

DUFU_CPU_CLONES void vocab_parallel_classifier_exp_sum(double* stats, float* logits, const float* row_max,
                                                       const std::int32_t* targets, int N, int V, int vocab_begin,
                                                       int Vl) {
  const int real = real_columns(V, vocab_begin, Vl);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* row = logits + static_cast<std::size_t>(n) * Vl;
    const int local_target = targets[n] - vocab_begin;
    stats[n] = 0.0;
    stats[N + n] = 0.0;
    if (targets[n] < 0) continue;
    if (local_target >= 0 && local_target < real) stats[N + n] = row[local_target];
    const float max_logit = row_max[n];
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < real; ++i) {
      const float e = exp_approx(row[i] - max_logit);
      row[i] = e;
      sum += e;
    }
    stats[n] = sum;
  }
}

DUFU_CPU_CLONES void vocab_parallel_classifier_finish(TensorOut logits, float* losses, const double* stats,
                                                      const float* row_max, const std::int32_t* targets,
                                                      float dloss_scale, int N, int V, int vocab_begin, int Vl) {
  const int real = real_columns(V, vocab_begin, Vl);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * Vl;
    float* row = logits.values + offset;
    for (int i = real; i < Vl; ++i) row[i] = 0.0f;
    if (targets[n] < 0) {
      for (int i = 0; i < real; ++i) row[i] = 0.0f;
      losses[n] = 0.0f;
      keep_row(logits, offset, Vl);
      continue;
    }
    const double sum = stats[n];
    // As in classifier_forward_backward: log(sum) - (logit[target] - max).
    losses[n] = static_cast<float>(std::log(sum) - (stats[N + n] - row_max[n]));
    const float grad_scale = static_cast<float>(dloss_scale / sum);
    for (int i = 0; i < real; ++i) row[i] *= grad_scale;
    const int local_target = targets[n] - vocab_begin;
    if (local_target >= 0 && local_target < real) row[local_target] -= dloss_scale;
    keep_row(logits, offset, Vl);
  }
}

}  // namespace dufu::trainer::cpu
