// The pieces of the training loop that can be checked by hand: the learning-rate
// schedule, AdamW's weight-decay groups, gradient clipping, the FLOP count, and the
// configuration's validation messages.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/config.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/flops.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/run/lr_schedule.h"
#include "dufu/trainer/run/training_config.h"
#include "dufu/trainer/run/training_memory.h"
#include "kernel_test_support.h"
#include "support/expect_error.h"
#include "support/gpt_fixture.h"

namespace {

using dufu::Config;
using dufu::testing::expect_error;
namespace support = dufu::trainer::testing;  // kernel_test_support.h
using namespace dufu::trainer;

TEST(LearningRate, WarmupThenCosineThenFloor) {
  LrSchedule schedule{.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .decay_steps = 14};
  // Warmup: (step + 1) / 4 of the peak.
  EXPECT_DOUBLE_EQ(learning_rate(schedule, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(schedule, 3), 1.0);
  // Cosine over 10 steps from the peak: halfway is the mean of peak and floor.
  EXPECT_DOUBLE_EQ(learning_rate(schedule, 4), 1.0);
  EXPECT_NEAR(learning_rate(schedule, 9), 0.55, 1e-15);
  EXPECT_NEAR(learning_rate(schedule, 6), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.2)), 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(schedule, 14), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(schedule, 1000), 0.1);
  for (std::int64_t step = 4; step < 14; ++step) {
    EXPECT_GE(learning_rate(schedule, step), learning_rate(schedule, step + 1)) << step;
  }
}

// Warmup-stable-decay: warmup as under cosine, the peak until the decay's first step,
// then the shape down to the floor at decay_steps; the values worked out by hand.
TEST(LearningRate, WarmupStableDecay) {
  LrSchedule linear{.max_lr = 1.0, .min_lr = 0.2, .warmup_steps = 2, .decay_steps = 12,
                    .shape = LrShape::kWsdLinear, .wsd_decay_steps = 4};
  linear.validate();
  EXPECT_DOUBLE_EQ(learning_rate(linear, 0), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(linear, 1), 1.0);
  for (std::int64_t step = 2; step < 8; ++step) EXPECT_DOUBLE_EQ(learning_rate(linear, step), 1.0) << step;
  EXPECT_DOUBLE_EQ(learning_rate(linear, 8), 1.0);             // p = 0: the decay's first step
  EXPECT_NEAR(learning_rate(linear, 9), 0.2 + 0.8 * 0.75, 1e-15);  // p = 1/4
  EXPECT_NEAR(learning_rate(linear, 11), 0.2 + 0.8 * 0.25, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(linear, 12), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(linear, 100), 0.2);
  LrSchedule sqrt_shape = linear;
  sqrt_shape.shape = LrShape::kWsdOneMinusSqrt;
  EXPECT_NEAR(learning_rate(sqrt_shape, 9), 0.2 + 0.8 * 0.5, 1e-15);  // 1 - sqrt(1/4)
  EXPECT_NEAR(learning_rate(sqrt_shape, 10), 0.2 + 0.8 * (1 - std::sqrt(0.5)), 1e-15);
  // The rates before the decay do not depend on the run's length: a longer run (decay
  // ending at 40) has the same rates up to step 8 and more of the peak after.
  LrSchedule longer = linear;
  longer.decay_steps = 40;
  for (std::int64_t step = 0; step <= 8; ++step) {
    EXPECT_EQ(learning_rate(longer, step), learning_rate(linear, step)) << step;
  }
  EXPECT_DOUBLE_EQ(learning_rate(longer, 35), 1.0);
  // The fraction: 10% of 12 steps rounds to 1; a given length wins; 0 is refused.
  EXPECT_EQ(wsd_decay_length(0, 0.1, 12), 1);
  EXPECT_EQ(wsd_decay_length(0, 0.25, 12), 3);
  EXPECT_EQ(wsd_decay_length(5, 0.25, 12), 5);
  expect_error([] { wsd_decay_length(0, 0.0, 12); }, {"optim.wsd_decay_fraction must be above 0"});
  expect_error(
      [] {
        LrSchedule{.max_lr = 1.0, .min_lr = 0.0, .warmup_steps = 10, .decay_steps = 12,
                   .shape = LrShape::kWsdLinear, .wsd_decay_steps = 4}
            .validate();
      },
      {"would begin at step 8", "optim.warmup_steps = 10"});
}

