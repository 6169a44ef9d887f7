// The Llama-family model (model.arch = llama) in one process, held to the properties
// the GPT-2 model is held to (recomputation's bits and pipeline stages whose forwards
// run before their backwards: recompute_test, which runs Llama's shapes too): bf16 trains a repeated batch; what the model allocates is what the memory plan says
// (training_memory.h), and its parameter count is the plan's and the one counted by
// hand from Llama's tensors. Each for an untied head (Llama's) and a tied one, with
// every head its own K/V head and with grouped K/V heads (2 query heads per K/V head).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/gpt_layout.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/run/training_memory.h"
#include "support/activation_bytes.h"
#include "support/counting_cpu_device.h"
#include "support/gpt_fixture.h"

namespace {

using dufu::trainer::AdamW;
using dufu::trainer::AdamWOptions;
using dufu::trainer::GPT;
using dufu::trainer::GPTConfig;
using dufu::trainer::GPTRecipe;
using dufu::trainer::PipelineStage;
using dufu::trainer::Precision;
using dufu::trainer::Recompute;

constexpr int kB = 4;
constexpr int kT = 16;

// The shapes under test: K/V heads per model (equal to n_head, or grouped) and the head.
struct LlamaShape {
  int n_kv_head;
  bool tied;
};

// 3 layers, 4 heads of 8 channels, a SwiGLU of 48 (not Llama's rule, so ffn_hidden is
// exercised), and a vocabulary that is a multiple of vocab_multiple, so the memory
// plan's padding allowance is exactly one vocab_multiple of logit columns.
GPTConfig llama_model(const LlamaShape& shape) {
  GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = 3, .n_head = 4, .d_model = 32, .vocab_size = 64, .vocab_multiple = 16, .seq_length = kT});
  config.arch = dufu::trainer::Architecture::kLlama;
  config.n_kv_head = shape.n_kv_head;
  config.ffn_hidden = 48;
  config.rope_theta = 500000.0f;
  config.norm_eps = 1e-6f;
  config.tie_embeddings = shape.tied;
  config.validate();
  return config;
}

std::string shape_name(const LlamaShape& shape) {
  return std::string(shape.n_kv_head == 4 ? "MultiHead" : "Grouped") + (shape.tied ? "Tied" : "Untied");
}

const LlamaShape kShapes[] = {{4, false}, {4, true}, {2, false}, {2, true}};

// ---- bf16 trains ---------------------------------------------------------------

class LlamaShapeTest : public ::testing::TestWithParam<LlamaShape> {
 protected:
  GPTConfig config() const { return llama_model(GetParam()); }
};

// One shape (Llama's: grouped K/V heads, an untied head): 40 training steps per shape
// would add nothing the bitwise tests of the others do not show.
TEST(LlamaBf16Test, TrainsARepeatedBatchLikeFp32) {
  const GPTConfig config = llama_model({.n_kv_head = 2, .tied = false});
  const auto batch = dufu::testing::next_token_batch(kB, kT, config.vocab_size, 41, {});
  std::vector<float> last_losses;
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    GPT model(config, nullptr, {}, nullptr, GPTRecipe{.precision = precision});
    model.init_gpt2(7);
    AdamW optimizer(model, AdamWOptions{});
    std::vector<float> losses;
    for (int step = 0; step < 20; ++step) {
      model.zero_grad();
      losses.push_back(model.forward(batch.tokens, batch.targets, kB, kT));
      model.backward();
      optimizer.step(model.params(), model.grads(), 1e-2f);
    }
    // The first loss is that of near-uniform logits; 20 steps on one batch memorise
    // much of it.
    EXPECT_NEAR(losses.front(), std::log(static_cast<float>(config.vocab_size)), 0.1f)
        << dufu::trainer::precision_name(precision);
    EXPECT_LT(losses.back(), 0.6f * losses.front()) << dufu::trainer::precision_name(precision);
    last_losses.push_back(losses.back());
  }
  // bf16 rounds the matmuls' inputs: the same descent within a few percent.
  EXPECT_NEAR(last_losses[1], last_losses[0], 0.05 * last_losses[0]);
}

