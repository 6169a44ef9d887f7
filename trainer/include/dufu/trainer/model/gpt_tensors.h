// Named views of the tensors in one flat buffer laid out as gpt_parameter_layout says
// (gpt_layout.h): GPT's parameters, gradients, optimizer moments and bf16 working copy.
#pragma once

#include <vector>

namespace dufu::trainer {

// Pointers to the tensors of one buffer laid out as gpt_parameter_layout says: the
// same struct serves the parameters, their gradients and optimizer moments (float),
// and the bf16 working copy of the weights (its bits, std::uint16_t). On a pipeline
// stage, h holds the stage's layers (h[0] is layer first_layer) and the tensors the
// stage does not hold are null.
//
// Under model.arch = llama the same roles hold Llama's tensors and the biases are
// null: ln_1/ln_2 the RMSNorm weights, attn_c_attn the fused q, k, v projection
// ([(NH + 2 NKV) hs, C], q_proj's first row on), attn_c_proj o_proj, mlp_c_fc the fused
// gate and up projection ([2F, C]), mlp_c_proj down_proj; wpe and ln_f_bias are null,
// lm_head the untied head (null when tied: the head is wte).
template <typename T>
struct BasicGPTLayerTensors {
  T* ln_1_weight;
  T* ln_1_bias;
  T* attn_c_attn_weight;
  T* attn_c_attn_bias;
  T* attn_c_proj_weight;
  T* attn_c_proj_bias;
  T* ln_2_weight;
  T* ln_2_bias;
  T* mlp_c_fc_weight;
  T* mlp_c_fc_bias;
  T* mlp_c_proj_weight;
  T* mlp_c_proj_bias;
};
template <typename T>
struct BasicGPTTensors {
  T* wte;
  T* wpe;
  std::vector<BasicGPTLayerTensors<T>> h;
  T* ln_f_weight;
  T* ln_f_bias;
  T* lm_head;
};
using GPTLayerTensors = BasicGPTLayerTensors<float>;
using GPTTensors = BasicGPTTensors<float>;

}  // namespace dufu::trainer