TEST(LearningRate, NoWarmup) {
  LrSchedule schedule{.max_lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .decay_steps = 2};
  EXPECT_DOUBLE_EQ(learning_rate(schedule, 0), 2.0);
  EXPECT_NEAR(learning_rate(schedule, 1), 1.0, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(schedule, 2), 0.0);
}

TEST(LearningRate, ValidateNamesTheProblem) {
  expect_error([] { LrSchedule{.max_lr = 1e-4, .min_lr = 1e-3, .warmup_steps = 0, .decay_steps = 1}.validate(); },
               {"optim.min_lr", "above optim.lr"});
  expect_error([] { LrSchedule{.max_lr = 1e-3, .min_lr = 0, .warmup_steps = 10, .decay_steps = 5}.validate(); },
               {"decay ends at step 5", "optim.warmup_steps = 10"});
  expect_error([] { LrSchedule{.max_lr = -1, .min_lr = -2, .warmup_steps = 0, .decay_steps = 5}.validate(); },
               {"optim.lr must not be negative"});
}

GPTConfig tiny_model() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 1, .n_head = 2, .d_model = 8, .vocab_size = 10, .vocab_multiple = 16, .seq_length = 4});
}

// With zero gradients AdamW's update is pure decay: matrices shrink by lr·wd, biases
// and LayerNorm parameters stay as they are.
TEST(AdamWGroups, DecayOnlyOnMatrices) {
  GPT model(tiny_model());
  model.init_gpt2(3);
  for (float& p : model.params()) p = p == 0.0f ? 0.5f : p;  // no zeros, so decay shows
  const std::vector<float> before(model.params().begin(), model.params().end());
  AdamW optimizer(model, AdamWOptions{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.25f});
  model.zero_grad();
  optimizer.step(model.params(), model.grads(), 0.1f);
  EXPECT_EQ(optimizer.step_count(), 1);
  for (const ParamTensor& tensor : model.parameter_tensors()) {
    const float factor = tensor.is_matrix ? 1.0f - 0.1f * 0.25f : 1.0f;
    for (std::size_t i = 0; i < tensor.size(); ++i) {
      ASSERT_EQ(model.params()[tensor.offset + i], before[tensor.offset + i] * factor) << tensor.name;
    }
  }
  EXPECT_TRUE(model.tensor("wte.weight").is_matrix);
  EXPECT_TRUE(model.tensor("h.0.mlp.c_fc.weight").is_matrix);
  EXPECT_FALSE(model.tensor("h.0.mlp.c_fc.bias").is_matrix);
  EXPECT_FALSE(model.tensor("ln_f.weight").is_matrix);
}

// ZeRO-1's shards: two optimizers over [0, cut) and [cut, n), the cut inside a
// matrix, update exactly as one optimizer over everything.
TEST(AdamWGroups, ShardsTogetherEqualTheWhole) {
  GPT model(tiny_model());
  model.init_gpt2(5);
  std::vector<float> grads(model.num_parameters());
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(static_cast<float>(i)) * 0.01f;
  std::vector<float> whole(model.params().begin(), model.params().end());
  std::vector<float> sharded = whole;
  const AdamWOptions options{.weight_decay = 0.3f};
  AdamW full(model, options);
  const std::size_t n = model.num_parameters();
  const std::size_t cut = model.tensor("h.0.attn.c_attn.weight").offset + 7;
  AdamW first(model.parameter_tensors(), n, options, 0, cut);
  AdamW second(model.parameter_tensors(), n, options, cut, n);
  EXPECT_EQ(second.num_parameters(), n - cut);
  for (int step = 0; step < 3; ++step) {
    full.step(whole, grads, 1e-2f);
    first.step(std::span<float>(sharded).first(cut), std::span<const float>(grads).first(cut), 1e-2f);
    second.step(std::span<float>(sharded).subspan(cut), std::span<const float>(grads).subspan(cut), 1e-2f);
  }
  EXPECT_EQ(whole, sharded);
  EXPECT_TRUE(std::equal(first.m().begin(), first.m().end(), full.m().begin()));
  EXPECT_TRUE(std::equal(second.v().begin(), second.v().end(), full.v().begin() + static_cast<std::ptrdiff_t>(cut)));
}

