// GPT-2 on a device's kernel table: the model's buffers, forward and backward, serial
// or tensor parallel, whole or one pipeline stage. The forward and backward are deliberately one flat
// sequence of kernel calls per layer, so each line can be matched against the PyTorch
// reference module; tensor parallelism only changes the sizes the kernels get (this
// rank's heads, hidden units and vocabulary) and adds the all-reduces between them.
// A pipeline stage runs the same sequence over its own layers, starting from the
// previous stage's output instead of the embedding and stopping before ln_f unless it
// is the last stage.
#include "dufu/trainer/model/gpt.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <utility>

#include "device/buffer_carver.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "gpt_tensor_runs.h"
#include "gpt_tensor_views.h"

namespace dufu::trainer {

using detail::check_buffer_sizes;
using detail::for_each_run;
using detail::real_rows;

using BufferCarver = detail::BufferCarver<float>;

GPT::GPT(const GPTConfig& config, Communicator* tensor_group, const PipelineStage& stage, Device* device,
         const GPTRecipe& recipe)
    : config_(config),
      device_(device != nullptr ? device : &cpu_device()),
      kernels_(&device_->kernels()),
      stage_(resolve_pipeline_stage(config, stage)),
      tensor_group_(tensor_group != nullptr && tensor_group->size() > 1 ? tensor_group : nullptr),
      tp_(tensor_group_ != nullptr ? tensor_group_->size() : 1),
      tp_rank_(tensor_group_ != nullptr ? tensor_group_->rank() : 0),
      layout_(gpt_stage_layout(config, gpt_parameter_layout(config, tp_), stage_)),
      full_layout_(tp_ > 1 ? gpt_stage_layout(config, gpt_parameter_layout(config), stage_) : layout_),
      num_parameters_(gpt_layout_size(layout_)),
      storage_(std::make_unique<WholeParameterStorage>(storage_shape_with(*device_))),
      p_(tensors(storage_->parameter_memory())) {
  if (tensor_group_ != nullptr && tensor_group_->memory_space() != device_->memory_space()) {
    DUFU_FAIL("GPT: the tensor group ", tensor_group_->describe(), " moves ",
              memory_space_name(tensor_group_->memory_space()), " but the model's device ", device_->describe(),
              " holds ", memory_space_name(device_->memory_space()),
              "; HINT: use the communicator made for that device (MPI for the cpu device)");
  }
  const KernelTable& k = *kernels_;
  if (config_.is_llama() && (k.rmsnorm_forward == nullptr || k.residual_rmsnorm_forward == nullptr ||
                             k.rmsnorm_backward == nullptr || k.rotary_forward == nullptr ||
                             k.rotary_backward == nullptr || k.swiglu_forward == nullptr ||
                             k.swiglu_backward == nullptr)) {
    DUFU_FAIL("model.arch = llama: the device ", device_->describe(),
              " lacks the Llama-family kernels (RMSNorm, rotary, SwiGLU)");
  }
  // The recipe, fixed for the model's life: the rule book judges it whole (this
  // model's device, its storage whole), then its parts go in, in the one order that
  // holds: the precision's parameter views, then offload, which moves the masters to
  // the host under the bf16 working copy. The defaults are the members' own.
  attention_products_ = recipe.attention_products;
  recompute_ = recipe.recompute;
  check_recipe(recipe_choices(recipe.precision, recipe.optimizer_offload));
  if (recipe.precision != precision_) apply_precision(recipe.precision);
  if (recipe.optimizer_offload) offload_optimizer();
}

std::size_t GPT::num_full_parameters() const { return gpt_layout_size(full_layout_); }

std::vector<float> GPT::gather_full(std::span<const float> local) const {
  std::vector<float> full(num_full_parameters(), 0.0f);
  check_buffer_sizes("GPT::gather_full", full.size(), full.size(), local.size(), num_parameters_);
  std::vector<float> pieces;  // one tensor's pieces from every rank, in rank order
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const ParamTensor& piece = layout_[i];
    const ParamTensor& whole = full_layout_[i];
    const std::span<const float> mine = local.subspan(piece.offset, piece.size());
    if (tp_ == 1 || piece.split == TensorSplit::kReplicated) {
      std::copy(mine.begin(), mine.end(), full.begin() + static_cast<std::ptrdiff_t>(whole.offset));
      continue;
    }
    pieces.resize(piece.size() * static_cast<std::size_t>(tp_));
    tensor_group_->all_gather(mine, pieces);
    for (int rank = 0; rank < tp_; ++rank) {
      const float* from = pieces.data() + static_cast<std::size_t>(rank) * piece.size();
      for_each_run(piece, whole, tp_, rank, real_rows(whole, config_),
                   [&](std::size_t local_offset, std::size_t full_offset, std::size_t count) {
                     std::copy_n(from + local_offset, count, full.data() + whole.offset + full_offset);
                   });
    }
  }
  return full;
}

