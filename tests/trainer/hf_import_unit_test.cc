// import_hf without Python (the comparison with transformers is hf_import_test.sh): the
// half-precision widening against the IEEE formula for all 65536 bit patterns; a
// hand-made GPT-2 directory of F32, BF16 and F16 tensors, in one file and in shards,
// lands in the checkpoint as an independent mapping says (Conv1D weights transposed,
// wte padded with zero rows), serially and in tp 2 x pp 2 pieces; and the refusals name
// what is wrong and leave nothing behind; config.json keys given twice read as Python's
// json reads them.
#include <gtest/gtest.h>

#include <cmath>
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
#include "hf_weights.h"
#include "support/expect_error.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir.h"

namespace dufu::trainer {
namespace {

namespace fs = std::filesystem;
using dufu::testing::expect_error;
using dufu::testing::TempDir;
using hf_import_testing::expect_refused;
using hf_import_testing::HfWeightFiles;
using hf_import_testing::import_in_layout;
using hf_import_testing::loaded_params;
using hf_import_testing::values_of;

TEST(HalfToFloat, EveryBitPatternIsTheIeeeValue) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const int sign = (bits >> 15) != 0 ? -1 : 1;
    const int exponent = static_cast<int>((bits >> 10) & 0x1f);
    const int mantissa = static_cast<int>(bits & 0x3ff);
    const float got = hf_weights::half_to_float(static_cast<std::uint16_t>(bits));
    if (exponent == 0x1f) {
      if (mantissa == 0) {
        EXPECT_EQ(got, sign * INFINITY) << bits;
      } else {
        EXPECT_TRUE(std::isnan(got)) << bits;
      }
      continue;
    }
    const double expected = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                          : sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
    EXPECT_EQ(static_cast<double>(got), expected) << bits;
    EXPECT_EQ(std::signbit(got), sign < 0) << bits;  // -0 stays -0
  }
}

constexpr const char* kConv1d[] = {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
                                   ".mlp.c_proj.weight"};
bool is_conv1d(const std::string& name) {
  for (const char* suffix : kConv1d) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

GPTConfig tiny_config() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 10, .vocab_multiple = 4, .seq_length = 4});
}

struct HfTensor {
  std::string name;
  std::vector<std::uint64_t> shape;  // HF's
  std::vector<float> values;
};

