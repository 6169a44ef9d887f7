// GPT's backward pass (see gpt.cc for the forward): the same flat sequence of kernel
// calls per layer, in reverse, with the tensor-parallel conjugates of the forward's
// all-reduces and the bf16 recipe's rounding points.
#include <cstddef>
#include <span>
#include <string>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

void GPT::zero_grad() {
  ensure_gradients();
  storage_->zero_gradient();
}

void GPT::backward() {
  require_whole_model("GPT::backward");
  backward_stage(0, {});
}

std::span<const float> GPT::backward_stage(int slot_index, std::span<const float> d_output) {
  if (slot_index < 0 || static_cast<std::size_t>(slot_index) >= slots_.size() ||
      !slots_[static_cast<std::size_t>(slot_index)].backward_pending) {
    DUFU_FAIL("GPT::backward: no forward with targets to go back through",
              stage_.num_stages > 1 ? str_cat(" in activation slot ", slot_index) : std::string(),
              "; HINT: call forward with targets once before each backward");
  }
  ActivationSlot& slot = slots_[static_cast<std::size_t>(slot_index)];
  const int B = slot.batch_b;
  const int T = slot.batch_t;
  const int N = B * T;
  const int C = config_.d_model;
  const LocalWidths widths = local_widths();
  const int Vl = local_vocab_size();
  const std::size_t rows = static_cast<std::size_t>(N);
  const LayerSizes sizes = layer_sizes(rows);
  const std::size_t stream = sizes.stream;
  if (stage_.is_last() != d_output.empty() || (!d_output.empty() && d_output.size() != stream)) {
    DUFU_FAIL("GPT::backward_stage: pipeline stage ", stage_.stage, " of ", stage_.num_stages, " got ", d_output.size(),
              " floats of output gradient; it needs ", stage_.is_last() ? std::size_t{0} : stream,
              " (the last stage starts from its loss)");
  }
  if (const char* refusal = storage_->backward_refusal()) DUFU_FAIL("GPT::backward: ", refusal);
  ensure_gradients();
  slot.backward_pending = false;
  ensure_activation_grads(B, T);
  const Activations& acts = slot.acts;
  const ActivationGrads& d = dacts_;
  const KernelTable& k = *kernels_;

  // Tensor parallel, the conjugates of the forward's communication: a column-parallel
  // layer (c_attn, c_fc, the LM head) got the whole LayerNorm output on every rank,
  // so the gradient of that input is the sum of every rank's part, an all-reduce; a
  // row-parallel layer (c_proj) got the all-reduced sum, whose backward hands each
  // rank the same output gradient with no communication, and so does the embedding.
  //
  // After each all-reduce the residual stream's gradient d.residual is bitwise the
  // same on every rank, and so are the LayerNorm inputs and weights it meets, so every
  // rank computes bitwise the same gradients for the replicated parameters (wpe, the
  // LayerNorms, the c_proj biases): they need no reduction over the group.

  // Under bf16 the activation gradients are rounded where they are stored, as the
  // activations are; parameter gradients accumulate in fp32.
  if (stage_.is_last()) {
    // The classifier left dloss/dlogits in the logits buffer, kept in bf16 under bf16.
    linear_backward(kept_before_reduction(d.ln), config_.tie_embeddings ? g_.wte : g_.lm_head, nullptr,
                    {acts.logits, acts.logits_bits}, {acts.ln_f, acts.ln_f_bits}, head_weights(), N, C, Vl);
    reduce_and_keep(d.ln, stream);
    const LayerActivations& last = acts.layers.back();  // its residual_out is fp32 under bf16 too
    device_->fill(d.residual, 0.0f, stream);
    norm_backward(kept(d.residual, d.residual_bits), g_.ln_f_weight, g_.ln_f_bias, d.ln, last.residual_out,
                  p_.ln_f_weight, acts.ln_f_mean, acts.ln_f_rstd, N, C);
  } else {
    // The next stage's input gradient is this stage's output gradient, which it kept
    // (on the bf16 grid under bf16, so its bits are exact).
    device_->copy(d.residual, d_output.data(), d_output.size_bytes());
    if (d.residual_bits != nullptr) k.to_bf16(d.residual_bits, d.residual, stream);
  }
  const KeptIn residual_grad{d.residual, d.residual_bits};

  // d.residual carries the gradient of the residual stream down the layers: each
  // branch reads it as the gradient of its output, and each LayerNorm backward adds
  // its input's gradient to it, which is the residual add's backward.
  for (int l = stage_.num_layers - 1; l >= 0; --l) {
    const GPTLayerTensors& w = p_.h[static_cast<std::size_t>(l)];
    const GPTLayerTensors& dw = g_.h[static_cast<std::size_t>(l)];
    acquire_layer_parameters(l);
    storage_->expect_layer(l - 1);  // on its way while this layer's backward runs
    storage_->begin_layer_gradient(l);
    // Under bf16 the layer's activations that fp32 kernels read come back from their
    // bf16 copies first; the matmuls read the copies themselves. Under recomputation
    // what the forward dropped is made again.
    load_layer_activations(slot, l);
    if (slot.recompute != Recompute::kNone) recompute_layer(slot, l);
    const LayerActivations a = layer_activations(slot, l);
    const StoredLayerActivations stored = stored_activations(slot, l);
    const BasicGPTLayerTensors<std::uint16_t> w16 =
        p16_.h.empty() ? BasicGPTLayerTensors<std::uint16_t>{} : p16_.h[static_cast<std::size_t>(l)];
    const float* residual_in = l == 0 ? acts.encoded : layer_activations(slot, l - 1).residual_out;

    if (config_.is_llama()) {
      // down_proj's backward gives the SwiGLU output's gradient, SwiGLU's that of the
      // fused gate and up projection.
      linear_backward(kept(d.fc_hidden, nullptr), dw.mlp_c_proj_weight, nullptr, residual_grad,
                      {a.fc_gelu, stored.fc_gelu}, {w.mlp_c_proj_weight, w16.mlp_c_proj_weight}, N, widths.mlp_hidden,
                      C);
      k.swiglu_backward(kept(d.fc_pre, d.fc_pre_bits), d.fc_hidden, a.fc_pre, N, widths.mlp_hidden);
    } else {
      // c_proj's backward goes through the GELU in one op (a GPU's epilogue): the
      // gradient of the GELU's output is never stored, so under bf16 it is not rounded.
      linear_gelu_backward(kept(d.fc_pre, d.fc_pre_bits), dw.mlp_c_proj_weight, dw.mlp_c_proj_bias, residual_grad,
                           {a.fc_gelu, stored.fc_gelu}, {w.mlp_c_proj_weight, w16.mlp_c_proj_weight}, a.fc_pre, N,
                           widths.mlp_hidden, C);
    }
    storage_->progress();
    linear_backward(kept_before_reduction(d.ln), dw.mlp_c_fc_weight, dw.mlp_c_fc_bias, {d.fc_pre, d.fc_pre_bits},
                    {a.ln_2, stored.ln_2}, {w.mlp_c_fc_weight, w16.mlp_c_fc_weight}, N, C, widths.mlp_pre);
    reduce_and_keep(d.ln, stream);
    norm_backward(kept(d.residual, d.residual_bits), dw.ln_2_weight, dw.ln_2_bias, d.ln, a.residual_mid, w.ln_2_weight,
                  a.ln_2_mean, a.ln_2_rstd, N, C);

    linear_backward(kept(d.atty, nullptr), dw.attn_c_proj_weight, dw.attn_c_proj_bias, residual_grad,
                    {a.atty, stored.atty}, {w.attn_c_proj_weight, w16.attn_c_proj_weight}, N, widths.attn, C);
    storage_->progress();
    // Llama's q and k gradients turn back after the attention's backward, which keeps
    // them.
    const bool turned = config_.is_llama();
    k.attention_backward(turned ? TensorOut(d.qkv) : kept(d.qkv, d.qkv_bits), d.atty,
                         attention_input({a.qkv, stored.qkv}), a.atty, a.lse, slot.device_document_starts(), B, T,
                         widths.heads, widths.kv_heads, widths.head_size);
    if (turned) {
      k.rotary_backward(kept(d.qkv, d.qkv_bits), slot.device_positions(), B, T, widths.heads, widths.kv_heads,
                        widths.head_size, config_.rope_theta);
    }
    storage_->progress();
    linear_backward(kept_before_reduction(d.ln), dw.attn_c_attn_weight, dw.attn_c_attn_bias, {d.qkv, d.qkv_bits},
                    {a.ln_1, stored.ln_1}, {w.attn_c_attn_weight, w16.attn_c_attn_weight}, N, C, widths.qkv);
    reduce_and_keep(d.ln, stream);
    norm_backward(kept(d.residual, d.residual_bits), dw.ln_1_weight, dw.ln_1_bias, d.ln, residual_in, w.ln_1_weight,
                  a.ln_1_mean, a.ln_1_rstd, N, C);
    storage_->end_layer_gradient(l);
  }
  if (!stage_.is_first()) return {d.residual, stream};  // the previous stage's output gradient
  embed_backward(d.residual, slot.tokens.data(), slot.device_positions(), B, T, C);
  return {};
}

}  // namespace dufu::trainer