void GPT::shard_full(std::span<const float> full, std::span<float> local) const {
  if (tp_ == 1) {
    check_buffer_sizes("GPT::shard_full", full.size(), num_parameters_, local.size(), num_parameters_);
    std::copy(full.begin(), full.end(), local.begin());
    return;
  }
  // full_layout_ is the stage's part of the serial layout, tensor for tensor with
  // layout_.
  check_buffer_sizes("GPT::shard_full", full.size(), num_full_parameters(), local.size(), num_parameters_);
  std::fill(local.begin(), local.end(), 0.0f);  // wte's padding rows
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const ParamTensor& piece = layout_[i];
    const ParamTensor& whole = full_layout_[i];
    for_each_run(piece, whole, tp_, tp_rank_, real_rows(whole, config_),
                 [&](std::size_t local_offset, std::size_t full_offset, std::size_t count) {
                   std::copy_n(full.data() + whole.offset + full_offset, count,
                               local.data() + piece.offset + local_offset);
                 });
  }
}

void GPT::load_full_parameters(std::span<const float> full) {
  std::vector<float> host(num_parameters());
  shard_full(full, host);
  upload_parameters(host);
}

double GPT::full_sum_of_squares(std::span<const float> local) const {
  if (local.size() != num_parameters_) {
    DUFU_FAIL("GPT::full_sum_of_squares: buffer of ", local.size(), " floats, the parameters need ", num_parameters_);
  }
  if (tp_ == 1 && !stage_.holds_wte_copy()) return kernels_->sum_of_squares(local.data(), local.size());
  // Replicated tensors are identical on every rank, so each rank adds them up alone
  // and gets the same sum; the pieces of split tensors are summed over the group.
  double replicated = 0.0;
  double split = 0.0;
  for (const ParamTensor& tensor : layout_) {
    if (stage_.holds_wte_copy() && tensor.name == "wte.weight") continue;  // counted on the first stage
    const double sum = kernels_->sum_of_squares(local.data() + tensor.offset, tensor.size());
    (tensor.split == TensorSplit::kReplicated ? replicated : split) += sum;
  }
  return replicated + (tp_ > 1 ? tensor_group_->all_reduce_value(split) : split);
}

void GPT::reduce_over_tensor_group(float* data, std::size_t count) {
  if (tensor_group_ != nullptr) tensor_group_->all_reduce(std::span<float>(data, count));
}

const ParamTensor& GPT::tensor(std::string_view name) const {
  for (const ParamTensor& tensor : layout_) {
    if (tensor.name == name) return tensor;
  }
  DUFU_FAIL("GPT has no parameter tensor named '", name, "'; HINT: names follow HuggingFace's GPT2Model, ",
            "e.g. wte.weight, h.0.attn.c_attn.weight, ln_f.bias");
}

GPTTensors GPT::tensors(std::span<float> buffer) const {
  if (buffer.size() != num_parameters_) {
    DUFU_FAIL("GPT::tensors: buffer of ", buffer.size(), " floats, the parameters need ", num_parameters_);
  }
  return tensor_views<float>([&](const ParamTensor& tensor) { return buffer.data() + tensor.offset; });
}

