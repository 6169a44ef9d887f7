// The activations GPT keeps between a micro-batch's forward and its backward, by layer
// and slot, and the lists of a layer's tensors that bf16 storage and recomputation
// go through: GPT's own bookkeeping (gpt.h uses them as its private types), in a
// header of their own so that the model's interface reads apart from them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt_recipe.h"

namespace dufu::trainer::gpt_activations {

// What the forward keeps for backward, one set per layer. The residual stream of
// layer l enters as residual_in (the embedding for l = 0, the previous layer's
// residual_out otherwise), becomes residual_mid after the attention branch and
// residual_out after the MLP branch; each sum is fused with the LayerNorm after it.
// Shapes are this rank's: under tp ranks qkv holds [N, 3C/tp], lse and atty cover
// NH/tp heads, the MLP's hidden activations are [N, 4C/tp] and the logits
// [N, Vp/tp]; the residual stream and LayerNorm outputs are whole ([N, C]) and
// identical on every rank.
struct LayerActivations {
  float* ln_1;  // [N, C]
  float* ln_1_mean;
  float* ln_1_rstd;     // [N] each
  float* qkv;           // [N, 3C]
  float* lse;           // [B, NH, T] attention's row log-sum-exp (fp32 under bf16 too)
  float* atty;          // [N, C] attention output, before c_proj
  float* residual_mid;  // [N, C]
  float* ln_2;          // [N, C]
  float* ln_2_mean;
  float* ln_2_rstd;
  float* fc_pre;        // [N, 4C] c_fc output plus bias, before GELU
  float* fc_gelu;       // [N, 4C]
  float* residual_out;  // [N, C]
};
// Under bf16, the activations of a layer that its backward reads are kept in bf16
// memory from the forward to the backward (half of fp32's), and their fp32 pointers
// in LayerActivations point into one layer's working set (WorkingLayer), shared by
// all layers and slots: a layer computes in fp32, stores the rounded results
// (store_bf16), and its backward loads them back (load_bf16), exactly. The LayerNorm
// statistics stay fp32 in the slot (the recipe), and so does the residual_out of the
// stage's last layer, its output (stored is null).
struct StoredLayerActivations {
  std::uint16_t* ln_1;
  std::uint16_t* qkv;
  std::uint16_t* atty;
  std::uint16_t* residual_mid;
  std::uint16_t* ln_2;
  std::uint16_t* fc_pre;
  std::uint16_t* fc_gelu;
  std::uint16_t* residual_out;
};
// The fp32 tensors of the layer being computed under bf16. The residual stream
// alternates between two buffers, as layer l reads layer l - 1's residual_out.
struct WorkingLayer {
  float* ln_1;
  float* qkv;
  float* atty;
  float* residual_mid;
  float* ln_2;
  float* fc_pre;
  float* fc_gelu;
  float* residual[2];
};
struct Activations {
  float* encoded;  // [N, C]
  // Under fp32 every tensor; under bf16 the ones kept in fp32 (layer_activations()
  // gives the pointers a layer computes with).
  std::vector<LayerActivations> layers;
  std::vector<StoredLayerActivations> stored;  // under bf16 only
  std::uint16_t* ln_f_bits;                    // under bf16, the LM head's input
  float* ln_f;  // [N, C]
  float* ln_f_mean;
  float* ln_f_rstd;
  float* logits;  // [N, Vp]
  std::uint16_t* logits_bits;  // under bf16, the bits of the logits' gradient (the LM head's dout)
  float* losses;  // [N]
  // Scratch reused by every layer: the output of a branch (c_proj of attention or
  // MLP) before it joins the residual.
  float* branch;  // [N, C]
};
// Gradients of activations, only needed (and allocated) for backward.
struct ActivationGrads {
  float* residual;  // [N, C] the residual stream's gradient, accumulated through
  float* ln;        // [N, C] gradient of a LayerNorm output
  float* atty;      // [N, C]
  float* qkv;       // [N, 3C]
  float* fc_pre;    // [N, 4C] (fc_gelu's gradient is never stored: matmul_gelu_backward goes through the GELU)
  float* fc_hidden;  // llama: [N, F] the SwiGLU output's gradient (null for gpt2)
  // Under bf16 the bits of the gradients a backward GEMM reads as its dout, stored by
  // the kernel that keeps each (null under fp32): a GPU multiplies them as they are.
  std::uint16_t* residual_bits;
  std::uint16_t* qkv_bits;
  std::uint16_t* fc_pre_bits;
};

// One micro-batch's activations and what its backward needs. Activations are sized
// for the largest B and T the slot has seen (capacity_b, capacity_t); a smaller
// batch uses the front of each tensor.
struct ActivationSlot {
  int capacity_b = 0;
  int capacity_t = 0;
  bool bf16_storage = false;  // how the slot's memory is laid out
  Recompute recompute = Recompute::kNone;  // what its layers keep
  DeviceBuffer<float> memory;
  DeviceBuffer<std::uint16_t> stored_memory;  // bf16 storage, under bf16
  Activations acts{};
  // The last forward's batch on the device (embedding_backward needs the tokens,
  // the classifier the targets), the loss it returned, and whether the logits
  // buffer holds logits or, after a forward with targets, their gradient.
  DeviceBuffer<std::int32_t> tokens;
  DeviceBuffer<std::int32_t> targets;
  DeviceBuffer<float> loss;
  // Its documents (BatchDocuments), uploaded where given: the kernels read null for
  // those that were not (positions t, one document per row).
  DeviceBuffer<std::int32_t> positions;
  DeviceBuffer<std::int32_t> document_starts;
  bool has_positions = false;
  bool has_document_starts = false;
  const std::int32_t* device_positions() const { return has_positions ? positions.data() : nullptr; }
  const std::int32_t* device_document_starts() const {
    return has_document_starts ? document_starts.data() : nullptr;
  }
  int batch_b = 0;
  int batch_t = 0;
  bool has_logits = false;
  bool backward_pending = false;
};

// Floats of a layer's activations for `rows` rows: an [N, C] tensor (the residual
// stream) and this rank's parts, rows times GPT::local_widths().
struct LayerSizes {
  std::size_t stream, qkv, attn, mlp_pre, mlp_hidden;
};
// visit(count, layers.tensor...) for each activation of a layer that bf16 storage
// keeps, but residual_out (whose place depends on the layer): the one list of them
// for the fp32 layout, the bf16 storage and the working layer.
// Those of them that selective recomputation drops (the MLP's hidden values), and
// the rest.
template <typename Visit, typename... Layers>
void for_each_selectively_recomputed_tensor(const LayerSizes& sizes, Visit&& visit, Layers&... layers) {
  visit(sizes.mlp_pre, layers.fc_pre...);
  visit(sizes.mlp_hidden, layers.fc_gelu...);
}
template <typename Visit, typename... Layers>
void for_each_selectively_kept_tensor(const LayerSizes& sizes, Visit&& visit, Layers&... layers) {
  visit(sizes.stream, layers.ln_1...);
  visit(sizes.qkv, layers.qkv...);
  visit(sizes.attn, layers.atty...);
  visit(sizes.stream, layers.residual_mid...);
  visit(sizes.stream, layers.ln_2...);
}
template <typename Visit, typename... Layers>
void for_each_stored_tensor(const LayerSizes& sizes, Visit&& visit, Layers&... layers) {
  for_each_selectively_kept_tensor(sizes, visit, layers...);
  for_each_selectively_recomputed_tensor(sizes, visit, layers...);
}
// The tensors of a layer a slot under `recompute` keeps in its own memory (the rest
// are the working layer's).
template <typename Visit, typename... Layers>
void for_each_tensor_kept(Recompute recompute, const LayerSizes& sizes, Visit&& visit, Layers&... layers) {
  if (recompute == Recompute::kNone) for_each_stored_tensor(sizes, visit, layers...);
  if (recompute == Recompute::kSelective) for_each_selectively_kept_tensor(sizes, visit, layers...);
}
template <typename Visit, typename... Layers>
void for_each_tensor_recomputed(Recompute recompute, const LayerSizes& sizes, Visit&& visit, Layers&... layers) {
  if (recompute == Recompute::kFull) for_each_stored_tensor(sizes, visit, layers...);
  if (recompute == Recompute::kSelective) for_each_selectively_recomputed_tensor(sizes, visit, layers...);
}

}  // namespace dufu::trainer::gpt_activations
