// The GPT's side of the bf16 mixed-precision recipe (docs/architecture.md, "Mixed
// precision") and of activation recomputation: the precision and recompute knobs, the working copy of the weights, the rounding
// points gpt.cc calls and the bf16 storage of the activations kept for the backward.
// Under fp32 every function here leaves the model's arithmetic exactly as it was.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "device/buffer_carver.h"
#include "dufu/common/error.h"
#include "dufu/trainer/model/gpt.h"
#include "gpt_tensor_views.h"

namespace dufu::trainer {

const char* precision_name(Precision precision) { return precision == Precision::kBf16 ? "bf16" : "fp32"; }

Precision parse_precision(std::string_view text, std::string_view knob) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  DUFU_FAIL(knob, " must be \"fp32\" or \"bf16\", got \"", text, "\"");
}

const char* recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
    case Recompute::kNone: break;
  }
  return "none";
}

Recompute parse_recompute(std::string_view text, std::string_view knob) {
  for (const Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (text == recompute_name(recompute)) return recompute;
  }
  DUFU_FAIL(knob, " must be \"none\", \"selective\" or \"full\", got \"", text, "\"");
}

namespace {

bool has_bf16_kernels(const KernelTable& k) {
  return k.round_to_bf16 != nullptr && k.store_bf16 != nullptr && k.load_bf16 != nullptr && k.to_bf16 != nullptr;
}

}  // namespace

RecipeChoices GPT::recipe_choices(Precision precision, bool offload) const {
  return {.precision = precision,
          .attention_products = attention_products_,
          .optimizer_offload = offload,
          .zero_stage = storage_->parameters_whole() ? 0 : 3,
          .device_memory_is_host = device_ == &cpu_device()};
}

void GPT::apply_precision(Precision precision) {
  if (precision == Precision::kBf16 && !has_bf16_kernels(device_->kernels())) {
    DUFU_FAIL("train.precision = bf16: the device ", device_->describe(),
              " has no bf16 rounding and storage kernels yet; HINT: use train.precision = fp32 on it");
  }
  // Before any forward (the constructor's), so no activation slot is laid out for the
  // other precision yet.
  precision_ = precision;
  make_parameter_views();
  working_weights_stale_ = true;
}

void GPT::make_parameter_views() {
  if (precision_ == Precision::kFp32) {
    working_bits_.reset();
    working_vectors_.reset();
    vector_runs_.clear();
    p16_ = {};
    float* const memory = storage_->parameter_memory().data();
    p_ = tensor_views<float>(
        [&](const ParamTensor& tensor) { return memory + storage_->parameter_position(tensor.offset); });
    return;
  }
  const std::size_t memory_size = storage_->parameter_memory().size();
  if (working_bits_.size() != memory_size) working_bits_ = DeviceBuffer<std::uint16_t>(*device_, memory_size);
  p16_ = tensor_views<std::uint16_t>([&](const ParamTensor& tensor) {
    return working_bits_.data() + storage_->parameter_position(tensor.offset);
  });
  // The biases and LayerNorm parameters, packed in layout order, for the kernels that
  // take them as floats; a run joins the tensors that follow each other in the layout
  // within one part of it (the edges, or one layer: a storage may bring a layer at a
  // time).
  vector_runs_.clear();
  std::size_t vector_count = 0;
  for (const ParamTensor& tensor : layout_) {
    if (tensor.is_matrix) continue;
    const int part = layout_part(tensor.offset);
    if (!vector_runs_.empty() && vector_runs_.back().offset + vector_runs_.back().count == tensor.offset &&
        vector_runs_.back().part == part) {
      vector_runs_.back().count += tensor.size();
    } else {
      vector_runs_.push_back({part, tensor.offset, vector_count, tensor.size()});
    }
    vector_count += tensor.size();
  }
  if (working_vectors_.size() != vector_count) working_vectors_ = DeviceBuffer<float>(*device_, vector_count);
  std::size_t next_vector = 0;
  p_ = tensor_views<float>([&](const ParamTensor& tensor) -> float* {
    if (tensor.is_matrix) return nullptr;  // read from p16_ only
    float* vector = working_vectors_.data() + next_vector;
    next_vector += tensor.size();
    return vector;
  });
}

void GPT::offload_optimizer() {
  storage_->move_parameters(cpu_device());
  working_weights_stale_ = true;
}