void GPT::check_batch(std::span<const std::int32_t> tokens, std::span<const float> input,
                      std::span<const std::int32_t> targets, const BatchDocuments& documents, int B, int T) const {
  if (B <= 0 || T <= 0) DUFU_FAIL("GPT::forward: batch ", B, " x ", T, " must have positive sizes");
  if (T > config_.seq_length) {
    DUFU_FAIL("GPT::forward: sequence of ", T, " positions, the model has ", config_.seq_length,
              "; HINT: raise seq_length or shorten the batch");
  }
  const std::size_t rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  if (rows > static_cast<std::size_t>(INT_MAX)) DUFU_FAIL("GPT::forward: batch ", B, " x ", T, " overflows int");
  if (stage_.is_first()) {
    if (tokens.size() != rows) DUFU_FAIL("GPT::forward: ", tokens.size(), " tokens for a batch of ", B, " x ", T);
    if (!input.empty()) DUFU_FAIL("GPT::forward_stage: the first pipeline stage takes tokens, not an input");
  } else {
    if (!tokens.empty()) {
      DUFU_FAIL("GPT::forward_stage: pipeline stage ", stage_.stage, " takes the previous stage's output, not tokens");
    }
    const std::size_t want = rows * static_cast<std::size_t>(config_.d_model);
    if (input.size() != want) {
      DUFU_FAIL("GPT::forward_stage: pipeline stage ", stage_.stage, " got an input of ", input.size(),
                " floats for a batch of ", B, " x ", T, " x ", config_.d_model, " (", want, ")");
    }
  }
  if (!targets.empty() && !stage_.is_last()) {
    DUFU_FAIL("GPT::forward_stage: pipeline stage ", stage_.stage, " of ", stage_.num_stages,
              " has no LM head; HINT: pass the targets to the last stage only");
  }
  if (!targets.empty() && targets.size() != rows) {
    DUFU_FAIL("GPT::forward: ", targets.size(), " targets for a batch of ", B, " x ", T);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      DUFU_FAIL("GPT::forward: token ", tokens[i], " at position ", i, " is outside the vocabulary [0, ",
                config_.vocab_size, "); HINT: the tokenizer and the model's vocab_size must agree");
    }
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < -1 || targets[i] >= config_.vocab_size) {
      DUFU_FAIL("GPT::forward: target ", targets[i], " at position ", i, " is neither -1 (ignored) nor in [0, ",
                config_.vocab_size, ")");
    }
  }
  check_documents(documents, B, T);
}

void GPT::require_whole_model(const char* operation) const {
  if (stage_.num_stages != 1) {
    DUFU_FAIL(operation, ": this GPT is pipeline stage ", stage_.stage, " of ", stage_.num_stages,
              "; HINT: run a stage with forward_stage and backward_stage (pipeline_schedule.h)");
  }
}

GPT::ActivationSlot& GPT::activation_slot(int slot) {
  if (slot < 0) DUFU_FAIL("GPT: activation slot ", slot, " is negative");
  if (static_cast<std::size_t>(slot) >= slots_.size()) slots_.resize(static_cast<std::size_t>(slot) + 1);
  return slots_[static_cast<std::size_t>(slot)];
}

int GPT::activation_slots() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const ActivationSlot& slot) { return !slot.memory.empty(); }));
}