// AdamW::step updates its whole buffer in one kernel pass whose thread chunks cut
// through tensors; per element it must still be torch.optim.AdamW with the decay of
// the element's own tensor. The oracle is a plain loop in double over each tensor,
// decaying matrices only. The step must also give exactly the bits of the per-tensor
// kernel calls it replaced, for any thread count, and a ZeRO shard that starts inside
// a matrix and ends inside a bias must give the bits of the whole optimizer's slice.
TEST(AdamWGroups, OnePassMatchesPlainLoopAndPerTensorUpdates) {
  GPTConfig config = tiny_model();
  config.n_layer = 2;
  config.d_model = 16;
  const std::vector<ParamTensor> layout = gpt_parameter_layout(config);
  const std::size_t n = layout.back().offset + layout.back().size();
  const AdamWOptions options{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f};
  const float lr = 1e-2f;  // lr * decay 5e-3: a bias decayed by mistake is far off
  constexpr int kSteps = 3;
  const std::vector<float> initial = support::random_floats(n, 90);
  std::vector<std::vector<float>> grads;
  for (int t = 1; t <= kSteps; ++t) grads.push_back(support::random_floats(n, 90 + t, -0.5f, 0.5f));
  grads[1][5] = 0.0f;  // a zero gradient still decays and moves by momentum

  support::Vec want = support::widen(initial), want_m(n, 0.0), want_v(n, 0.0);
  for (int t = 1; t <= kSteps; ++t) {
    const double beta1 = options.beta1, beta2 = options.beta2;
    const double bias_correction1 = 1.0 - std::pow(beta1, t);
    const double bias_correction2 = 1.0 - std::pow(beta2, t);
    for (const ParamTensor& tensor : layout) {
      const double decay = tensor.is_matrix ? options.weight_decay : 0.0;
      for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) {
        const double g = grads[t - 1][i];
        want[i] *= 1.0 - lr * decay;
        want_m[i] = beta1 * want_m[i] + (1.0 - beta1) * g;
        want_v[i] = beta2 * want_v[i] + (1.0 - beta2) * g * g;
        const double denom = std::sqrt(want_v[i]) / std::sqrt(bias_correction2) + options.eps;
        want[i] -= lr / bias_correction1 * want_m[i] / denom;
      }
    }
  }

  struct State {
    std::vector<float> params, m, v;
  };
  const auto with_threads = [](int threads, auto fn) {
    const int previous = omp_get_max_threads();
    omp_set_num_threads(threads);
    fn();
    omp_set_num_threads(previous);
  };
  // AdamW over [begin, end) of the buffer, on `threads` OpenMP threads.
  const auto one_pass = [&](std::size_t begin, std::size_t end, int threads) {
    AdamW optimizer(layout, n, options, begin, end);
    const auto start = std::span<const float>(initial).subspan(begin, end - begin);
    State state{{start.begin(), start.end()}, {}, {}};
    with_threads(threads, [&] {
      for (int t = 0; t < kSteps; ++t) {
        optimizer.step(state.params, std::span<const float>(grads[t]).subspan(begin, end - begin), lr);
      }
    });
    state.m.assign(optimizer.m().begin(), optimizer.m().end());
    state.v.assign(optimizer.v().begin(), optimizer.v().end());
    return state;
  };
  const auto same_bits = [](std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };

  const State whole = one_pass(0, n, 2);
  support::report_close("one pass params", support::widen(whole.params), want, {1e-7, 1e-6});
  support::report_close("one pass m", support::widen(whole.m), want_m, {3e-8, 1e-6});
  support::report_close("one pass v", support::widen(whole.v), want_v, {1e-10, 1e-6});

  State per_tensor{initial, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  with_threads(2, [&] {
    for (int t = 1; t <= kSteps; ++t) {
      for (const ParamTensor& tensor : layout) {
        const AdamWSegment one[] = {{tensor.size(), tensor.is_matrix ? options.weight_decay : 0.0f}};
        const std::size_t at = tensor.offset;
        cpu_device().kernels().adamw_update(
            per_tensor.params.data() + at, grads[t - 1].data() + at, per_tensor.m.data() + at, per_tensor.v.data() + at,
            std::span<const AdamWSegment>(one), lr, options.beta1, options.beta2, options.eps, t, 1.0f);
      }
    }
  });
  EXPECT_TRUE(same_bits(whole.params, per_tensor.params));
  EXPECT_TRUE(same_bits(whole.m, per_tensor.m));
  EXPECT_TRUE(same_bits(whole.v, per_tensor.v));

  for (const int threads : {1, 3}) {
    const State other = one_pass(0, n, threads);
    EXPECT_TRUE(same_bits(other.params, whole.params) && same_bits(other.m, whole.m) && same_bits(other.v, whole.v))
        << threads << " threads";
  }

  const auto named = [&](const std::string& name) {
    return *std::find_if(layout.begin(), layout.end(), [&](const ParamTensor& tensor) { return tensor.name == name; });
  };
  const ParamTensor first = named("h.0.attn.c_attn.weight"), last = named("h.1.ln_1.bias");
  ASSERT_TRUE(first.is_matrix && !last.is_matrix);
  const std::size_t begin = first.offset + 7, end = last.offset + 3;
  const State shard = one_pass(begin, end, 2);
  const auto slice = [&](const std::vector<float>& values) {
    return std::span<const float>(values).subspan(begin, end - begin);
  };
  EXPECT_TRUE(same_bits(shard.params, slice(whole.params)));
  EXPECT_TRUE(same_bits(shard.m, slice(whole.m)));
  EXPECT_TRUE(same_bits(shard.v, slice(whole.v)));
}

