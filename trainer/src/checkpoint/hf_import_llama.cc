// LlamaForCausalLM as dufu's llama (see hf_import_llama.h).
#include "hf_import_llama.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint_files.h"
#include "dufu/common/error.h"

namespace dufu::trainer::hf_import_llama {

using hf_weights::HfConfig;
using hf_weights::HfWeights;

GPTConfig config(const HfConfig& hf, int vocab_multiple) {
  const auto refuse = [&](const std::string& key, const std::string& value, const std::string& dufu) {
    DUFU_FAIL(hf.path(), ": \"", key, "\" is ", value, "; dufu's llama supports only ", dufu);
  };
  GPTConfig config;
  config.arch = Architecture::kLlama;
  config.n_layer = hf.positive_int("num_hidden_layers");
  config.n_head = hf.positive_int("num_attention_heads");
  config.d_model = hf.positive_int("hidden_size");
  config.n_kv_head = hf.has("num_key_value_heads") ? hf.positive_int("num_key_value_heads") : config.n_head;
  config.ffn_hidden = hf.positive_int("intermediate_size");
  config.vocab_size = hf.positive_int("vocab_size");
  config.seq_length = hf.positive_int("max_position_embeddings");
  config.vocab_multiple = vocab_multiple;
  // LlamaConfig's defaults for the keys left out.
  config.rope_theta = static_cast<float>(hf.number_or("rope_theta", 10000.0));
  config.norm_eps = static_cast<float>(hf.number_or("rms_norm_eps", 1e-6));
  config.tie_embeddings = hf.boolean_or("tie_word_embeddings", false);

  const std::string activation = hf.string_or("hidden_act", "silu");
  if (activation != "silu") refuse("hidden_act", '"' + activation + '"', "\"silu\" (SwiGLU)");
  // Qwen2-style biases on q, k and v (attention_bias) or on the MLP: no bias tensors in
  // dufu's llama.
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (hf.boolean_or(key, false)) refuse(key, "true", "false (no biases)");
  }
  if (hf.has("rope_scaling")) {
    const std::string type = hf.member_string_or("rope_scaling", "rope_type",
                                                 hf.member_string_or("rope_scaling", "type", "of no named type"));
    refuse("rope_scaling", str_cat(hf.json_text("rope_scaling"), " (", type, ")"),
           "null (rotary angles without scaling)");
  }
  if (hf.boolean_or("use_sliding_window", false)) refuse("use_sliding_window", "true", "false (full causal attention)");
  // A window as long as the context never masks anything.
  if (hf.has("sliding_window") && hf.integer("sliding_window") < config.seq_length) {
    refuse("sliding_window", str_cat(hf.integer("sliding_window")),
           str_cat("null or at least max_position_embeddings ", config.seq_length, " (full causal attention)"));
  }
  if (config.d_model % config.n_head != 0) {
    DUFU_FAIL(hf.path(), ": \"num_attention_heads\" ", config.n_head, " does not divide \"hidden_size\" ",
              config.d_model);
  }
  if (hf.has("head_dim") && hf.integer("head_dim") != config.head_size()) {
    refuse("head_dim", str_cat(hf.integer("head_dim")),
           str_cat("hidden_size / num_attention_heads = ", config.head_size()));
  }
  if (config.n_head % config.n_kv_head != 0) {
    DUFU_FAIL(hf.path(), ": \"num_key_value_heads\" ", config.n_kv_head, " does not divide \"num_attention_heads\" ",
              config.n_head);
  }
  // pretraining_tp only slices transformers' matmuls (the same sums), attention_dropout
  // and the ids matter only to transformers: ignored, as GPT-2's dropouts are.
  try {
    config.validate();
  } catch (const Error& e) {
    DUFU_FAIL(hf.path(), ": ", e.what());
  }
  return config;
}

namespace {

// Buffers of older LlamaForCausalLM checkpoints that hold no weights.
bool is_rotary_buffer(std::string_view name) { return name.ends_with(".rotary_emb.inv_freq"); }

}  // namespace

void weights(const HfWeights& weights, const GPTConfig& config, std::span<float> params) {
  std::set<std::string> used;
  const std::vector<ParamTensor> layout = gpt_parameter_layout(config);
  for (const ParamTensor& tensor : layout) {
    const std::string name = checkpoint_files::hf_name(tensor, config);
    const std::vector<float> values = weights.to_float(name, checkpoint_files::hf_shape(tensor, config));
    checkpoint_files::place_hf_tensor(tensor, values, params.data() + tensor.offset);
    used.insert(name);
  }
  // A tied model saved with its head: the head must be embed_tokens itself.
  if (config.tie_embeddings && weights.contains("lm_head.weight")) {
    const std::vector<float> head = weights.to_float("lm_head.weight", checkpoint_files::hf_shape(layout.front(), config));
    if (!std::equal(head.begin(), head.end(), params.begin() + static_cast<std::ptrdiff_t>(layout.front().offset))) {
      DUFU_FAIL("tensor \"lm_head.weight\" differs from \"model.embed_tokens.weight\" but \"tie_word_embeddings\" ",
                "is true; HINT: a model with its own head has \"tie_word_embeddings\": false");
    }
    used.insert("lm_head.weight");
  }
  for (const std::string& name : weights.names()) {
    if (!used.contains(name) && !is_rotary_buffer(name)) {
      DUFU_FAIL("unexpected tensor \"", name, "\": LlamaForCausalLM of this config has no such weight",
                name.ends_with(".bias") ? " (dufu's llama has no biases)" : "");
    }
  }
}

}  // namespace dufu::trainer::hf_import_llama