void GPT::ensure_activations(ActivationSlot& slot, int B, int T) {
  const bool bf16_storage = precision_ == Precision::kBf16;
  if (bf16_storage || recompute_ != Recompute::kNone) ensure_working_layer(B, T);
  if (B <= slot.capacity_b && T <= slot.capacity_t && bf16_storage == slot.bf16_storage &&
      recompute_ == slot.recompute) {
    return;
  }
  slot.bf16_storage = bf16_storage;
  slot.recompute = recompute_;
  slot.capacity_b = std::max(B, slot.capacity_b);
  slot.capacity_t = std::max(T, slot.capacity_t);
  const std::size_t N = static_cast<std::size_t>(slot.capacity_b) * static_cast<std::size_t>(slot.capacity_t);
  const std::size_t C = static_cast<std::size_t>(config_.d_model);
  // This rank's share: channels of its heads, its heads, hidden units, vocabulary.
  const LayerSizes sizes = layer_sizes(N);
  // RMSNorm keeps no mean.
  const std::size_t mean_size = config_.is_llama() ? 0 : N;
  const std::size_t lse_size = N * static_cast<std::size_t>(config_.n_head) / static_cast<std::size_t>(tp_);
  const std::size_t Vl = static_cast<std::size_t>(local_vocab_size());

  Activations& acts = slot.acts;
  BufferCarver carver;
  detail::BufferCarver<std::uint16_t> stored_carver;
  acts.layers.assign(static_cast<std::size_t>(stage_.num_layers), LayerActivations{});
  acts.stored.assign(bf16_storage ? acts.layers.size() : 0, StoredLayerActivations{});
  carver.want(acts.encoded, N * C);  // the embedding, or the previous stage's output
  for (std::size_t l = 0; l < acts.layers.size(); ++l) {
    LayerActivations& layer = acts.layers[l];
    if (mean_size > 0) carver.want(layer.ln_1_mean, mean_size);
    carver.want(layer.ln_1_rstd, N);
    if (mean_size > 0) carver.want(layer.ln_2_mean, mean_size);
    carver.want(layer.ln_2_rstd, N);
    carver.want(layer.lse, lse_size);
    const bool is_output = l + 1 == acts.layers.size();
    if (is_output) carver.want(layer.residual_out, N * C);
    // What recomputation drops is the working layer's (layer_activations,
    // stored_activations); every layer keeps its output, the next layer's input.
    if (bf16_storage) {
      StoredLayerActivations& stored = acts.stored[l];
      for_each_tensor_kept(
          recompute_, sizes, [&](std::size_t count, std::uint16_t*& tensor) { stored_carver.want(tensor, count); },
          stored);
      if (!is_output) stored_carver.want(stored.residual_out, N * C);
      continue;
    }
    for_each_tensor_kept(
        recompute_, sizes, [&](std::size_t count, float*& tensor) { carver.want(tensor, count); }, layer);
    if (!is_output) carver.want(layer.residual_out, N * C);
  }
  acts.ln_f_bits = nullptr;
  acts.logits_bits = nullptr;
  if (stage_.is_last() && bf16_storage) {
    stored_carver.want(acts.ln_f_bits, N * C);
    stored_carver.want(acts.logits_bits, N * Vl);
  }
  acts.ln_f_mean = nullptr;
  if (stage_.is_last()) {
    carver.want(acts.ln_f, N * C);
    if (mean_size > 0) carver.want(acts.ln_f_mean, mean_size);
    carver.want(acts.ln_f_rstd, N);
    carver.want(acts.logits, N * Vl);
    carver.want(acts.losses, N);
  }
  carver.want(acts.branch, N * C);
  carver.allocate(*device_, slot.memory);
  if (bf16_storage) {
    stored_carver.allocate(*device_, slot.stored_memory);
  } else {
    slot.stored_memory.reset();
  }
  slot.tokens = DeviceBuffer<std::int32_t>(*device_, N);
  slot.targets = DeviceBuffer<std::int32_t>(*device_, N);
  slot.positions = {};
  slot.document_starts = {};
  slot.loss = DeviceBuffer<float>(*device_, 1);
  slot.has_logits = false;
  slot.backward_pending = false;
}

void GPT::ensure_activation_grads(int B, int T) {
  const bool bf16 = precision_ == Precision::kBf16;
  if (B <= grad_capacity_b_ && T <= grad_capacity_t_ && bf16 == activation_grads_bf16_) return;
  activation_grads_bf16_ = bf16;
  grad_capacity_b_ = std::max(B, grad_capacity_b_);
  grad_capacity_t_ = std::max(T, grad_capacity_t_);
  const std::size_t N = static_cast<std::size_t>(grad_capacity_b_) * static_cast<std::size_t>(grad_capacity_t_);
  const LayerSizes sizes = layer_sizes(N);

  BufferCarver carver;
  dacts_ = {};
  carver.want(dacts_.residual, sizes.stream);
  carver.want(dacts_.ln, sizes.stream);
  carver.want(dacts_.atty, sizes.attn);
  carver.want(dacts_.qkv, sizes.qkv);
  carver.want(dacts_.fc_pre, sizes.mlp_pre);
  if (config_.is_llama()) carver.want(dacts_.fc_hidden, sizes.mlp_hidden);
  carver.allocate(*device_, activation_grad_memory_);
  if (!bf16) {
    activation_grad_bits_memory_.reset();
    return;
  }
  detail::BufferCarver<std::uint16_t> bits_carver;
  bits_carver.want(dacts_.residual_bits, sizes.stream);
  bits_carver.want(dacts_.qkv_bits, sizes.qkv);
  bits_carver.want(dacts_.fc_pre_bits, sizes.mlp_pre);
  bits_carver.allocate(*device_, activation_grad_bits_memory_);
}