TEST(AdamWGroups, RejectsBadOptions) {
  GPT model(tiny_model());
  expect_error([&] { AdamW(model, AdamWOptions{.beta1 = 1.0f}); }, {"beta1", "[0, 1)"});
  expect_error([&] { AdamW(model, AdamWOptions{.weight_decay = -1.0f}); }, {"weight decay"});
}

TEST(GradientClipping, ScalesToTheLimitAndReportsTheNormBefore) {
  std::vector<float> grads = {3.0f, 4.0f};  // norm 5
  EXPECT_DOUBLE_EQ(clip_gradient_norm(grads, 1.0), 5.0);
  EXPECT_NEAR(grads[0], 0.6f, 1e-6);
  EXPECT_NEAR(grads[1], 0.8f, 1e-6);
  EXPECT_NEAR(gradient_norm(grads), 1.0, 1e-6);

  std::vector<float> small = {0.3f, 0.4f};
  EXPECT_NEAR(clip_gradient_norm(small, 1.0), 0.5, 1e-7);
  EXPECT_EQ(small[0], 0.3f);  // under the limit: untouched
  std::vector<float> unclipped = {30.0f, 40.0f};
  EXPECT_NEAR(clip_gradient_norm(unclipped, 0.0), 50.0, 1e-12);
  EXPECT_EQ(unclipped[0], 30.0f);  // 0 = no clipping
  std::vector<float> broken = {NAN, 1.0f};
  EXPECT_TRUE(std::isnan(clip_gradient_norm(broken, 1.0)));
}

// The trainer folds clipping into AdamW's pass (gradient_clip_scale, then step with
// that factor); it must give the bits of scaling the gradients first.
TEST(GradientClipping, FoldedIntoAdamWGivesTheBitsOfClippingFirst) {
  EXPECT_EQ(gradient_clip_scale(0.5, 1.0), 1.0f);
  EXPECT_EQ(gradient_clip_scale(50.0, 0.0), 1.0f);
  EXPECT_EQ(gradient_clip_scale(NAN, 1.0), 1.0f);
  EXPECT_EQ(gradient_clip_scale(5.0, 1.0), static_cast<float>(1.0 / (5.0 + 1e-6)));

  GPTConfig config = tiny_model();
  config.n_layer = 2;
  config.d_model = 16;
  const std::vector<ParamTensor> layout = gpt_parameter_layout(config);
  const std::size_t n = layout.back().offset + layout.back().size();
  const AdamWOptions options{.weight_decay = 0.1f};
  std::vector<float> folded_params = support::random_floats(n, 100), clipped_params = folded_params;
  AdamW folded(layout, n, options), clipped(layout, n, options);
  const int previous_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> grads = support::random_floats(n, 100 + t, -0.5f, 0.5f);  // norm ~24: clipped to 1
    const double norm = gradient_norm(grads);
    const float scale = gradient_clip_scale(norm, 1.0);
    ASSERT_LT(scale, 0.1f);
    folded.step(folded_params, grads, 1e-2f, scale);
    EXPECT_EQ(clip_gradient_norm(grads, 1.0), norm);
    clipped.step(clipped_params, grads, 1e-2f);
  }
  omp_set_num_threads(previous_threads);
  const auto same_bits = [](std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(folded_params, clipped_params));
  EXPECT_TRUE(same_bits(folded.m(), clipped.m()));
  EXPECT_TRUE(same_bits(folded.v(), clipped.v()));
}

TEST(Flops, GPT2SmallIsAbout0Point74GigaflopPerToken) {
  const GPTConfig gpt2 = gpt2_small();  // 12 layers, 768, vocab 50257 (50304 padded)
  const double per_token = gpt_training_flops_per_token(gpt2, 64);
  // 6 · (12 · 12 · 768² + 50304 · 768) + 12 · 12 · 768 · 64
  const double expected = 6.0 * (12.0 * 12 * 768 * 768 + 50304.0 * 768) + 12.0 * 12 * 768 * 64;
  EXPECT_DOUBLE_EQ(per_token, expected);
  EXPECT_NEAR(per_token / 1e9, 0.74, 0.02);
}

