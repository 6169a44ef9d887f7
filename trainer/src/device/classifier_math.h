// The one-pass row statistics of the CUDA classifier (src/cuda/classifier.cu): the
// online softmax of flash_attention.h run over a row of logits instead of a row of
// attention scores. Each thread folds its tiles of the row into a running maximum and
// sum of exp(logit - maximum); the states of disjoint parts of the row then merge two
// by two. One read of the row thus gives both statistics, where a max pass and an
// exp-and-sum pass read it twice. Host and device, so the CPU tests check the
// recurrence the GPU runs. (The CPU classifier keeps its three passes: a row of 50k
// logits stays in its core's cache between them, and its bits stay what they were.)
#pragma once

#include <cmath>

#include "device/flash_attention.h"
#include "device/kernel_math.h"

namespace dufu::trainer {

// Folds `count` logits (count >= 1) into the row's state: if the tile raises the
// maximum, the sum so far is rescaled to it first (online_softmax_rescale), then the
// tile's weights exp(logit - maximum) are added, summed within the tile first.
DUFU_HOST_DEVICE inline void online_softmax_add_tile(OnlineSoftmax& row, const float* tile, int count) {
  float tile_max = tile[0];
  for (int k = 1; k < count; ++k) tile_max = tile[k] > tile_max ? tile[k] : tile_max;
  online_softmax_rescale(row, tile_max);
  float tile_sum = 0.0f;
  for (int k = 0; k < count; ++k) tile_sum += online_softmax_weight(row, tile[k]);
  row.sum += tile_sum;
}

// The state of two disjoint parts of a row, from theirs: the sum of the part with the
// smaller maximum is rescaled to the larger. merge(a, b) and merge(b, a) give the same
// bits (the larger maximum's sum is weighted by exp_approx(0) = 1 exactly, and float
// addition commutes), so a butterfly of warp shuffles leaves every lane the same state.
// A part that saw no logit (maximum -inf) changes nothing.
DUFU_HOST_DEVICE inline OnlineSoftmax online_softmax_merge(OnlineSoftmax a, const OnlineSoftmax& b) {
  if (b.max == -INFINITY) return a;
  online_softmax_rescale(a, b.max);
  a.sum += b.sum * online_softmax_weight(a, b.max);
  return a;
}

// -log softmax(logits)[target] = log(sum) - (logit[target] - max), the logarithm in
// double as the CPU classifier takes it.
DUFU_HOST_DEVICE inline float classifier_loss(const OnlineSoftmax& row, float target_logit) {
  return static_cast<float>(std::log(static_cast<double>(row.sum)) -
                            (static_cast<double>(target_logit) - static_cast<double>(row.max)));
}

// One logit's gradient, dloss_scale (softmax - onehot(target)), with grad_scale =
// dloss_scale / sum: the gradient sweep recomputes the weight rather than storing it.
DUFU_HOST_DEVICE inline float classifier_grad(const OnlineSoftmax& row, float logit, float grad_scale, bool is_target,
                                              float dloss_scale) {
  return online_softmax_weight(row, logit) * grad_scale - (is_target ? dloss_scale : 0.0f);
}

}  // namespace dufu::trainer
