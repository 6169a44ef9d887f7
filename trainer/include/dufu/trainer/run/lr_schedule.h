// The learning-rate schedules of GPT pretraining: linear warmup to the peak, then
// either cosine decay to a floor (GPT-3, Megatron, nanoGPT), or warmup-stable-decay
// (MiniCPM, DeepSeek LLM; Hagele et al. 2024, "Scaling Laws and Compute-Optimal
// Training Beyond Fixed Training Durations"): the peak until a final decay to the
// floor. Under WSD the rate of any step before the decay does not depend on the run's
// length, so a run extended before its decay began continues on the same rates.
// Then the floor.
#pragma once

#include <cstdint>

#include "dufu/trainer/model/training_knobs.h"

namespace dufu::trainer {

// The defaults are the knob table's: optim.lr, optim.min_lr, optim.warmup_steps, and
// optim.decay_steps = 0, which is train.steps.
enum class LrShape { kCosine, kWsdLinear, kWsdOneMinusSqrt };

struct LrSchedule {
  double max_lr = training_knob_double<double>("optim.lr");
  double min_lr = training_knob_double<double>("optim.min_lr");
  std::int64_t warmup_steps = training_knob_int<std::int64_t>("optim.warmup_steps");
  // The step at which the decay reaches min_lr (usually the run's total steps).
  std::int64_t decay_steps = training_knob_int<std::int64_t>("train.steps");
  LrShape shape = LrShape::kCosine;
  // Under WSD: the steps of the final decay, which begins at decay_steps minus these.
  std::int64_t wsd_decay_steps = 0;
  // Throws dufu::Error naming the field: negative rates, min_lr > max_lr,
  // negative warmup, decay_steps < warmup_steps, a WSD decay of no steps or one that
  // would begin before the warmup ends.
  void validate() const;
};

// optim.wsd_decay_steps, or when it is 0 the fraction of decay_steps (rounded, at
// least one step).
std::int64_t wsd_decay_length(std::int64_t wsd_decay_steps, double fraction, std::int64_t decay_steps);

// The rate for update number `step` (0-based): max_lr·(step+1)/warmup_steps during
// warmup (so the first update is not at zero); then under cosine
// min_lr + (max_lr - min_lr)·(1 + cos(π·(step - warmup)/(decay - warmup)))/2 until
// decay_steps; under WSD max_lr until S = decay_steps - wsd_decay_steps, then with
// p = (step - S)/wsd_decay_steps min_lr + (max_lr - min_lr)·(1 - p) (linear) or
// ·(1 - sqrt(p)) (1-sqrt); min_lr from decay_steps on.
double learning_rate(const LrSchedule& schedule, std::int64_t step);

}  // namespace dufu::trainer
