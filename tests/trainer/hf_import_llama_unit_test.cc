// import_hf of LlamaForCausalLM without Python (the comparison with transformers is
// hf_llama_test.sh): a hand-made directory of F32 and BF16 tensors under Llama's names,
// with grouped K/V heads and an untied or tied head, lands in the checkpoint as an
// independent name table says (no transposes, embed_tokens and lm_head padded with
// zero rows), serially and in tp 2 x pp 2 pieces; merge_checkpoint writes the serial
// model.safetensors under the same HF names; config.toml carries the llama knobs; and
// the refusals name the key and leave nothing behind.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/hf_import.h"
#include "dufu/trainer/checkpoint/safetensors.h"
#include "dufu/trainer/model/gpt.h"
#include "hf_import_test_support.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir.h"

namespace dufu::trainer {
namespace {

using dufu::testing::TempDir;
using hf_import_testing::expect_refused;
using hf_import_testing::HfWeightFiles;
using hf_import_testing::import_in_layout;
using hf_import_testing::loaded_params;
using hf_import_testing::values_of;

// 4 query heads of size 4 over 2 K/V heads, SwiGLU width 12 (not Llama's rule's 256),
// vocab 10 padded to 16 (x tp 2).
GPTConfig llama_config(bool tied) {
  GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 4, .d_model = 16, .vocab_size = 10, .vocab_multiple = 4, .seq_length = 8});
  config.arch = Architecture::kLlama;
  config.n_kv_head = 2;
  config.ffn_hidden = 12;
  config.rope_theta = 500000.0f;
  config.norm_eps = 1e-6f;
  config.tie_embeddings = tied;
  return config;
}

struct HfTensor {
  std::string hf_name;
  std::string dufu_name;
  std::vector<std::uint64_t> shape;
  std::vector<float> values;
};

// LlamaForCausalLM's tensors for `config`, each with the dufu tensor it must become,
// filled with multiples of 1/16 (exact in BF16).
std::vector<HfTensor> hf_tensors(const GPTConfig& config) {
  const std::uint64_t C = 16, q = 16, kv = 8, F = 12, V = 10;
  std::vector<HfTensor> tensors;
  const auto add = [&](const std::string& hf, const std::string& dufu, std::vector<std::uint64_t> shape) {
    tensors.push_back({hf, dufu, shape, values_of(tensors.size(), shape)});
  };
  add("model.embed_tokens.weight", "wte.weight", {V, C});
  for (int l = 0; l < config.n_layer; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".", dufu = "h." + std::to_string(l) + ".";
    add(hf + "input_layernorm.weight", dufu + "ln_1.weight", {C});
    add(hf + "self_attn.q_proj.weight", dufu + "attn.q_proj.weight", {q, C});
    add(hf + "self_attn.k_proj.weight", dufu + "attn.k_proj.weight", {kv, C});
    add(hf + "self_attn.v_proj.weight", dufu + "attn.v_proj.weight", {kv, C});
    add(hf + "self_attn.o_proj.weight", dufu + "attn.o_proj.weight", {C, q});
    add(hf + "post_attention_layernorm.weight", dufu + "ln_2.weight", {C});
    add(hf + "mlp.gate_proj.weight", dufu + "mlp.gate_proj.weight", {F, C});
    add(hf + "mlp.up_proj.weight", dufu + "mlp.up_proj.weight", {F, C});
    add(hf + "mlp.down_proj.weight", dufu + "mlp.down_proj.weight", {C, F});
  }
  add("model.norm.weight", "ln_f.weight", {C});
  if (!config.tie_embeddings) add("lm_head.weight", "lm_head.weight", {V, C});
  return tensors;
}

// Writes the tensors (every other one as BF16) into `files` files, with a rotary
// buffer as older transformers saved it, and config.json (plus `extra_config`).
void write_hf_dir(const std::string& dir, const GPTConfig& config, int files, const std::string& extra_config = "",
                  const std::vector<HfTensor>& extra_tensors = {}) {
  std::filesystem::create_directories(dir);
  std::vector<HfTensor> tensors = hf_tensors(config);
  tensors.insert(tensors.end(), extra_tensors.begin(), extra_tensors.end());
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "", {2}, {1.0f, 0.5f}});
  HfWeightFiles weights(files);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const safetensors::Dtype dtype = k % 2 == 1 ? safetensors::Dtype::kBF16 : safetensors::Dtype::kF32;
    weights.add(tensors[k].hf_name, tensors[k].shape, tensors[k].values, dtype);
  }
  weights.write(dir);
  std::ofstream(dir + "/config.json")
      << "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"num_hidden_layers\": "
      << config.n_layer << ", \"num_attention_heads\": " << config.n_head << ", \"num_key_value_heads\": "
      << config.n_kv_head << ", \"hidden_size\": " << config.d_model << ", \"intermediate_size\": "
      << config.ffn_hidden << ", \"vocab_size\": " << config.vocab_size << ", \"max_position_embeddings\": "
      << config.seq_length << ", \"rope_theta\": 500000.0, \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": "
      << (config.tie_embeddings ? "true" : "false") << ", \"hidden_act\": \"silu\", \"rope_scaling\": null, "
      << "\"attention_bias\": false, \"head_dim\": 4" << extra_config << "}";
}

