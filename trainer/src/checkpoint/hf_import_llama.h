// LlamaForCausalLM for import_hf (hf_import.h): its config.json as dufu's model.arch =
// llama, its tensors into the serial buffer. Internal to the trainer library.
#pragma once

#include <span>

#include "dufu/trainer/model/gpt_layout.h"
#include "hf_weights.h"

namespace dufu::trainer::hf_import_llama {

// The model shape of a LlamaForCausalLM config.json. Throws dufu::Error in one line
// naming the key for what dufu's llama does not compute: a hidden_act other than
// silu, attention_bias or mlp_bias true, a rope_scaling (named by its type), an
// active sliding window (sliding_window below max_position_embeddings,
// use_sliding_window true), a head_dim other than hidden_size / num_attention_heads.
GPTConfig config(const hf_weights::HfConfig& hf, int vocab_multiple);

// The serial buffer (gpt_parameter_layout(config)) from the tensors under
// LlamaForCausalLM's names (checkpoint_files::hf_name). A tied model's lm_head.weight,
// when saved, must equal embed_tokens; the rotary inv_freq buffers older transformers
// saved are skipped; any other tensor is refused by name.
void weights(const hf_weights::HfWeights& weights, const GPTConfig& config, std::span<float> params);

}  // namespace dufu::trainer::hf_import_llama
