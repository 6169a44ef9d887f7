// The GPT's side of the bf16 mixed-precision recipe (docs/architecture.md, "Mixed
// precision"): the precision knob, the working copy of the weights, the rounding
// points gpt.cc calls and the bf16 storage of the activations kept for the backward.
// Under fp32 every function here leaves the model's arithmetic exactly as it was.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "buffer_carver.h"
#include "dufu/common/error.h"
#include "dufu/trainer/gpt.h"

namespace dufu::trainer {

const char* precision_name(Precision precision) { return precision == Precision::kBf16 ? "bf16" : "fp32"; }

Precision parse_precision(std::string_view text, std::string_view knob) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  DUFU_FAIL(knob, " must be \"fp32\" or \"bf16\", got \"", text, "\"");
}

void GPT::set_precision(Precision precision) {
  const KernelTable& table = device_->kernels();
  if (precision == Precision::kBf16 &&
      (table.round_to_bf16 == nullptr || table.store_bf16 == nullptr || table.load_bf16 == nullptr)) {
    DUFU_FAIL("train.precision = bf16: the device ", device_->describe(),
              " has no bf16 rounding and storage kernels yet; HINT: use train.precision = fp32 on it");
  }
  // The slots' memory is laid out for one precision: a forward under the other would
  // find the activations of a backward still to come in the wrong place.
  if (precision != precision_) {
    for (ActivationSlot& slot : slots_) {
      slot.has_logits = false;
      slot.backward_pending = false;
    }
  }
  precision_ = precision;
  // Every kernel call of forward and backward goes through kernels_, so this one
  // pointer decides whether a GPU's matmuls take the recipe's operands as bf16.
  kernels_ = precision == Precision::kBf16 ? &device_->kernels_for_bf16_operands() : &device_->kernels();
  if (precision == Precision::kFp32) {
    working_weights_.reset();
    p_ = tensors(params_.span());
    return;
  }
  if (working_weights_.size() != params_.size()) working_weights_ = DeviceBuffer<float>(*device_, params_.size());
  p_ = tensors(working_weights_.span());
  working_weights_stale_ = true;
}

void GPT::round_if_bf16(float* values, std::size_t count, std::uint16_t* stored) const {
  if (precision_ != Precision::kBf16) return;
  if (stored != nullptr) {
    kernels_->store_bf16(stored, values, count);
  } else {
    kernels_->round_to_bf16(values, count);
  }
}

void GPT::refresh_working_weights() {
  if (precision_ != Precision::kBf16 || !working_weights_stale_) return;
  // A pure function of the masters: remaking it at any time gives the same bits, so a
  // resumed run (which saves and loads only the masters) computes what the
  // uninterrupted one did.
  device_->copy(working_weights_.data(), params_.data(), params_.size() * sizeof(float));
  kernels_->round_to_bf16(working_weights_.data(), working_weights_.size());
  working_weights_stale_ = false;
}

void GPT::residual_layernorm(float* residual_out, float* norm_out, float* mean, float* rstd, const float* residual,
                             const float* branch, const float* weight, const float* bias, int N, int C,
                             std::uint16_t* stored_residual_out, std::uint16_t* stored_norm_out) {
  const KernelTable& k = *kernels_;
  if (precision_ == Precision::kFp32) {
    k.residual_layernorm_forward(residual_out, norm_out, mean, rstd, residual, branch, weight, bias, N, C);
    return;
  }
  // The residual stream is stored in bf16, and the LayerNorm normalises what was
  // stored (as llm.c's fused kernel does), so its backward sees the same x.
  const std::size_t count = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
  k.add(residual_out, residual, branch, count);
  round_if_bf16(residual_out, count, stored_residual_out);
  k.layernorm_forward(norm_out, mean, rstd, residual_out, weight, bias, N, C);
  round_if_bf16(norm_out, count, stored_norm_out);
}

GPT::LayerSizes GPT::layer_sizes(std::size_t rows, std::size_t T) const {
  const std::size_t tp = static_cast<std::size_t>(tp_);
  const std::size_t C = static_cast<std::size_t>(config_.d_model);
  return {
      .stream = rows * C, .share = rows * (C / tp), .att = rows * (static_cast<std::size_t>(config_.n_head) / tp) * T};
}

void GPT::ensure_working_layer(int B, int T) {
  if (B <= working_capacity_b_ && T <= working_capacity_t_) return;
  working_capacity_b_ = std::max(B, working_capacity_b_);
  working_capacity_t_ = std::max(T, working_capacity_t_);
  const std::size_t N = static_cast<std::size_t>(working_capacity_b_) * static_cast<std::size_t>(working_capacity_t_);
  const std::size_t C = static_cast<std::size_t>(config_.d_model);
  detail::BufferCarver<float> carver;
  for_each_stored_tensor(
      layer_sizes(N, static_cast<std::size_t>(working_capacity_t_)),
      [&](std::size_t count, float*& tensor) { carver.want(tensor, count); }, working_);
  carver.want(working_.residual[0], N * C);
  carver.want(working_.residual[1], N * C);
  carver.allocate(*device_, working_memory_);
}

GPT::LayerActivations GPT::layer_activations(const ActivationSlot& slot, int l) const {
  LayerActivations layer = slot.acts.layers[static_cast<std::size_t>(l)];
  if (!slot.bf16_storage) return layer;
  for_each_stored_tensor(
      LayerSizes{}, [](std::size_t, float*& tensor, float* working) { tensor = working; }, layer, working_);
  // The stage's output stays in the slot (stage_output, the last LayerNorm's backward).
  if (l + 1 < stage_.num_layers) layer.residual_out = working_.residual[l % 2];
  return layer;
}

GPT::StoredLayerActivations GPT::stored_activations(const ActivationSlot& slot, int l) const {
  return slot.bf16_storage ? slot.acts.stored[static_cast<std::size_t>(l)] : StoredLayerActivations{};
}

void GPT::load_layer_activations(const ActivationSlot& slot, int l) {
  if (!slot.bf16_storage) return;
  const std::size_t rows = static_cast<std::size_t>(slot.batch_b) * static_cast<std::size_t>(slot.batch_t);
  const LayerSizes sizes = layer_sizes(rows, static_cast<std::size_t>(slot.batch_t));
  LayerActivations a = layer_activations(slot, l);
  StoredLayerActivations stored = slot.acts.stored[static_cast<std::size_t>(l)];
  const KernelTable& k = *kernels_;
  for_each_stored_tensor(
      sizes, [&](std::size_t count, float* tensor, const std::uint16_t* kept) { k.load_bf16(tensor, kept, count); }, a,
      stored);
  // The layer's input: the previous layer's output (layer 0's, the embedding, is fp32).
  if (l > 0) {
    k.load_bf16(layer_activations(slot, l - 1).residual_out,
                slot.acts.stored[static_cast<std::size_t>(l - 1)].residual_out, sizes.stream);
  }
}

}  // namespace dufu::trainer