// The serial model's buffer the HF tensors must give: each copied as it is into its
// dufu tensor, the rows past vocab_size 0.
std::vector<float> expected_params(const GPTConfig& config) {
  GPT model(config);
  std::vector<float> params(model.num_parameters(), 0.0f);
  for (const HfTensor& tensor : hf_tensors(config)) {
    const ParamTensor& target = model.tensor(tensor.dufu_name);
    std::copy(tensor.values.begin(), tensor.values.end(), params.begin() + static_cast<std::ptrdiff_t>(target.offset));
  }
  return params;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(ImportHfLlama, EveryTensorLandsInEveryLayoutAndMergesUnderHfNames) {
  const TempDir temp;
  for (const bool tied : {false, true}) {
    const GPTConfig config = llama_config(tied);
    const std::vector<float> expected = expected_params(config);
    for (const int files : {1, 3}) {
      const std::string hf = temp.file(str_cat("hf", tied, files));
      write_hf_dir(hf, config, files);
      for (const auto& [tp, pp] : {std::pair{1, 1}, {2, 2}}) {
        SCOPED_TRACE(::testing::Message() << (tied ? "tied, " : "untied, ") << files << " files, tp " << tp
                                          << ", pp " << pp);
        const std::string out = temp.file(str_cat("ckpt", tied, files, tp, pp));
        const HfImport imported = import_in_layout(hf, out, tp, pp, config.vocab_multiple);
        EXPECT_EQ(imported.architecture, "LlamaForCausalLM");
        EXPECT_EQ(imported.model.arch, Architecture::kLlama);
        EXPECT_EQ(imported.model.n_kv_head, 2);
        EXPECT_EQ(imported.model.mlp_hidden(), 12);
        EXPECT_EQ(imported.model.rope_theta, 500000.0f);
        EXPECT_EQ(imported.model.norm_eps, 1e-6f);
        EXPECT_EQ(imported.model.tie_embeddings, tied);
        const std::string toml = read_text(out + "/config.toml");
        for (const std::string& line : std::vector<std::string>{"arch = \"llama\"\n", "n_kv_head = 2\n", "ffn_hidden = 12\n",
                                       "rope_theta = 500000\n", "norm_eps = 1e-06\n",
                                       str_cat("tie_embeddings = \"", tied ? "true" : "false", "\"\n")}) {
          EXPECT_NE(toml.find(line), std::string::npos) << line << " not in\n" << toml;
        }
        EXPECT_EQ(loaded_params(out, config), expected);
        if (tp == 1) continue;
        // The pieces merged: model.safetensors under LlamaForCausalLM's names and shapes.
        const std::string merged = temp.file(str_cat("merged", tied, files));
        merge_checkpoint(out, merged);
        EXPECT_EQ(loaded_params(merged, config), expected);
        const safetensors::File file = safetensors::File::open(merged + "/model.safetensors");
        const std::vector<HfTensor> want = hf_tensors(config);
        EXPECT_EQ(file.tensors().size(), want.size());
        for (const HfTensor& tensor : want) {
          SCOPED_TRACE(tensor.hf_name);
          ASSERT_NE(file.find(tensor.hf_name), nullptr);
          EXPECT_EQ(file.find(tensor.hf_name)->shape, tensor.shape);
          const std::span<const float> values = file.view<float>(tensor.hf_name);
          EXPECT_EQ(std::vector<float>(values.begin(), values.end()), tensor.values);
        }
        EXPECT_EQ(file.metadata().at("arch"), "llama");
        EXPECT_EQ(file.metadata().at("n_kv_head"), "2");
      }
    }
  }
}

TEST(ImportHfLlama, RefusalsNameTheKeyAndLeaveNothing) {
  const TempDir temp;
  const GPTConfig config = llama_config(false);
  const std::string out = temp.file("out");
  int dirs = 0;
  const auto refused = [&](const std::string& extra_config, const std::vector<std::string>& needles,
                           const std::vector<HfTensor>& extra_tensors = {}, const GPTConfig& shape = llama_config(false)) {
    const std::string hf = temp.file(str_cat("hf", ++dirs));
    write_hf_dir(hf, shape, 1, extra_config, extra_tensors);
    expect_refused(temp, hf, out, config.vocab_multiple, needles);
  };
  // Keys write_hf_dir leaves out (a key given twice would be ambiguous JSON), and
  // tensors no LlamaForCausalLM of the config has.
  refused(", \"mlp_bias\": true", {"\"mlp_bias\" is true", "no biases"});
  refused(", \"use_sliding_window\": true", {"\"use_sliding_window\" is true"});
  refused(", \"sliding_window\": 4", {"\"sliding_window\" is 4", "max_position_embeddings 8"});
  refused("", {"unexpected tensor \"model.layers.1.self_attn.k_proj.bias\"", "no biases"},
          {{"model.layers.1.self_attn.k_proj.bias", "", {8}, std::vector<float>(8, 0.5f)}});
  // A tied model whose saved head is not embed_tokens.
  GPTConfig tied = llama_config(true);
  std::vector<float> head = hf_tensors(tied).front().values;
  head[5] += 1.0f;
  refused("", {"\"lm_head.weight\" differs from \"model.embed_tokens.weight\"", "\"tie_word_embeddings\" is true"},
          {{"lm_head.weight", "", {10, 16}, head}}, tied);
  // A window as long as the context masks nothing: imported.
  const std::string window = temp.file("window");
  write_hf_dir(window, config, 1, ", \"sliding_window\": 8");
  HfImportOptions options;
  options.vocab_multiple = config.vocab_multiple;
  EXPECT_EQ(loaded_params(import_hf(window, out, options).checkpoint, config), expected_params(config));
}

}  // namespace
}  // namespace dufu::trainer