float GPT::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T) {
  const auto counted = std::count_if(targets.begin(), targets.end(), [](std::int32_t t) { return t != -1; });
  return forward(tokens, targets, B, T, 1.0f / static_cast<float>(std::max<std::ptrdiff_t>(counted, 1)));
}

float GPT::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T,
                   float dloss_scale, const BatchDocuments& documents) {
  require_whole_model("GPT::forward");
  return forward_stage(0, tokens, {}, targets, B, T, dloss_scale, documents);
}

void GPT::forward_keeping_loss(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B,
                               int T, float dloss_scale, const BatchDocuments& documents) {
  require_whole_model("GPT::forward_keeping_loss");
  forward_on_device(0, tokens, {}, targets, B, T, dloss_scale, documents, true);
}

void GPT::forward_stage_keeping_loss(int slot, std::span<const std::int32_t> tokens, std::span<const float> input,
                                     std::span<const std::int32_t> targets, int B, int T, float dloss_scale,
                                     const BatchDocuments& documents) {
  forward_on_device(slot, tokens, input, targets, B, T, dloss_scale, documents, true);
}

float GPT::forward_stage(int slot, std::span<const std::int32_t> tokens, std::span<const float> input,
                         std::span<const std::int32_t> targets, int B, int T, float dloss_scale,
                         const BatchDocuments& documents) {
  const float* loss_on_device = forward_on_device(slot, tokens, input, targets, B, T, dloss_scale, documents, false);
  float loss = std::numeric_limits<float>::quiet_NaN();
  if (loss_on_device != nullptr) device_->download(&loss, loss_on_device, sizeof(float));
  return loss;
}

std::vector<float> GPT::read_kept_losses() {
  std::vector<float> losses(kept_loss_count_);
  if (!losses.empty()) device_->download(losses.data(), kept_losses_.data(), losses.size() * sizeof(float));
  kept_loss_count_ = 0;
  return losses;
}