// docs/gpu-roofline.md (benchmarks/gpu_roofline.py; ctest gpu_roofline_doc keeps it current)
// sums its GEMM and attention rows kernel by kernel; the total must be flops.cc's count
// for the step it describes: GPT-2 124M at T = 1024.
TEST(Flops, RooflineTableSumsToTheModelCount) {
  std::ifstream doc(std::string(DUFU_SOURCE_DIR) + "/docs/gpu-roofline.md");
  ASSERT_TRUE(doc) << "docs/gpu-roofline.md";
  const std::string prefix = "- model FLOPs per token (6N + 6LCT";
  std::string line, digits;
  while (std::getline(doc, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    for (const char c : line.substr(line.rfind(':') + 1)) {
      if (c >= '0' && c <= '9') digits += c;
    }
  }
  ASSERT_FALSE(digits.empty()) << "no line starting with \"" << prefix << "\"";
  const GPTConfig gpt2 = gpt2_small();
  EXPECT_EQ(std::stod(digits), gpt_training_flops_per_token(gpt2, 1024));
}

Config config_with(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"data.blend=some/prefix"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return Config::load(training_config_schema(), "", all);
}

TEST(TrainingOptions, WsdScheduleFromTheKnobs) {
  const TrainingOptions fraction = training_options(
      config_with({"train.steps=50", "optim.warmup_steps=5", "optim.schedule=\"wsd\"", "optim.wsd_decay_fraction=0.2"}));
  EXPECT_EQ(fraction.schedule.shape, LrShape::kWsdLinear);
  EXPECT_EQ(fraction.schedule.wsd_decay_steps, 10);
  const TrainingOptions steps = training_options(config_with(
      {"train.steps=50", "optim.warmup_steps=5", "optim.schedule=\"wsd\"", "optim.wsd_decay_steps=7",
       "optim.wsd_decay_shape=\"1-sqrt\""}));
  EXPECT_EQ(steps.schedule.shape, LrShape::kWsdOneMinusSqrt);
  EXPECT_EQ(steps.schedule.wsd_decay_steps, 7);
  EXPECT_EQ(training_options(config_with({"train.steps=50", "optim.warmup_steps=5"})).schedule.shape,
            LrShape::kCosine);
  expect_error(
      [] {
        training_options(config_with({"train.steps=50", "optim.warmup_steps=5", "optim.schedule=\"wsd\"",
                                      "optim.wsd_decay_steps=48"}));
      },
      {"WSD decay of 48 steps", "before the warmup"});
}

TEST(TrainingOptions, DerivesBatchesDataAndSchedule) {
  const TrainingOptions options = training_options(
      config_with({"train.micro_batch=4", "train.global_batch=12", "train.steps=50", "optim.warmup_steps=10", "data.blend=\"0.3 A 0.7 B\"",
                   "eval.batches=3", "data.split=\"8,2,0\""}));
  EXPECT_EQ(options.accumulation_steps(), 3);
  EXPECT_EQ(options.schedule.decay_steps, 50);  // 0 = train.steps
  EXPECT_EQ(options.train_data.num_samples, 600u);
  EXPECT_EQ(options.valid_data.num_samples, 12u);
  EXPECT_EQ(options.train_data.split.megatron_part, 0);
  EXPECT_EQ(options.valid_data.split.megatron_part, 1);
  ASSERT_EQ(options.train_data.shards.size(), 2u);
  EXPECT_EQ(options.train_data.shards[1].second, "B");
  EXPECT_EQ(options.train_data.seq_length, 256u);
  EXPECT_EQ(training_options(config_with({"train.micro_batch=5"})).global_batch, 5);
}

// The split of the layers over pipeline stages, from layer counts or from LiBai-style
// stage ids, with the default model's 4 layers.
TEST(TrainingOptions, DataParallelBucketSizeIsPositiveAndBounded) {
  EXPECT_EQ(training_options(config_with({})).dp_bucket_mb, 25.0);
  EXPECT_EQ(training_options(config_with({"train.dp_bucket_mb=0.5"})).dp_bucket_mb, 0.5);
  for (const char* bad :
       {"train.dp_bucket_mb=0", "train.dp_bucket_mb=-1", "train.dp_bucket_mb=1e-7", "train.dp_bucket_mb=2e6"}) {
    expect_error([bad] { training_options(config_with({bad})); }, {"train.dp_bucket_mb must be between"});
  }
}

TEST(TrainingOptions, PipelineSplitFromLayerCountsOrStageIds) {
  EXPECT_TRUE(training_options(config_with({})).pipeline_num_layers.empty());
  EXPECT_EQ(training_options(config_with({"dist.pipeline_parallel_size=2", "dist.pipeline_num_layers=\"1,3\""}))
                .pipeline_num_layers,
            (std::vector<int>{1, 3}));
  EXPECT_EQ(training_options(config_with({"dist.pipeline_parallel_size=3",
                                          "dist.pipeline_stage_ids=\"0,1,1,2\""}))
                .pipeline_num_layers,
            (std::vector<int>{1, 2, 1}));
  expect_error(
      [] {
        training_options(config_with({"dist.pipeline_parallel_size=2", "dist.pipeline_num_layers=\"2,2\"",
                                      "dist.pipeline_stage_ids=\"0,0,1,1\""}));
      },
      {"dist.pipeline_num_layers and dist.pipeline_stage_ids", "give one"});
  expect_error(
      [] {
        training_options(
            config_with({"dist.pipeline_parallel_size=2", "dist.pipeline_stage_ids=\"0,1,0,1\""}));
      },
      {"dist.pipeline_stage_ids: pipeline stage ids: layer 2 has stage 0 after stage 1"});
  expect_error(
      [] { training_options(config_with({"dist.pipeline_parallel_size=2", "dist.pipeline_stage_ids=\"0,1\""})); },
      {"dist.pipeline_stage_ids", "2 ids for n_layer 4 layers"});
  expect_error(
      [] { training_options(config_with({"dist.pipeline_parallel_size=2", "dist.pipeline_stage_ids=\"0,x\""})); },
      {"dist.pipeline_stage_ids: 'x' is not a stage id"});
  expect_error(
      [] { training_options(config_with({"dist.pipeline_parallel_size=2", "dist.pipeline_num_layers=\"1,3a\""})); },
      {"dist.pipeline_num_layers: '3a' is not a number of layers"});
}

TEST(TrainingOptions, ErrorsNameTheKnob) {
  expect_error([] { training_options(Config::load(training_config_schema(), "", {})); }, {"data.blend is not set"});
  expect_error([] { training_options(config_with({"train.micro_batch=4", "train.global_batch=10"})); },
               {"train.global_batch (10)", "multiple of train.micro_batch (4)"});
  expect_error([] { training_options(config_with({"train.on_nonfinite=ignore"})); },
               {"train.on_nonfinite", "\"ignore\""});
  expect_error([] { training_options(config_with({"model.n_head=3"})); }, {"n_head"});
  expect_error([] { training_options(config_with({"train.steps=0"})); }, {"train.steps must be at least 1"});
  // Past the type's limit, the message gives that limit.
  expect_error([] { training_options(config_with({"model.vocab_size=2147483648"})); },
               {"model.vocab_size must be at most 2147483647, got 2147483648"});
  // 2^62 + 1 steps of 4 samples would wrap the 64-bit sample count to a training set
  // of 4 samples.
  expect_error([] { training_options(config_with({"train.steps=4611686018427387905", "train.micro_batch=4"})); },
               {"train.steps (4611686018427387905) x train.global_batch (4) x model.seq_length (256) tokens is "
                "more than a run counts"});
  expect_error([] { training_options(config_with({"train.steps=36028797018963968", "model.seq_length=256"})); },
               {"x model.seq_length (256) tokens is more than a run counts"});
  EXPECT_NO_THROW(training_options(
      config_with({"train.steps=4503599627370495", "train.micro_batch=8"})));
  expect_error([] { training_options(config_with({"train.steps=50"})); }, {"decay ends at step 50", "= 100"});
  expect_error([] { training_options(config_with({"optim.beta2=1.5"})); }, {"optim.beta2", "[0, 1)"});
  expect_error([] { training_options(config_with({"data.impl=zip"})); }, {"zip"});
  // Unknown keys and wrong types are the config layer's: checked here end to end.
  expect_error([] { config_with({"model.nlayer=4"}); }, {"model.nlayer", "did you mean \"model.n_layer\""});
  expect_error([] { config_with({"optim.lr=fast"}); }, {"optim.lr", "expected a number", "\"fast\""});
  expect_error([] { config_with({"train.steps=1.5"}); }, {"train.steps", "expected an integer"});
}

// Every float knob (all are doubles in the schema and floats in the kernels): NaN,
// an infinity, or a value beyond the float range is refused naming the knob, before
// the first update could turn every weight into NaN.
TEST(TrainingOptions, NonFiniteFloatKnobsAreRefusedNamingTheKnob) {
  int float_knobs = 0;
  const dufu::ConfigSchema schema = training_config_schema();
  for (const dufu::ConfigKnob& knob : schema.knobs()) {
    if (knob.type != dufu::ConfigType::kDouble) continue;
    ++float_knobs;
    for (const char* value : {"nan", "inf", "-inf"}) {
      expect_error([&] { training_options(config_with({knob.name + "=" + value})); },
                   {knob.name + " must be a finite number, got "});
    }
    expect_error([&] { training_options(config_with({knob.name + "=1e39"})); },
                 {knob.name + " is 1e+39, beyond the float range"});
  }
  EXPECT_GE(float_knobs, 7);  // optim.lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip
  EXPECT_NO_THROW(training_options(config_with({"optim.lr=1e30"})));  // absurd but finite: the user's call
}

double layout_parameters(const GPTConfig& config, int tp, const PipelineStage& stage) {
  double count = 0;
  for (const ParamTensor& tensor : gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage)) {
    count += static_cast<double>(tensor.size());
  }
  return count;
}

