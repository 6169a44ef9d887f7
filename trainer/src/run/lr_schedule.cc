#include "dufu/trainer/run/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dufu/common/error.h"

namespace dufu::trainer {

void LrSchedule::validate() const {
  if (!(max_lr >= 0.0)) DUFU_FAIL("optim.lr must not be negative, got ", max_lr);
  if (!(min_lr >= 0.0)) DUFU_FAIL("optim.min_lr must not be negative, got ", min_lr);
  if (min_lr > max_lr) DUFU_FAIL("optim.min_lr (", min_lr, ") is above optim.lr (", max_lr, ")");
  if (warmup_steps < 0) DUFU_FAIL("optim.warmup_steps must not be negative, got ", warmup_steps);
  if (decay_steps < warmup_steps) {
    DUFU_FAIL("the learning-rate decay ends at step ", decay_steps, " (optim.decay_steps, or train.steps when 0), "
              "before the warmup of optim.warmup_steps = ", warmup_steps, " is over");
  }
  if (shape == LrShape::kCosine) return;
  if (wsd_decay_steps < 1) DUFU_FAIL("optim.schedule = wsd needs a decay of at least one step (optim.wsd_decay_steps)");
  if (decay_steps - wsd_decay_steps < warmup_steps) {
    DUFU_FAIL("the WSD decay of ", wsd_decay_steps, " steps (optim.wsd_decay_steps) would begin at step ",
              decay_steps - wsd_decay_steps, ", before the warmup of optim.warmup_steps = ", warmup_steps, " is over");
  }
}

std::int64_t wsd_decay_length(std::int64_t wsd_decay_steps, double fraction, std::int64_t decay_steps) {
  if (wsd_decay_steps > 0) return wsd_decay_steps;
  if (!(fraction > 0.0)) DUFU_FAIL("optim.wsd_decay_fraction must be above 0 under optim.schedule = wsd, got ", fraction);
  return std::max<std::int64_t>(1, std::llround(fraction * static_cast<double>(decay_steps)));
}

double learning_rate(const LrSchedule& schedule, std::int64_t step) {
  if (step < schedule.warmup_steps) {
    return schedule.max_lr * static_cast<double>(step + 1) / static_cast<double>(schedule.warmup_steps);
  }
  if (step >= schedule.decay_steps) return schedule.min_lr;
  if (schedule.shape != LrShape::kCosine) {
    const std::int64_t decay_start = schedule.decay_steps - schedule.wsd_decay_steps;
    if (step < decay_start) return schedule.max_lr;
    const double p = static_cast<double>(step - decay_start) / static_cast<double>(schedule.wsd_decay_steps);
    const double left = schedule.shape == LrShape::kWsdLinear ? 1.0 - p : 1.0 - std::sqrt(p);
    return schedule.min_lr + left * (schedule.max_lr - schedule.min_lr);
  }
  const double progress = static_cast<double>(step - schedule.warmup_steps) /
                          static_cast<double>(schedule.decay_steps - schedule.warmup_steps);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return schedule.min_lr + cosine * (schedule.max_lr - schedule.min_lr);
}

}  // namespace dufu::trainer