const float* GPT::forward_on_device(int slot_index, std::span<const std::int32_t> tokens, std::span<const float> input,
                                    std::span<const std::int32_t> targets, int B, int T, float dloss_scale,
                                    const BatchDocuments& documents, bool keep_loss) {
  check_batch(tokens, input, targets, documents, B, T);
  if (!std::isfinite(dloss_scale)) DUFU_FAIL("GPT::forward: dloss_scale ", dloss_scale, " is not finite");
  ActivationSlot& slot = activation_slot(slot_index);
  ensure_activations(slot, B, T);
  refresh_working_weights();
  Activations& acts = slot.acts;
  const KernelTable& k = *kernels_;
  // The batch goes to the device once; everything below runs there.
  if (stage_.is_first()) slot.tokens.upload(tokens);
  if (!targets.empty()) slot.targets.upload(targets);
  upload_documents(slot, documents);
  const std::int32_t* device_tokens = slot.tokens.data();
  const std::int32_t* device_targets = slot.targets.data();
  slot.batch_b = B;
  slot.batch_t = T;
  const int N = B * T;
  const int C = config_.d_model;
  const int L = stage_.num_layers;
  // This rank's share (all of it when serial): hidden units of the MLP, columns of
  // the vocabulary.
  const int Fl = local_widths().mlp_hidden;
  const int Vl = local_vocab_size();
  const std::size_t rows = static_cast<std::size_t>(N);
  const std::size_t stream = rows * static_cast<std::size_t>(C);  // floats of an [N, C] activation

  // Tensor parallel, two kinds of linear layer (Megatron-LM): column-parallel c_attn
  // and c_fc take the whole (replicated) LayerNorm output and produce this rank's
  // heads or hidden units; row-parallel c_proj turn those into a partial sum of the
  // [N, C] output, which an all-reduce completes. The c_proj bias joins on rank 0
  // only, so the sum adds it once; likewise wpe in the vocab-parallel embedding.
  const bool adds_replicated = tp_rank_ == 0;
  // Under bf16 each activation is kept in bf16 (rounded, its bits stored where the
  // backward reads them) by the kernel that computes it: the table in
  // docs/architecture.md. A later stage's input was kept by the stage that sent it.
  if (!stage_.is_first()) {
    device_->copy(acts.encoded, input.data(), input.size_bytes());
  } else {
    embed(kept_before_reduction(acts.encoded), device_tokens, slot.device_positions(), adds_replicated, B, T, C);
    reduce_and_keep(acts.encoded, stream);
  }
  acquire_layer_parameters(0);  // the storage may bring each layer's before its first use
  const LayerActivations first = layer_activations(slot, 0);
  norm_forward(kept(first.ln_1, stored_activations(slot, 0).ln_1), first.ln_1_mean, first.ln_1_rstd, acts.encoded,
               p_.h[0].ln_1_weight, p_.h[0].ln_1_bias, N, C);
  for (int l = 0; l < L; ++l) {
    const GPTLayerTensors& w = p_.h[static_cast<std::size_t>(l)];
    const BasicGPTLayerTensors<std::uint16_t> w16 =
        p16_.h.empty() ? BasicGPTLayerTensors<std::uint16_t>{} : p16_.h[static_cast<std::size_t>(l)];
    const LayerActivations a = layer_activations(slot, l);
    const StoredLayerActivations stored = stored_activations(slot, l);
    // This layer's parameters here, the next layer's on their way while it runs.
    acquire_layer_parameters(l);
    storage_->expect_layer(l + 1);

    forward_layer_body(slot, l);
    linear_forward(kept_before_reduction(acts.branch), {a.fc_gelu, stored.fc_gelu},
                   {w.mlp_c_proj_weight, w16.mlp_c_proj_weight}, adds_replicated ? w.mlp_c_proj_bias : nullptr, N, Fl,
                   C);
    reduce_and_keep(acts.branch, stream);

    // The block's output goes straight into the next LayerNorm: the next layer's
    // ln_1, or ln_f after the model's last layer. A stage before the last ends in the
    // plain residual add; the next stage's first ln_1 normalises it.
    if (l + 1 < L) {
      acquire_layer_parameters(l + 1);  // its LayerNorm is fused into this add
      const GPTLayerTensors& next_w = p_.h[static_cast<std::size_t>(l + 1)];
      const LayerActivations next_a = layer_activations(slot, l + 1);
      residual_layernorm(a.residual_out, next_a.ln_1, next_a.ln_1_mean, next_a.ln_1_rstd, a.residual_mid, acts.branch,
                         next_w.ln_1_weight, next_w.ln_1_bias, N, C, stored.residual_out,
                         stored_activations(slot, l + 1).ln_1);
    } else if (stage_.is_last()) {
      residual_layernorm(a.residual_out, acts.ln_f, acts.ln_f_mean, acts.ln_f_rstd, a.residual_mid, acts.branch,
                         p_.ln_f_weight, p_.ln_f_bias, N, C, nullptr, acts.ln_f_bits);
    } else {
      k.add(kept(a.residual_out, nullptr), a.residual_mid, acts.branch, stream);
    }
  }
  if (!stage_.is_last()) {
    slot.has_logits = false;
    slot.backward_pending = true;
    return nullptr;
  }
  // The LM head (tied: wte): this rank's rows of it give its columns of the logits.
  linear_forward(acts.logits, {acts.ln_f, acts.ln_f_bits}, head_weights(), nullptr, N, C, Vl);

  if (targets.empty()) {
    slot.has_logits = true;
    slot.backward_pending = false;
    return nullptr;
  }
  const int V = config_.vocab_size;
  if (tp_ == 1) {
    // The gradient kept in bf16 under bf16, with the bits the LM head's backward reads.
    k.classifier_forward_backward(kept(acts.logits, acts.logits_bits), acts.losses, device_targets, dloss_scale, N, V,
                                  Vl);
  } else {
    // Vocab-parallel cross-entropy: the ranks combine row maxima, then sums of exp
    // and the target logits (2N numbers per all-reduce), never the logits themselves.
    if (row_max_.size() < rows) {
      row_max_ = DeviceBuffer<float>(*device_, rows);
      row_stats_ = DeviceBuffer<double>(*device_, 2 * rows);
    }
    const std::span<float> row_max = row_max_.span().first(rows);
    const std::span<double> row_stats = row_stats_.span().first(2 * rows);
    k.vocab_parallel_classifier_max(row_max.data(), acts.logits, device_targets, N, V, vocab_begin(), Vl);
    tensor_group_->all_reduce(row_max, ReduceOp::kMax);
    k.vocab_parallel_classifier_exp_sum(row_stats.data(), acts.logits, row_max.data(), device_targets, N, V,
                                        vocab_begin(), Vl);
    tensor_group_->all_reduce(row_stats);
    // The gradient kept in bf16, as the serial classifier keeps it.
    k.vocab_parallel_classifier_finish(kept(acts.logits, acts.logits_bits), acts.losses, row_stats.data(),
                                       row_max.data(), device_targets, dloss_scale, N, V, vocab_begin(), Vl);
  }
  slot.has_logits = false;
  slot.backward_pending = true;
  float* loss = slot.loss.data();
  if (keep_loss) {
    if (kept_loss_count_ == kept_losses_.size()) {
      // Grown in the stream's order: the copy runs after the losses it copies are made.
      DeviceBuffer<float> grown(*device_, std::max<std::size_t>(8, 2 * kept_losses_.size()));
      if (kept_loss_count_ > 0) device_->copy(grown.data(), kept_losses_.data(), kept_loss_count_ * sizeof(float));
      kept_losses_ = std::move(grown);
    }
    loss = kept_losses_.data() + kept_loss_count_++;
  }
  k.masked_mean_loss(loss, acts.losses, device_targets, N);
  return loss;
}

