// AdamW over a GPT's parameter buffer: the two moments live in buffers laid out like
// the parameters (so checkpoints can name them per tensor), and weight decay goes to
// the matrices only (ParamTensor::is_matrix: the linear weights, wte and wpe), never
// to biases or LayerNorm parameters, as in GPT-2, nanoGPT and Megatron.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/kernel_table.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/training_knobs.h"

namespace dufu::trainer {

// The defaults are the knob table's (training_knobs.h, optim.*).
struct AdamWOptions {
  float beta1 = training_knob_double<float>("optim.beta1");
  float beta2 = training_knob_double<float>("optim.beta2");
  float eps = training_knob_double<float>("optim.eps");
  float weight_decay = training_knob_double<float>("optim.weight_decay");
};

class AdamW {
 public:
  // Moments start at zero and step_count() at 0. Throws dufu::Error for a beta
  // outside [0, 1), a negative eps or weight decay, or a layout whose tensors do not
  // tile [0, num_parameters).
  // The moments live on `device` (null: the CPU device), which runs the update.
  AdamW(std::vector<ParamTensor> layout, std::size_t num_parameters, AdamWOptions options, Device* device = nullptr);
  // For a model: its layout, size and the device of its parameters (the host under
  // optim.offload = cpu, GPT::parameter_device).
  AdamW(const GPT& model, AdamWOptions options)
      : AdamW(model.parameter_tensors(), model.num_parameters(), options, &model.parameter_device()) {}
  // The optimizer of one shard [shard_begin, shard_end) of the parameters (ZeRO-1:
  // each data-parallel rank keeps the moments of its shard only and updates only
  // it); each tensor keeps its own weight decay where the shard cuts through it.
  AdamW(std::vector<ParamTensor> layout, std::size_t num_parameters, AdamWOptions options, std::size_t shard_begin,
        std::size_t shard_end, Device* device = nullptr);

  // One update of `params` from `grads` (each num_parameters() long: the shard's
  // elements for a shard optimizer) at learning rate `lr`; step_count() goes up by
  // one first, and bias correction uses it. The gradients are used multiplied by
  // grad_scale (gradient_clip_scale's factor, to clip in the same pass): the same bits
  // as clip_gradient_norm first.
  // Deterministic, same formula as torch.optim.AdamW.
  void step(std::span<float> params, std::span<const float> grads, float lr, float grad_scale = 1.0f);

  std::int64_t step_count() const { return step_count_; }
  // For loading a checkpoint: the count of steps the loaded moments have seen.
  void set_step_count(std::int64_t steps);
  // The parameters this optimizer updates: all of them, or its shard's.
  std::size_t num_parameters() const { return m_.size(); }
  std::size_t shard_begin() const { return shard_begin_; }
  const AdamWOptions& options() const { return options_; }
  const std::vector<ParamTensor>& layout() const { return layout_; }
  Device& device() const { return *device_; }
  // First and second moments, in the parameter layout, in device memory.
  std::span<float> m() { return m_.span(); }
  std::span<const float> m() const { return m_.span(); }
  std::span<float> v() { return v_.span(); }
  std::span<const float> v() const { return v_.span(); }

 private:
  std::vector<ParamTensor> layout_;
  AdamWOptions options_;
  std::size_t shard_begin_ = 0;
  // The shard's runs of equal weight decay, for the kernel's single pass.
  std::vector<AdamWSegment> segments_;
  Device* device_;
  DeviceBuffer<float> m_;
  DeviceBuffer<float> v_;
  std::int64_t step_count_ = 0;
};

// Global L2 norm of the gradients, accumulated in double in a fixed order.
// On `device`'s memory (the CPU's by default).
double gradient_norm(std::span<const float> grads, Device& device = cpu_device());
// The factor that brings gradients of norm `norm` down to max_norm, as
// torch.nn.utils.clip_grad_norm_ computes it (max_norm / (norm + 1e-6), as a float);
// 1 when max_norm <= 0 or the norm is already within it, or not finite.
float gradient_clip_scale(double norm, double max_norm);
// Scales the gradients by gradient_clip_scale (their norm is then at most max_norm);
// returns the norm before.
double clip_gradient_norm(std::span<float> grads, double max_norm, Device& device = cpu_device());

}  // namespace dufu::trainer
