// The learning-rate schedule of GPT pretraining (GPT-3, Megatron, nanoGPT): linear
// warmup to the peak, then cosine decay to a floor, then the floor.
#pragma once

#include <cstdint>

#include "dufu/trainer/model/training_knobs.h"

namespace dufu::trainer {

// The defaults are the knob table's: optim.lr, optim.min_lr, optim.warmup_steps, and
// optim.decay_steps = 0, which is train.steps.
struct LrSchedule {
  double max_lr = training_knob_double<double>("optim.lr");
  double min_lr = training_knob_double<double>("optim.min_lr");
  std::int64_t warmup_steps = training_knob_int<std::int64_t>("optim.warmup_steps");
  // The step at which the cosine reaches min_lr (usually the run's total steps).
  std::int64_t decay_steps = training_knob_int<std::int64_t>("train.steps");
  // Throws dufu::Error naming the field: negative rates, min_lr > max_lr,
  // negative warmup, decay_steps < warmup_steps.
  void validate() const;
};

// The rate for update number `step` (0-based): max_lr·(step+1)/warmup_steps during
// warmup (so the first update is not at zero); then
// min_lr + (max_lr - min_lr)·(1 + cos(π·(step - warmup)/(decay - warmup)))/2 until
// decay_steps; min_lr from there on.
double learning_rate(const LrSchedule& schedule, std::int64_t step);

}  // namespace dufu::trainer