void GPT::forward_layer_body(const ActivationSlot& slot, int l) {
  const int B = slot.batch_b;
  const int T = slot.batch_t;
  const int N = B * T;
  const int C = config_.d_model;
  const LocalWidths widths = local_widths();
  const LayerSizes sizes = layer_sizes(static_cast<std::size_t>(N));
  const std::size_t stream = sizes.stream;
  const bool adds_replicated = tp_rank_ == 0;
  const KernelTable& k = *kernels_;
  const Activations& acts = slot.acts;
  const GPTLayerTensors& w = p_.h[static_cast<std::size_t>(l)];
  const BasicGPTLayerTensors<std::uint16_t> w16 =
      p16_.h.empty() ? BasicGPTLayerTensors<std::uint16_t>{} : p16_.h[static_cast<std::size_t>(l)];
  const LayerActivations a = layer_activations(slot, l);
  const StoredLayerActivations stored = stored_activations(slot, l);
  const float* residual_in = l == 0 ? acts.encoded : layer_activations(slot, l - 1).residual_out;

  // The local qkv is [q, k, v] of this rank's heads (and K/V heads), so attention
  // runs unchanged on them. Llama turns q and k by their positions first (and keeps
  // them turned); the attention's backward then gives the gradient of the turned q and
  // k. Under bf16 each tensor is kept (rounded, its bf16 copy stored) by the kernel
  // that computes it (the table in docs/architecture.md).
  if (config_.is_llama()) {
    linear_forward(a.qkv, {a.ln_1, stored.ln_1}, {w.attn_c_attn_weight, w16.attn_c_attn_weight}, w.attn_c_attn_bias,
                   N, C, widths.qkv);
    k.rotary_forward(kept(a.qkv, stored.qkv), slot.device_positions(), B, T, widths.heads, widths.kv_heads,
                     widths.head_size, config_.rope_theta);
  } else {
    linear_forward(kept(a.qkv, stored.qkv), {a.ln_1, stored.ln_1}, {w.attn_c_attn_weight, w16.attn_c_attn_weight},
                   w.attn_c_attn_bias, N, C, widths.qkv);
  }
  storage_->progress();
  k.attention_forward(kept(a.atty, stored.atty), a.lse, attention_input({a.qkv, stored.qkv}),
                      slot.device_document_starts(), B, T, widths.heads, widths.kv_heads, widths.head_size);
  storage_->progress();
  linear_forward(kept_before_reduction(acts.branch), {a.atty, stored.atty},
                 {w.attn_c_proj_weight, w16.attn_c_proj_weight}, adds_replicated ? w.attn_c_proj_bias : nullptr, N,
                 widths.attn, C);
  reduce_and_keep(acts.branch, stream);
  residual_layernorm(a.residual_mid, a.ln_2, a.ln_2_mean, a.ln_2_rstd, residual_in, acts.branch, w.ln_2_weight,
                     w.ln_2_bias, N, C, stored.residual_mid, stored.ln_2);

  forward_mlp_hidden(slot, l);
}