void GPT::refresh_working_weights() {
  if (storage_->parameter_version() != working_weights_version_) working_weights_stale_ = true;
  if (precision_ != Precision::kBf16 || !working_weights_stale_) return;
  // A pure function of the masters: remaking it at any time gives the same bits, so a
  // resumed run (which saves and loads only the masters) computes what the
  // uninterrupted one did.
  const KernelTable& k = *kernels_;
  if (optimizer_offloaded()) {
    // The same rounding on the host, then one upload: the device never holds fp32 weights.
    const std::span<const float> params = storage_->parameter_memory();
    host_working_bits_.resize(params.size());
    parameter_device().kernels().to_bf16(host_working_bits_.data(), params.data(), params.size());
    device_->upload(working_bits_.data(), host_working_bits_.data(), params.size() * sizeof(std::uint16_t));
    for (const VectorRun& run : vector_runs_) {
      k.load_bf16(working_vectors_.data() + run.vector_offset, working_bits_.data() + run.offset, run.count);
    }
  } else {
    // A storage that brings layers one at a time may hold none in their place yet:
    // their copy is remade when one arrives (acquire_layer_parameters), and so are
    // their runs.
    refresh_working_range(0, storage_->parameter_memory().size(), INT_MIN);
  }
  working_weights_stale_ = false;
  working_weights_version_ = storage_->parameter_version();
}

void GPT::refresh_working_range(std::size_t position, std::size_t count, int part) {
  const KernelTable& k = *kernels_;
  k.to_bf16(working_bits_.data() + position, storage_->parameter_memory().data() + position, count);
  for (const VectorRun& run : vector_runs_) {
    if (part != INT_MIN && run.part != part) continue;
    k.load_bf16(working_vectors_.data() + run.vector_offset, working_bits_.data() + storage_->parameter_position(run.offset),
                run.count);
  }
}

TensorOut GPT::kept(float* values, std::uint16_t* stored) const {
  if (precision_ != Precision::kBf16) return values;
  return {values, ElementType::kBf16, stored};
}

// Under bf16 the residual stream is stored in bf16, and the norm normalises what was
// stored (as llm.c's fused kernel does), so its backward sees the same x: the fused
// kernel rounds the sum before the statistics, and the norm's output as it writes it.
void GPT::residual_layernorm(float* residual_out, float* norm_out, float* mean, float* rstd, const float* residual,
                             const float* branch, const float* weight, const float* bias, int N, int C,
                             std::uint16_t* stored_residual_out, std::uint16_t* stored_norm_out) {
  const KernelTable& k = *kernels_;
  const TensorOut residual_kept = kept(residual_out, stored_residual_out);
  const TensorOut norm_kept = kept(norm_out, stored_norm_out);
  if (config_.is_llama()) {
    k.residual_rmsnorm_forward(residual_kept, norm_kept, rstd, residual, branch, weight, config_.norm_eps, N, C);
  } else {
    k.residual_layernorm_forward(residual_kept, norm_kept, mean, rstd, residual, branch, weight, bias, N, C);
  }
}

GPT::LocalWidths GPT::local_widths() const {
  const int hs = config_.head_size();
  const int heads = config_.n_head / tp_;
  const int kv_heads = config_.kv_heads() / tp_;
  const int hidden = static_cast<int>(config_.mlp_hidden() / tp_);
  const bool llama = config_.is_llama();
  return {.qkv = (heads + 2 * kv_heads) * hs,
          .attn = heads * hs,
          .mlp_pre = llama ? 2 * hidden : hidden,
          .mlp_hidden = hidden,
          .heads = heads,
          .kv_heads = kv_heads,
          .head_size = hs};
}

GPT::LayerSizes GPT::layer_sizes(std::size_t rows) const {
  const LocalWidths widths = local_widths();
  const auto times = [rows](int width) { return rows * static_cast<std::size_t>(width); };
  return {.stream = times(config_.d_model),
          .qkv = times(widths.qkv),
          .attn = times(widths.attn),
          .mlp_pre = times(widths.mlp_pre),
          .mlp_hidden = times(widths.mlp_hidden)};
}

