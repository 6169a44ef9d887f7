// AdamW: one fused kernel pass over the whole buffer (or shard), the weight decay
// switching at tensor boundaries (matrices decayed, biases and LayerNorm parameters not).
#include "dufu/trainer/model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "dufu/common/error.h"

namespace dufu::trainer {

AdamW::AdamW(std::vector<ParamTensor> layout, std::size_t num_parameters, AdamWOptions options, Device* device)
    : AdamW(std::move(layout), num_parameters, options, 0, num_parameters, device) {}

AdamW::AdamW(std::vector<ParamTensor> layout, std::size_t num_parameters, AdamWOptions options, std::size_t shard_begin,
             std::size_t shard_end, Device* device)
    : layout_(std::move(layout)),
      options_(options),
      shard_begin_(shard_begin),
      device_(device != nullptr ? device : &cpu_device()),
      m_(*device_, shard_end - std::min(shard_begin, shard_end)),
      v_(*device_, m_.size()) {
  DUFU_CHECK(shard_begin <= shard_end && shard_end <= num_parameters, "AdamW: shard [", shard_begin, ", ", shard_end,
             ") of ", num_parameters, " parameters");
  if (!(options.beta1 >= 0.0f && options.beta1 < 1.0f)) DUFU_FAIL("AdamW beta1 must be in [0, 1), got ", options.beta1);
  if (!(options.beta2 >= 0.0f && options.beta2 < 1.0f)) DUFU_FAIL("AdamW beta2 must be in [0, 1), got ", options.beta2);
  if (!(options.eps >= 0.0f)) DUFU_FAIL("AdamW eps must not be negative, got ", options.eps);
  if (!(options.weight_decay >= 0.0f)) DUFU_FAIL("AdamW weight decay must not be negative, got ", options.weight_decay);
  std::size_t next = 0;
  for (const ParamTensor& tensor : layout_) {
    DUFU_CHECK(tensor.offset == next, "AdamW: tensor ", tensor.name, " starts at ", tensor.offset, ", expected ", next);
    next += tensor.size();
  }
  DUFU_CHECK(next == num_parameters, "AdamW: the layout covers ", next, " of ", num_parameters, " parameters");
  // The parts of the tensors inside the shard, in the shard's own offsets; neighbours
  // with the same decay (wte and wpe, or every tensor when nothing decays) merge.
  for (const ParamTensor& tensor : layout_) {
    const std::size_t end = std::min(tensor.offset + tensor.size(), shard_end);
    if (end <= std::max(tensor.offset, shard_begin)) continue;
    const float decay = tensor.is_matrix ? options_.weight_decay : 0.0f;
    if (segments_.empty() || segments_.back().weight_decay != decay) segments_.push_back({0, decay});
    segments_.back().end = end - shard_begin;
  }
}

void AdamW::step(std::span<float> params, std::span<const float> grads, float lr, float grad_scale) {
  DUFU_CHECK(params.size() == m_.size() && grads.size() == m_.size(), "AdamW::step: ", params.size(), " parameters and ",
             grads.size(), " gradients for an optimizer of ", m_.size());
  ++step_count_;
  device_->kernels().adamw_update(params.data(), grads.data(), m_.data(), v_.data(), segments_, lr, options_.beta1,
                                  options_.beta2, options_.eps, static_cast<int>(step_count_), grad_scale);
}

void AdamW::set_step_count(std::int64_t steps) {
  if (steps < 0) DUFU_FAIL("AdamW step count must not be negative, got ", steps);
  step_count_ = steps;
}

double gradient_norm(std::span<const float> grads, Device& device) {
  return std::sqrt(device.kernels().sum_of_squares(grads.data(), grads.size()));
}

float gradient_clip_scale(double norm, double max_norm) {
  if (!(max_norm > 0.0 && std::isfinite(norm) && norm > max_norm)) return 1.0f;
  // torch.nn.utils.clip_grad_norm_'s factor, eps included.
  return static_cast<float>(max_norm / (norm + 1e-6));
}

double clip_gradient_norm(std::span<float> grads, double max_norm, Device& device) {
  const double norm = gradient_norm(grads, device);
  const float scale = gradient_clip_scale(norm, max_norm);
  // A factor that rounded to 1 would change nothing.
  if (scale != 1.0f) device.kernels().scale_in_place(grads.data(), scale, grads.size());
  return norm;
}

}  // namespace dufu::trainer