void GPT::forward_mlp_hidden(const ActivationSlot& slot, int l) {
  const int N = slot.batch_b * slot.batch_t;
  const int C = config_.d_model;
  const LocalWidths widths = local_widths();
  const GPTLayerTensors& w = p_.h[static_cast<std::size_t>(l)];
  const BasicGPTLayerTensors<std::uint16_t> w16 =
      p16_.h.empty() ? BasicGPTLayerTensors<std::uint16_t>{} : p16_.h[static_cast<std::size_t>(l)];
  const LayerActivations a = layer_activations(slot, l);
  const StoredLayerActivations stored = stored_activations(slot, l);
  if (config_.is_llama()) {
    // fc_pre holds the fused gate and up projections, fc_gelu silu(gate) * up.
    linear_forward(kept(a.fc_pre, stored.fc_pre), {a.ln_2, stored.ln_2}, {w.mlp_c_fc_weight, w16.mlp_c_fc_weight},
                   nullptr, N, C, widths.mlp_pre);
    kernels_->swiglu_forward(kept(a.fc_gelu, stored.fc_gelu), a.fc_pre, N, widths.mlp_hidden);
    return;
  }
  // Bias and GELU fused into the matmul (a GPU's epilogue): only fc_pre and fc_gelu
  // are stored, so the product before the bias is never rounded.
  linear_bias_gelu_forward(kept(a.fc_gelu, stored.fc_gelu), kept(a.fc_pre, stored.fc_pre), {a.ln_2, stored.ln_2},
                           {w.mlp_c_fc_weight, w16.mlp_c_fc_weight}, w.mlp_c_fc_bias, N, C, widths.mlp_pre);
}

void GPT::recompute_layer(const ActivationSlot& slot, int l) {
  // Selective: the MLP's hidden values again from the ln_2 it kept.
  if (slot.recompute == Recompute::kSelective) {
    forward_mlp_hidden(slot, l);
    return;
  }
  const int N = slot.batch_b * slot.batch_t;
  const int C = config_.d_model;
  const LayerActivations a = layer_activations(slot, l);
  // The forward made layer l's ln_1 in the previous layer's fused residual add (or
  // from the embedding): the same normalisation of the same stored input.
  const float* residual_in = l == 0 ? slot.acts.encoded : layer_activations(slot, l - 1).residual_out;
  const GPTLayerTensors& w = p_.h[static_cast<std::size_t>(l)];
  norm_forward(kept(a.ln_1, stored_activations(slot, l).ln_1), a.ln_1_mean, a.ln_1_rstd, residual_in, w.ln_1_weight,
               w.ln_1_bias, N, C);
  forward_layer_body(slot, l);
}

std::span<const float> GPT::logits() const {
  if (slots_.empty() || !slots_[0].has_logits) {
    DUFU_FAIL("GPT::logits: no logits to read; HINT: call forward without targets first (with targets the ",
              "classifier turns the logits into their gradient)");
  }
  const ActivationSlot& slot = slots_[0];
  const std::size_t rows = static_cast<std::size_t>(slot.batch_b) * static_cast<std::size_t>(slot.batch_t);
  return {slot.acts.logits, rows * static_cast<std::size_t>(local_vocab_size())};
}

std::span<const float> GPT::stage_output(int slot_index) const {
  if (stage_.is_last()) DUFU_FAIL("GPT::stage_output: the last pipeline stage ends in the loss, not an output");
  if (slot_index < 0 || static_cast<std::size_t>(slot_index) >= slots_.size() ||
      slots_[static_cast<std::size_t>(slot_index)].memory.empty()) {
    DUFU_FAIL("GPT::stage_output: activation slot ", slot_index, " has had no forward");
  }
  const ActivationSlot& slot = slots_[static_cast<std::size_t>(slot_index)];
  const std::size_t count = static_cast<std::size_t>(slot.batch_b) * static_cast<std::size_t>(slot.batch_t) *
                            static_cast<std::size_t>(config_.d_model);
  return {slot.acts.layers.back().residual_out, count};
}

}  // namespace dufu::trainer