// The tensors of GPT2LMHeadModel for `config`, in HF's names and shapes.
std::vector<HfTensor> hf_tensors(const GPTConfig& config) {
  const std::uint64_t C = static_cast<std::uint64_t>(config.d_model);
  std::vector<HfTensor> tensors;
  const auto add = [&](const std::string& name, std::vector<std::uint64_t> shape) {
    tensors.push_back({"transformer." + name, shape, values_of(tensors.size(), shape)});
  };
  add("wte.weight", {static_cast<std::uint64_t>(config.vocab_size), C});
  add("wpe.weight", {static_cast<std::uint64_t>(config.seq_length), C});
  for (int l = 0; l < config.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {C, 3 * C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {C, 4 * C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {4 * C, C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return tensors;
}

// Writes the tensors (every third as BF16, every third as F16) into `files` files
// (round robin), plus the tied lm_head and a causal-mask buffer, and config.json.
void write_hf_dir(const std::string& dir, const GPTConfig& config, int files, const std::string& extra_config = "") {
  fs::create_directories(dir);
  const std::vector<HfTensor> tensors = hf_tensors(config);
  constexpr safetensors::Dtype kDtypes[] = {safetensors::Dtype::kF32, safetensors::Dtype::kBF16,
                                           safetensors::Dtype::kF16};
  HfWeightFiles weights(files);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    weights.add(tensors[k].name, tensors[k].shape, tensors[k].values, kDtypes[k % 3]);
  }
  weights.add_to(0, "lm_head.weight", tensors[0].shape, tensors[0].values, safetensors::Dtype::kF32);
  const std::vector<float> mask(16, 1.0f);
  weights.add_to(0, "transformer.h.0.attn.bias", {1, 1, 4, 4}, mask, safetensors::Dtype::kF32);
  weights.write(dir);
  std::ofstream(dir + "/config.json") << "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", "
                                      << "\"n_layer\": " << config.n_layer << ", \"n_head\": " << config.n_head
                                      << ", \"n_embd\": " << config.d_model << ", \"vocab_size\": "
                                      << config.vocab_size << ", \"n_positions\": " << config.seq_length
                                      << extra_config << "}";
}

// The serial model's buffer the HF tensors must give, by the mapping written out here.
std::vector<float> expected_params(const GPTConfig& config) {
  GPT model(config);
  std::vector<float> params(model.num_parameters(), 0.0f);
  for (const HfTensor& tensor : hf_tensors(config)) {
    const ParamTensor& target = model.tensor(tensor.name.substr(std::string("transformer.").size()));
    for (std::size_t j = 0; j < tensor.values.size(); ++j) {
      std::size_t at = j;
      if (is_conv1d(target.name)) {  // HF [in, out] (i, o) is dufu's [out, in] (o, i)
        const std::size_t in = j / tensor.shape[1], out = j % tensor.shape[1];
        at = out * tensor.shape[0] + in;
      }
      params[target.offset + at] = tensor.values[j];  // wte's rows past vocab_size stay 0
    }
  }
  return params;
}

TEST(ImportHf, EveryTensorLandsInEveryLayout) {
  const TempDir temp;
  const GPTConfig config = tiny_config();
  const std::vector<float> expected = expected_params(config);
  for (const int files : {1, 3}) {
    const std::string hf = temp.file("hf" + std::to_string(files));
    write_hf_dir(hf, config, files);
    for (const auto& [tp, pp] : {std::pair{1, 1}, {2, 2}, {2, 1}}) {
      SCOPED_TRACE(::testing::Message() << files << " files, tp " << tp << ", pp " << pp);
      const std::string out = temp.file("ckpt-" + std::to_string(files) + std::to_string(tp) + std::to_string(pp));
      const HfImport imported = import_in_layout(hf, out, tp, pp, config.vocab_multiple);
      EXPECT_EQ(imported.architecture, "GPT2LMHeadModel");
      EXPECT_EQ(imported.weight_files.size(), static_cast<std::size_t>(files));
      EXPECT_FALSE(read_checkpoint_state(out).tokenizer.has_value());
      EXPECT_EQ(loaded_params(out, config), expected);
      // The moments are zero and the step count 0.
      GPT model(config);
      AdamW optimizer(model, AdamWOptions{});
      load_checkpoint(out, model, &optimizer);
      EXPECT_EQ(optimizer.step_count(), 0);
      for (const float m : optimizer.m()) ASSERT_EQ(m, 0.0f);
    }
  }
}

TEST(ImportHf, RefusalsNameTheCauseAndLeaveNothing) {
  const TempDir temp;
  const GPTConfig config = tiny_config();
  const std::string out = temp.file("out");
  const auto refused = [&](const std::string& hf, const std::vector<std::string>& needles) {
    expect_refused(temp, hf, out, config.vocab_multiple, needles);
  };
  write_hf_dir(temp.file("llama"), config, 1);
  std::ofstream(temp.file("llama") + "/config.json")
      << "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\"}";
  refused(temp.file("llama"), {"\"num_hidden_layers\" is missing"});  // read as a Llama (hf_import_llama_unit_test)
  write_hf_dir(temp.file("untied"), config, 1, ", \"tie_word_embeddings\": false");
  refused(temp.file("untied"), {"\"tie_word_embeddings\" is false"});
  write_hf_dir(temp.file("eps"), config, 1, ", \"layer_norm_epsilon\": 1e-6");
  refused(temp.file("eps"), {"\"layer_norm_epsilon\" is 1e-06"});
  write_hf_dir(temp.file("inner"), config, 1, ", \"n_inner\": 16");
  refused(temp.file("inner"), {"\"n_inner\" is 16"});
  // A head that is not wte, a tensor of no GPT-2 weight.
  write_hf_dir(temp.file("head"), config, 1);
  {
    const safetensors::File file = safetensors::File::open(temp.file("head") + "/model.safetensors");
    std::vector<std::vector<float>> copies;
    std::vector<safetensors::TensorRef> refs;
    for (const safetensors::TensorView& tensor : file.tensors()) {
      if (tensor.dtype != safetensors::Dtype::kF32) continue;
      copies.emplace_back(file.view<float>(tensor.name).begin(), file.view<float>(tensor.name).end());
      if (tensor.name == "lm_head.weight") copies.back()[3] += 1.0f;
      refs.push_back({tensor.name, tensor.dtype, tensor.shape, copies.back().data()});
    }
    for (const safetensors::TensorView& tensor : file.tensors()) {
      if (tensor.dtype != safetensors::Dtype::kF32) refs.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.bytes.data()});
    }
    copies.emplace_back(4, 0.0f);
    refs.push_back({"score.weight", safetensors::Dtype::kF32, {4}, copies.back().data()});
    safetensors::write(temp.file("head") + "/new.safetensors", refs);
    fs::rename(temp.file("head") + "/new.safetensors", temp.file("head") + "/model.safetensors");
  }
  refused(temp.file("head"), {"\"lm_head.weight\" differs from \"transformer.wte.weight\"", "untied"});
  // The index puts a tensor in a shard that does not hold it.
  write_hf_dir(temp.file("index"), config, 3);
  {
    std::ifstream in(temp.file("index") + "/model.safetensors.index.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string entry = "\"transformer.ln_f.bias\": \"model-0000";
    const std::size_t digit = text.find(entry) + entry.size();  // the shard's number, 1 to 3
    text[digit] = text[digit] == '1' ? '2' : '1';
    std::ofstream(temp.file("index") + "/model.safetensors.index.json") << text;
  }
  refused(temp.file("index"), {"\"weight_map\" puts \"transformer.ln_f.bias\" in", "which does not hold it"});
  // No weights, and a destination that exists.
  fs::create_directories(temp.file("empty"));
  std::ofstream(temp.file("empty") + "/config.json") << "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, "
                                                     << "\"n_embd\": 8, \"vocab_size\": 10, \"n_positions\": 4}";
  refused(temp.file("empty"), {"no model.safetensors or model.safetensors.index.json"});
  fs::create_directories(out);
  HfImportOptions options;
  options.vocab_multiple = config.vocab_multiple;
  expect_error([&] { import_hf(temp.file("untied"), out, options); }, {"already exists"});
}

// A key given twice is its last value, as in Python's json, which transformers reads
// config.json with (the first would make the import another model than transformers').
TEST(HfConfig, AKeyGivenTwiceIsItsLastValueAsInPython) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  std::ofstream(path) << R"({"n_layer": 2, "n_head": 4, "n_layer": 3, "task_specific_params": {"a": "x", "a": "y"}})";
  const hf_weights::HfConfig config = hf_weights::HfConfig::read(path);
  EXPECT_EQ(config.integer("n_layer"), 3);
  EXPECT_EQ(config.integer("n_head"), 4);
  EXPECT_EQ(config.member_string_or("task_specific_params", "a", ""), "y");
}

}  // namespace
}  // namespace dufu::trainer
