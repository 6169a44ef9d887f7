// The declarations every user of a knob asks: the knob table (training_knobs.h)
// against what is derived from it (the generated docs/config-reference.md, the
// structs' defaults, the ranges the reader enforces), the rule book's refusals, which
// the configuration and the model must word alike, and what a ZeRO stage shards.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dufu/common/config.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/recipe_rules.h"
#include "dufu/trainer/model/training_knobs.h"
#include "dufu/trainer/model/zero_stage.h"
#include "dufu/trainer/run/training_config.h"

namespace {

using namespace dufu::trainer;
using dufu::Config;

Config defaults_with(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "data.blend=some/prefix");
  return Config::load(training_config_schema(), "", overrides);
}

std::string error_of(auto&& action) {
  try {
    action();
  } catch (const dufu::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainingKnobs, TheReferencePageIsTheTablesOwn) {
  const std::string path = std::string(DUFU_SOURCE_DIR) + "/docs/config-reference.md";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path;
  const std::string on_disk((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(on_disk == training_config_reference())
      << "docs/config-reference.md is stale: run `train config-reference > docs/config-reference.md`";
  // Every knob has its row, with its range where it has one.
  for (const dufu::KnobSpec& knob : kTrainingKnobs) {
    EXPECT_NE(on_disk.find("| `" + std::string(knob.name) + "` |"), std::string::npos) << knob.name;
  }
  EXPECT_NE(on_disk.find("| `dist.zero_stage` | int | `0` | 0 to 3 |"), std::string::npos);
  EXPECT_NE(on_disk.find("| `train.recompute` | string | `\"none\"` | none \\| selective \\| full |"),
            std::string::npos);
}

// What the table's defaults read into equals the structs' own defaults: no struct
// keeps a default of its own that the table does not say.
TEST(TrainingKnobs, TheStructsDefaultsAreTheTables) {
  const TrainingOptions read = training_options(defaults_with({}));
  const TrainingOptions built;
  const GPTConfig model;
  for (const GPTConfig* config : {&read.model, &built.model, &model}) {
    EXPECT_EQ(config->arch, Architecture::kGpt2);
    EXPECT_EQ(config->n_layer, read.model.n_layer);
    EXPECT_EQ(config->n_head, read.model.n_head);
    EXPECT_EQ(config->d_model, read.model.d_model);
    EXPECT_EQ(config->vocab_size, read.model.vocab_size);
    EXPECT_EQ(config->vocab_multiple, read.model.vocab_multiple);
    EXPECT_EQ(config->seq_length, read.model.seq_length);
    EXPECT_EQ(config->n_kv_head, read.model.n_kv_head);
    EXPECT_EQ(config->ffn_hidden, read.model.ffn_hidden);
    EXPECT_EQ(config->rope_theta, read.model.rope_theta);
    EXPECT_EQ(config->norm_eps, read.model.norm_eps);
    EXPECT_EQ(config->tie_embeddings, read.model.tie_embeddings);
  }
  EXPECT_EQ(read.model.n_layer, 4);  // the table's, not GPT-2 small's 12
  EXPECT_EQ(read.init_seed, built.init_seed);
  EXPECT_EQ(read.loader_workers, built.loader_workers);
  EXPECT_EQ(read.prefetch_batches, built.prefetch_batches);
  EXPECT_EQ(read.allow_changed_shards, built.allow_changed_shards);
  EXPECT_EQ(read.micro_batch, built.micro_batch);
  EXPECT_EQ(read.global_batch, built.global_batch);
  EXPECT_EQ(read.steps, built.steps);
  EXPECT_EQ(read.exit_at_step, built.exit_at_step);
  EXPECT_EQ(read.on_nonfinite, built.on_nonfinite);
  EXPECT_EQ(read.threads, built.threads);
  EXPECT_EQ(read.device, built.device);
  EXPECT_EQ(read.precision, built.precision);
  EXPECT_EQ(read.recompute, built.recompute);
  EXPECT_EQ(read.attention_products, built.attention_products);
  EXPECT_EQ(read.memory_limit_bytes, built.memory_limit_bytes);
  EXPECT_EQ(read.dp_bucket_mb, built.dp_bucket_mb);
  EXPECT_EQ(read.schedule.max_lr, built.schedule.max_lr);
  EXPECT_EQ(read.schedule.min_lr, built.schedule.min_lr);
  EXPECT_EQ(read.schedule.warmup_steps, built.schedule.warmup_steps);
  EXPECT_EQ(read.schedule.decay_steps, built.schedule.decay_steps);
  EXPECT_EQ(read.adamw.beta1, built.adamw.beta1);
  EXPECT_EQ(read.adamw.beta2, built.adamw.beta2);
  EXPECT_EQ(read.adamw.eps, built.adamw.eps);
  EXPECT_EQ(read.adamw.weight_decay, built.adamw.weight_decay);
  EXPECT_EQ(read.grad_clip, built.grad_clip);
  EXPECT_EQ(read.eval_interval, built.eval_interval);
  EXPECT_EQ(read.eval_batches, built.eval_batches);
  EXPECT_EQ(read.checkpoint_interval, built.checkpoint_interval);
  EXPECT_EQ(read.checkpoint_keep, built.checkpoint_keep);
  EXPECT_EQ(read.tensor_parallel_size, built.tensor_parallel_size);
  EXPECT_EQ(read.pipeline_parallel_size, built.pipeline_parallel_size);
  EXPECT_EQ(read.pipeline_num_layers, built.pipeline_num_layers);
  EXPECT_EQ(read.zero_stage, built.zero_stage);
  EXPECT_EQ(read.reduce_each_micro_batch, built.reduce_each_micro_batch);
  EXPECT_EQ(read.overlap_reduction, built.overlap_reduction);
  EXPECT_EQ(read.optimizer_offload, built.optimizer_offload);
  EXPECT_EQ(read.run_dir, built.run_dir);
  EXPECT_EQ(read.log_interval, built.log_interval);
}

// Each declared bound is the one the reader enforces: the value at the bound is
// taken and the one past it refused naming the knob.
TEST(TrainingKnobs, TheReaderEnforcesTheDeclaredRanges) {
  int bounded = 0;
  for (const dufu::KnobSpec& knob : kTrainingKnobs) {
    if (knob.type != dufu::ConfigType::kInt) continue;
    const std::string name(knob.name);
    // Knobs whose value must also agree with others are left to their own tests.
    if (name == "train.global_batch" || name == "model.n_head" || name == "model.n_kv_head" ||
        name == "model.ffn_hidden" || name == "model.d_model" || name == "dist.pipeline_parallel_size" ||
        name == "model.n_layer" || name == "dist.tensor_parallel_size") {
      continue;
    }
    ++bounded;
    EXPECT_EQ(error_of([&] { training_options(defaults_with({"optim.warmup_steps=0", name + "=" + std::to_string(knob.range.int_min)})); }),
              "")
        << name;
    if (knob.range.int_min > std::numeric_limits<std::int64_t>::min()) {
      EXPECT_NE(error_of([&] {
                  training_options(defaults_with({"optim.warmup_steps=0", name + "=" + std::to_string(knob.range.int_min - 1)}));
                }).find(name + " must be"),
                std::string::npos)
          << name;
    }
    if (knob.range.int_max < std::numeric_limits<std::int64_t>::max()) {
      EXPECT_NE(error_of([&] {
                  training_options(defaults_with({"optim.warmup_steps=0", name + "=" + std::to_string(knob.range.int_max + 1)}));
                }).find(name + " must be"),
                std::string::npos)
          << name;
    }
  }
  EXPECT_GE(bounded, 15);
  EXPECT_EQ(error_of([] { training_options(defaults_with({"dist.zero_stage=4"})); }),
            "dist.zero_stage must be in [0, 3], got 4");
  EXPECT_EQ(error_of([] { training_options(defaults_with({"optim.beta2=1"})); }),
            "optim.beta2 must be in [0, 1), got 1");
  EXPECT_EQ(error_of([] { training_options(defaults_with({"train.precision=fp16"})); }),
            "train.precision must be \"fp32\" or \"bf16\", got \"fp16\"");
  const std::string help = training_config_schema().help_text();
  EXPECT_NE(help.find("dist.zero_stage (int, default 0, 0 to 3)"), std::string::npos) << help;
  EXPECT_NE(help.find("optim.beta1 (double, default 0.9, in [0, 1))"), std::string::npos) << help;
}

// One rule, one message: the configuration and the model refuse offload at ZeRO-3
// and offload under fp32 in the rule book's words, and `train plan --search` asks the
// same book (tools/train/stage_plans.cc).
TEST(RecipeRules, TheConfigurationAndTheModelRefuseInTheSameWords) {
  const std::string zero3 = recipe_refusal({.precision = Precision::kBf16, .optimizer_offload = true, .zero_stage = 3});
  ASSERT_FALSE(zero3.empty());
  EXPECT_EQ(error_of([] {
              training_options(defaults_with(
                  {"optim.offload=cpu", "dist.zero_stage=3", "train.device=cuda", "train.precision=bf16"}));
            }),
            zero3);
  const std::string fp32 = recipe_refusal({.optimizer_offload = true});
  ASSERT_FALSE(fp32.empty());
  EXPECT_EQ(error_of([] {
              training_options(defaults_with({"optim.offload=cpu", "train.device=cuda"}));
            }),
            fp32);
  GPTConfig small;
  small.n_layer = 1;
  small.d_model = 16;
  small.n_head = 2;
  small.vocab_size = 64;
  small.seq_length = 8;
  const std::string on_host = recipe_refusal({.precision = Precision::kBf16, .optimizer_offload = true,
                                              .device_memory_is_host = true});
  EXPECT_EQ(error_of([&] {
              GPT model(small, nullptr, {}, &cpu_device(),
                        GPTRecipe{.precision = Precision::kBf16, .optimizer_offload = true});
            }),
            on_host);
  EXPECT_EQ(error_of([] {
              training_options(defaults_with({"optim.offload=cpu", "train.precision=bf16"}));
            }),
            on_host);
  // The constructor judges the recipe whole: bf16 attention products under fp32 too.
  const std::string products = recipe_refusal({.attention_products = Precision::kBf16});
  ASSERT_FALSE(products.empty());
  EXPECT_EQ(error_of([&] {
              GPT model(small, nullptr, {}, &cpu_device(), GPTRecipe{.attention_products = Precision::kBf16});
            }),
            products);
  EXPECT_EQ(error_of([] { training_options(defaults_with({"train.attention_products=bf16"})); }), products);
  EXPECT_EQ(recipe_refusal({}), "");
  EXPECT_EQ(recipe_refusal({.precision = Precision::kBf16, .attention_products = Precision::kBf16}), "");
  EXPECT_NE(recipe_refusal({.attention_products = Precision::kBf16}), "");
  EXPECT_NE(recipe_refusal({.zero_stage = 1, .reduce_each_micro_batch = true}), "");
}

// What each stage shards at each data-parallel size, as a table: over one rank
// nothing, whatever the stage.
TEST(ZeroStage, ShardsByStageAndDataParallelSize) {
  struct Row {
    int stage, dp;
    bool optimizer_state, gradients, parameters;
  };
  const Row rows[] = {{0, 1, false, false, false}, {0, 4, false, false, false}, {1, 1, false, false, false},
                      {1, 2, true, false, false},  {2, 1, false, false, false}, {2, 2, true, true, false},
                      {3, 1, false, false, false}, {3, 8, true, true, true}};
  for (const Row& row : rows) {
    const ZeroStage zero(row.stage, row.dp);
    SCOPED_TRACE("stage " + std::to_string(row.stage) + " at dp " + std::to_string(row.dp));
    EXPECT_EQ(zero.shards_optimizer_state(), row.optimizer_state);
    EXPECT_EQ(zero.shards_gradients(), row.gradients);
    EXPECT_EQ(zero.shards_parameters(), row.parameters);
  }
  EXPECT_ANY_THROW(ZeroStage(4, 2));
}

}  // namespace