// The memory estimates: a rank's parameters as the layout counts them (within the
// padding the estimate assumes), and what cannot fit refused naming it.
TEST(TrainingMemory, CountsTheModelAndRefusesWhatCannotFit) {
  GPTConfig gpt2 = gpt2_small();  // 124M parameters
  gpt2.validate();
  PipelineStage whole;
  whole.num_layers = gpt2.n_layer;
  EXPECT_NEAR(rank_parameter_count(gpt2, 1, whole) / layout_parameters(gpt2, 1, whole), 1.0, 1e-3);
  for (const int tp : {2, 4}) {
    for (int stage = 0; stage < 3; ++stage) {
      const PipelineStage piece = pipeline_stage(pipeline_layer_split(gpt2.n_layer, 3), stage);
      EXPECT_NEAR(rank_parameter_count(gpt2, tp, piece) / layout_parameters(gpt2, tp, piece), 1.0, 1e-2)
          << "tp " << tp << " stage " << stage;
    }
  }
  // 16 bytes per parameter: weights, gradients and both moments; ZeRO-1 divides the
  // moments and adds the rank's reduced gradient shard, ZeRO-2 keeps only a window of
  // the model's own gradient (here 100 floats).
  EXPECT_DOUBLE_EQ(model_state_bytes(1000, 1, 0), 16000);
  EXPECT_DOUBLE_EQ(model_state_bytes(1000, 4, 1), 11000);
  EXPECT_DOUBLE_EQ(model_state_bytes(1000, 1, 1), 16000);  // one rank: nothing to shard
  // (and the piece one bucket of 50 floats is reduced into before it is added)
  EXPECT_DOUBLE_EQ(memory_plan(1000, 4, 2, false, 0.0, 100, 50).model(), 7600);
  EXPECT_DOUBLE_EQ(memory_plan(1000, 4, 2, false, 0.0, 100, 1e6).model(), 8400);  // at most a shard
  // The plan by kind: 4 bytes per float, the moments two floats per parameter (a
  // quarter of them on each of 4 ZeRO-1 ranks), the bf16 working copy half a float.
  const MemoryPlan plan = memory_plan(1000, 4, 1, true, 5000);
  EXPECT_DOUBLE_EQ(plan.weights, 4000);
  EXPECT_DOUBLE_EQ(plan.gradients, 5000);
  EXPECT_DOUBLE_EQ(plan.moments, 2000);
  EXPECT_DOUBLE_EQ(plan.working_copy, 2000);
  EXPECT_DOUBLE_EQ(plan.total(), 18000);
  EXPECT_EQ(plan.describe(1e9),
            "weights 4.00 kB, gradients 5.00 kB, AdamW moments 2.00 kB, bf16 working copy 2.00 kB, activations "
            "5.00 kB: 18.0 kB of at most 1.00 GB");
  // ZeRO-2's window: the edges and one layer of the stage's.
  const auto pieces = dufu::trainer::rank_parameters(gpt2, 1, whole);
  EXPECT_DOUBLE_EQ(rank_gradient_floats(gpt2, 1, whole, 2, 2), pieces.layer + pieces.edges);
  EXPECT_DOUBLE_EQ(rank_gradient_floats(gpt2, 1, whole, 1, 2), rank_parameter_count(gpt2, 1, whole));
  EXPECT_DOUBLE_EQ(rank_gradient_floats(gpt2, 1, whole, 2, 1), rank_parameter_count(gpt2, 1, whole));
  EXPECT_EQ(memory_plan(1000, 1, 0, false, 0).describe(1e9).find("working copy"), std::string::npos);
  // ZeRO-3 divides the weights too, keeping 120 floats whole (the edges and two layer
  // windows) beside a shard of 250, with a bf16 copy of those 120:
  // weights 4 (250 + 120), gradients 4 (100 + 250 + 50), moments 8 x 250, copy 2 x 120.
  EXPECT_DOUBLE_EQ(memory_plan(1000, 4, 3, true, 0.0, 100, 50, 120).model(), 1480 + 1600 + 2000 + 240);
  EXPECT_DOUBLE_EQ(memory_plan(1000, 1, 3, false, 0.0, -1, 50, 120).model(), 16000);  // one rank: nothing to shard
  EXPECT_DOUBLE_EQ(rank_weight_floats(gpt2, 1, whole, 2, 3), 2 * pieces.layer + pieces.edges);
  EXPECT_DOUBLE_EQ(rank_weight_floats(gpt2, 1, whole, 2, 2), rank_parameter_count(gpt2, 1, whole));
  EXPECT_DOUBLE_EQ(rank_gradient_floats(gpt2, 1, whole, 2, 3), pieces.layer + pieces.edges);
  // GPT-2 XL (1.5B) at dp 8 under ZeRO-3, fp32: the model state is 1/8 of stage 0's
  // plus what is held whole: the edges' weights and gradients (wte, wpe, ln_f; 82M
  // floats each), two layers of weights and one of gradients (31M floats each) and one
  // 25 MB bucket.
  GPTConfig xl = gpt2;
  xl.n_layer = 48;
  xl.n_head = 25;
  xl.d_model = 1600;
  PipelineStage xl_whole;
  xl_whole.num_layers = xl.n_layer;
  const double xl_parameters = rank_parameter_count(xl, 1, xl_whole);
  EXPECT_NEAR(xl_parameters, 1.558e9, 0.01e9);
  const auto xl_pieces = dufu::trainer::rank_parameters(xl, 1, xl_whole);
  const double bucket = kDefaultBucketMegabytes * 1024 * 1024 / 4;
  const double stage3 = memory_plan(xl_parameters, 8, 3, false, 0.0, rank_gradient_floats(xl, 1, xl_whole, 8, 3),
                                    bucket, rank_weight_floats(xl, 1, xl_whole, 8, 3))
                            .model();
  const double stage0 = memory_plan(xl_parameters, 8, 0, false, 0.0).model();
  EXPECT_NEAR(stage3, stage0 / 8 + 4 * (2 * xl_pieces.edges + 3 * xl_pieces.layer + bucket), 16.0);
  // Activations grow with the tokens of a micro-batch, and pipeline slots.
  const double one = activation_bytes(gpt2, 8, 1024, 1, whole, 1, 4, Precision::kFp32);
  EXPECT_GT(one, 8.0 * 1024 * 768 * 4 * 12);
  EXPECT_NEAR(activation_bytes(gpt2, 16, 1024, 1, whole, 1, 4, Precision::kFp32) / one, 2.0, 0.01);
  // Attention keeps one lse per row and head, no T x T matrix: the same tokens in
  // sequences twice as long need the same activation memory, under both precisions.
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    EXPECT_DOUBLE_EQ(activation_bytes(gpt2, 4, 2048, 1, whole, 1, 0, precision),
                     activation_bytes(gpt2, 8, 1024, 1, whole, 1, 0, precision));
  }
  // Sizes that wrap around 64 bits as integers stay large in the estimate.
  GPTConfig huge = gpt2;
  huge.d_model = 1 << 30;
  huge.n_head = 1;
  EXPECT_GT(rank_parameter_count(huge, 1, whole), 1e19);

  EXPECT_GT(memory_limit_bytes(), 1e8);
  EXPECT_NO_THROW(check_memory("a little", 1e6));
  expect_error([] { check_memory("the test's universe", 1e30); },
               {"not enough memory for the test's universe (needs ", "this process can have at most "});
  expect_error([] { fail_out_of_memory("the test's model", 3e12); },
               {"not enough memory for the test's model (needs about 3.00 TB"});
}

}  // namespace