// ---- parameters and memory against the plan ------------------------------------

TEST_P(LlamaShapeTest, ParameterCountIsLlamasAndThePlans) {
  const GPTConfig config = this->config();
  const double C = config.d_model, hs = config.head_size(), NH = config.n_head, NKV = config.kv_heads();
  const double F = config.mlp_hidden(), Vp = config.padded_vocab_size(), L = config.n_layer;
  // Per layer: two RMSNorm weights, q, k, v, o, gate, up, down; then ln_f, wte and
  // an untied lm_head. No biases, no positions.
  const double layer = 2 * C + (NH + 2 * NKV) * hs * C + C * NH * hs + 3 * F * C;
  const double by_hand = Vp * C + L * layer + C + (config.tie_embeddings ? 0 : Vp * C);
  GPT model(config);
  EXPECT_EQ(static_cast<double>(model.num_parameters()), by_hand);
  EXPECT_EQ(model.parameter_tensors().back().name, config.tie_embeddings ? "ln_f.weight" : "lm_head.weight");

  // The plan counts a vocabulary table (wte, lm_head, a tied head's copy of wte) as
  // vocab_size + vocab_multiple x tp rows, the most padded_vocab_size(tp) can add, split
  // over the tensor group: here, the vocabulary being a multiple of vocab_multiple x tp,
  // exactly vocab_multiple x C floats per table a rank holds above its layout's.
  const double allowance = config.vocab_multiple * C;
  EXPECT_EQ(dufu::trainer::rank_parameter_count(config, 1, {}),
            by_hand + (config.tie_embeddings ? 1 : 2) * allowance);
  for (const int tp : {1, 2}) {
    const auto layout = dufu::trainer::gpt_parameter_layout(config, tp);
    const std::vector<int> split = dufu::trainer::pipeline_layer_split(config.n_layer, 2);
    for (int s = 0; s < 2; ++s) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << ", stage " << s);
      const PipelineStage stage =
          dufu::trainer::resolve_pipeline_stage(config, dufu::trainer::pipeline_stage(split, s));
      // Stage 0 holds wte; stage 1 the untied lm_head or the tied head's copy of wte.
      const double held = static_cast<double>(
          dufu::trainer::gpt_layout_size(dufu::trainer::gpt_stage_layout(config, layout, stage)));
      EXPECT_EQ(dufu::trainer::rank_parameter_count(config, tp, stage), held + allowance);
      if (tp == 1) {
        EXPECT_EQ(held,
                  static_cast<double>(GPT(config, nullptr, dufu::trainer::pipeline_stage(split, s)).num_parameters()));
      }
    }
  }
  // The weights the model allocates on construction, and its gradient on first use:
  // a float a parameter each.
  dufu::testing::CountingCpuDevice device;
  GPT counted(config, nullptr, {}, &device);
  EXPECT_EQ(static_cast<double>(device.live_bytes()), 4.0 * by_hand);
  counted.zero_grad();
  EXPECT_EQ(static_cast<double>(device.live_bytes()), 8.0 * by_hand);
}


TEST_P(LlamaShapeTest, WhatTheModelAllocatesIsWhatThePlanSays) {
  const GPTConfig config = this->config();
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    for (const Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE(std::string(dufu::trainer::precision_name(precision)) + ", recompute " +
                   dufu::trainer::recompute_name(recompute));
      const double planned = dufu::trainer::activation_bytes(config, kB, kT, 1, {}, 1, 0, precision, recompute);
      EXPECT_EQ(dufu::testing::measured_activation_bytes(config, precision, recompute, kB, kT),
                planned - dufu::testing::plan_over_count_bytes(config, precision, kB, kT));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LlamaShapeTest, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<LlamaShape>& info) { return shape_name(info.param); });

}  // namespace