void GPT::ensure_working_layer(int B, int T) {
  if (precision_ == Precision::kBf16 && recompute_ != Recompute::kNone &&
      (B > working_stored_capacity_b_ || T > working_stored_capacity_t_ ||
       recompute_ != working_stored_recompute_)) {
    working_stored_capacity_b_ = std::max(B, working_stored_capacity_b_);
    working_stored_capacity_t_ = std::max(T, working_stored_capacity_t_);
    working_stored_recompute_ = recompute_;
    const std::size_t N =
        static_cast<std::size_t>(working_stored_capacity_b_) * static_cast<std::size_t>(working_stored_capacity_t_);
    detail::BufferCarver<std::uint16_t> carver;
    working_stored_ = {};
    for_each_tensor_recomputed(
        recompute_, layer_sizes(N),
        [&](std::size_t count, std::uint16_t*& tensor) { carver.want(tensor, count); }, working_stored_);
    carver.allocate(*device_, working_stored_memory_);
  }
  // Under bf16 a layer computes every stored tensor here, and the residual stream;
  // under fp32 only what recomputation drops.
  const bool whole_layer = precision_ == Precision::kBf16;
  if (B <= working_capacity_b_ && T <= working_capacity_t_ && whole_layer == working_whole_layer_ &&
      (whole_layer || recompute_ == working_recompute_)) {
    return;
  }
  working_capacity_b_ = std::max(B, working_capacity_b_);
  working_capacity_t_ = std::max(T, working_capacity_t_);
  working_whole_layer_ = whole_layer;
  working_recompute_ = recompute_;
  const std::size_t N = static_cast<std::size_t>(working_capacity_b_) * static_cast<std::size_t>(working_capacity_t_);
  const std::size_t C = static_cast<std::size_t>(config_.d_model);
  const LayerSizes sizes = layer_sizes(N);
  detail::BufferCarver<float> carver;
  const auto want = [&](std::size_t count, float*& tensor) { carver.want(tensor, count); };
  working_ = {};
  if (whole_layer) {
    for_each_stored_tensor(sizes, want, working_);
    carver.want(working_.residual[0], N * C);
    carver.want(working_.residual[1], N * C);
  } else {
    for_each_tensor_recomputed(recompute_, sizes, want, working_);
  }
  carver.allocate(*device_, working_memory_);
}

GPT::LayerActivations GPT::layer_activations(const ActivationSlot& slot, int l) const {
  LayerActivations layer = slot.acts.layers[static_cast<std::size_t>(l)];
  const auto to_working = [](std::size_t, float*& tensor, float* working) { tensor = working; };
  if (slot.bf16_storage) {
    for_each_stored_tensor(LayerSizes{}, to_working, layer, working_);
  } else {
    for_each_tensor_recomputed(slot.recompute, LayerSizes{}, to_working, layer, working_);
  }
  // The stage's output stays in the slot (stage_output, the last LayerNorm's backward),
  // and so does every layer's output under fp32 (recomputation starts from it).
  if (slot.bf16_storage && l + 1 < stage_.num_layers) layer.residual_out = working_.residual[l % 2];
  return layer;
}

GPT::StoredLayerActivations GPT::stored_activations(const ActivationSlot& slot, int l) const {
  if (!slot.bf16_storage) return StoredLayerActivations{};
  StoredLayerActivations stored = slot.acts.stored[static_cast<std::size_t>(l)];
  for_each_tensor_recomputed(
      slot.recompute, LayerSizes{},
      [](std::size_t, std::uint16_t*& tensor, std::uint16_t* working) { tensor = working; }, stored,
      working_stored_);
  return stored;
}

void GPT::load_layer_activations(const ActivationSlot& slot, int l) {
  if (!slot.bf16_storage) return;
  const std::size_t rows = static_cast<std::size_t>(slot.batch_b) * static_cast<std::size_t>(slot.batch_t);
  const LayerSizes sizes = layer_sizes(rows);
  const KernelTable& k = *kernels_;
  // What the fp32 kernels of the backward read (attention's q, k, v and output, the
  // LayerNorms, the GELU's derivative); the matmuls read ln_1, atty, ln_2 and fc_gelu
  // as bf16. Attention's lse stays fp32 in the slot. What recompute_layer makes again
  // it leaves in fp32 itself (a kept output leaves the rounded values behind): under full
  // recomputation everything but the input.
  if (slot.recompute != Recompute::kFull) {
    const LayerActivations a = layer_activations(slot, l);
    const StoredLayerActivations stored = stored_activations(slot, l);
    k.load_bf16(a.qkv, stored.qkv, sizes.qkv);
    k.load_bf16(a.atty, stored.atty, sizes.attn);
    k.load_bf16(a.residual_mid, stored.residual_mid, sizes.stream);
    if (slot.recompute == Recompute::kNone) k.load_bf16(a.fc_pre, stored.fc_pre, sizes.mlp_pre);
  }
  // The layer's input: the previous layer's output (layer 0's, the embedding, is fp32).
  if (l > 0) {
    k.load_bf16(layer_activations(slot, l - 1).residual_out,
                slot.acts.stored[static_cast<std::size_t>(l - 1)].residual_out, sizes.stream);
  }
}

}  // namespace dufu::trainer
