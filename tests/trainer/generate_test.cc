// Tests for sample_token and generate: exact draws computed by hand from the engine's
// bits, greedy and top-k rules, draw frequencies against softmax(logits / T) with a
// chi-square bound (fixed seeds, so deterministic), and generate's determinism, stop
// token, context cropping and agreement with a separate full forward per step.
#include "dufu/trainer/run/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "dufu/common/error.h"
#include "support/expect_error.h"
#include "support/gpt_fixture.h"

namespace dufu::trainer {
namespace {

using dufu::testing::expect_error;

// The uniform draw that sample_token makes, computed here from a copy of the engine.
double next_uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// softmax(logits / T) over the first vocab_size logits restricted to the top k (all
// when k is 0), in double; 0 outside the top k.
std::vector<double> expected_probabilities(const std::vector<float>& logits, int vocab_size, double T, int k) {
  std::vector<int> order(static_cast<std::size_t>(vocab_size));
  for (int i = 0; i < vocab_size; ++i) order[static_cast<std::size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const int keep = k == 0 ? vocab_size : std::min(k, vocab_size);
  std::vector<double> p(static_cast<std::size_t>(vocab_size), 0.0);
  double total = 0.0;
  for (int r = 0; r < keep; ++r) {
    const int id = order[static_cast<std::size_t>(r)];
    p[static_cast<std::size_t>(id)] = std::exp(static_cast<double>(logits[static_cast<std::size_t>(id)]) / T);
    total += p[static_cast<std::size_t>(id)];
  }
  for (auto& value : p) value /= total;
  return p;
}

// Pearson's chi-square statistic of `draws` draws against probabilities `p` (cells
// with p = 0 must stay empty) and its degrees of freedom.
struct ChiSquare {
  double statistic = 0.0;
  int degrees_of_freedom = -1;
};
ChiSquare chi_square(const std::vector<float>& logits, int vocab_size, float T, int k, int draws, std::uint64_t seed) {
  const auto p = expected_probabilities(logits, vocab_size, T, k);
  std::vector<int> counts(static_cast<std::size_t>(vocab_size), 0);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<std::size_t>(sample_token(logits, vocab_size, T, k, rng))];
  ChiSquare result;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the top " << k;
      continue;
    }
    const double expected = p[i] * draws;
    result.statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++result.degrees_of_freedom;
  }
  return result;
}

TEST(SampleToken, DrawsByHandFromTheEngineBits) {
  // p = (1/4, 3/4): token 0 exactly when u < 1/4.
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(3.0))};
  std::mt19937_64 rng(7);
  std::mt19937_64 copy(7);
  int zeros = 0;
  for (int i = 0; i < 200; ++i) {
    const double u = next_uniform(copy);
    const std::int32_t expected = u < 0.25 ? 0 : 1;
    ASSERT_EQ(sample_token(logits, 2, 1.0f, 0, rng), expected) << "draw " << i << " u " << u;
    zeros += expected == 0;
  }
  EXPECT_GT(zeros, 20);  // both branches exercised
  EXPECT_LT(zeros, 100);
}

TEST(SampleToken, HandComputedTopKWithTemperature) {
  // Logits (ln 1, ln 4, ln 9, -20) at T = 2 become weights (1, 2, 3, ~0); top-2 keeps
  // ids 1 and 2 (weights 2 and 3), walked in id order: id 1 exactly when u < 2/5.
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(4.0)), static_cast<float>(std::log(9.0)),
                                     -20.0f};
  std::mt19937_64 rng(11);
  std::mt19937_64 copy(11);
  for (int i = 0; i < 200; ++i) {
    const double u = next_uniform(copy);
    ASSERT_EQ(sample_token(logits, 4, 2.0f, 2, rng), u < 0.4 ? 1 : 2) << "draw " << i << " u " << u;
  }
}

TEST(SampleToken, TemperatureZeroIsArgmaxWithTiesToTheLowerId) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  std::mt19937_64 rng(1);
  std::mt19937_64 untouched(1);
  for (const int k : {0, 1, 2, 4, 9}) EXPECT_EQ(sample_token(logits, 4, 0.0f, k, rng), 1) << "top_k " << k;
  EXPECT_EQ(rng(), untouched()) << "greedy sampling must not draw";
  EXPECT_EQ(sample_token(std::vector<float>{-5.0f, -1.0f, -1.0f}, 3, 0.0f, 0, rng), 1);
}

TEST(SampleToken, TopKOneIsArgmaxAtAnyTemperature) {
  const std::vector<float> logits = {0.5f, -2.0f, 4.0f, 4.0f, 3.9f};
  std::mt19937_64 rng(3);
  for (const float T : {0.1f, 1.0f, 100.0f}) {
    for (int i = 0; i < 50; ++i) ASSERT_EQ(sample_token(logits, 5, T, 1, rng), 2) << "T " << T;
  }
}

TEST(SampleToken, TopKNeverPicksOutsideTheKLargest) {
  // A high temperature flattens the distribution, so outsiders would show up at once.
  const std::vector<float> logits = dufu::testing::random_floats(50, 5, -3.0f, 3.0f);
  std::vector<int> order(50);
  for (int i = 0; i < 50; ++i) order[static_cast<std::size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const std::set<int> top5(order.begin(), order.begin() + 5);
  std::set<int> seen;
  std::mt19937_64 rng(9);
  for (int i = 0; i < 5000; ++i) {
    const int id = sample_token(logits, 50, 50.0f, 5, rng);
    ASSERT_TRUE(top5.count(id)) << "drew " << id << ", outside the top 5";
    seen.insert(id);
  }
  EXPECT_EQ(seen, top5);

  // Ties at the boundary go to the lower ids: of four equal logits top-2 keeps 0 and 1.
  const std::vector<float> ties = {5.0f, 5.0f, 5.0f, 5.0f, 1.0f};
  std::set<int> tie_seen;
  for (int i = 0; i < 1000; ++i) tie_seen.insert(sample_token(ties, 5, 1.0f, 2, rng));
  EXPECT_EQ(tie_seen, (std::set<int>{0, 1}));
}

TEST(SampleToken, PaddingIsNeverDrawn) {
  // Five real tokens, three padding columns with logits that would dominate.
  const std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 100.0f, 100.0f, 100.0f};
  std::mt19937_64 rng(2);
  std::set<int> seen;
  for (int i = 0; i < 2000; ++i) {
    const int id = sample_token(logits, 5, 1.0f, i % 3 == 0 ? 0 : 7, rng);
    ASSERT_LT(id, 5);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(sample_token(logits, 5, 0.0f, 0, rng), 4);
}

TEST(SampleToken, FrequenciesMatchTheSoftmax) {
  // Chi-square critical values at p = 0.001: 5 dof 20.52, 3 dof 16.27, 6 dof 22.46.
  // The seeds are fixed, so the test is deterministic; the bound says the sampler is
  // right, not lucky.
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f, 50.0f};  // 50 is padding
  const auto all = chi_square(logits, 6, 1.5f, 0, 30000, 21);
  EXPECT_EQ(all.degrees_of_freedom, 5);
  EXPECT_LT(all.statistic, 20.52);
  const auto top4 = chi_square(logits, 6, 0.7f, 4, 30000, 22);
  EXPECT_EQ(top4.degrees_of_freedom, 3);
  EXPECT_LT(top4.statistic, 16.27);

  std::mt19937 make(8);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> wide(40);
  for (auto& value : wide) value = normal(make);
  const auto top7 = chi_square(wide, 40, 1.0f, 7, 30000, 23);
  EXPECT_EQ(top7.degrees_of_freedom, 6);
  EXPECT_LT(top7.statistic, 22.46);
}

TEST(SampleToken, RefusesBadArguments) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  std::mt19937_64 rng(0);
  expect_error([&] { sample_token(logits, 3, -0.5f, 0, rng); }, {"temperature", "-0.5"});
  expect_error([&] { sample_token(logits, 3, NAN, 0, rng); }, {"temperature"});
  expect_error([&] { sample_token(logits, 3, INFINITY, 0, rng); }, {"temperature"});
  expect_error([&] { sample_token(logits, 3, 1.0f, -1, rng); }, {"top_k", "-1"});
  expect_error([&] { sample_token(logits, 4, 1.0f, 0, rng); }, {"vocab_size 4", "3 logits"});
  expect_error([&] { sample_token(logits, 0, 1.0f, 0, rng); }, {"vocab_size"});
  const std::vector<float> bad = {0.0f, NAN, 2.0f};
  expect_error([&] { sample_token(bad, 3, 1.0f, 0, rng); }, {"token 1", "nan"});
  // The padding may hold anything.
  EXPECT_EQ(sample_token(bad, 1, 1.0f, 0, rng), 0);
}

// A tiny GPT with random weights; larger than GPT-2's init so its logits are far from
// uniform and greedy decoding does not just repeat the last token (the LM head is wte).
GPTConfig tiny_config() {
  // vocab_size 37 is padded to 40.
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 37, .vocab_multiple = 8, .seq_length = 8});
}

void randomize(GPT& model, std::uint32_t seed) {
  model.init_gpt2(seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const std::size_t real_wte = static_cast<std::size_t>(model.config().vocab_size * model.config().d_model);
  for (const auto& tensor : model.parameter_tensors()) {
    if (!tensor.is_matrix) continue;
    // wte's padding rows stay 0, as in a trained model.
    const std::size_t count = tensor.name == "wte.weight" ? real_wte : tensor.size();
    for (std::size_t i = 0; i < count; ++i) model.params()[tensor.offset + i] = normal(rng);
  }
}

class GenerateTest : public ::testing::Test {
 protected:
  GenerateTest() : model_(tiny_config()) { randomize(model_, 4242); }
  GPT model_;
  const std::vector<std::int32_t> prompt_ = {3, 14, 15, 9};
};

TEST_F(GenerateTest, SameSeedSameTokensAndTheRequestedLength) {
  SamplingOptions options;
  options.max_new_tokens = 20;
  options.temperature = 1.0f;
  options.seed = 17;
  const auto first = generate(model_, prompt_, options);
  ASSERT_EQ(first.size(), 20u);
  for (const auto id : first) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 37);
  }
  EXPECT_EQ(generate(model_, prompt_, options), first);
  GPT other(tiny_config());
  randomize(other, 4242);
  EXPECT_EQ(generate(other, prompt_, options), first) << "a fresh model with the same weights";
  options.seed = 18;
  EXPECT_NE(generate(model_, prompt_, options), first);

  options.max_new_tokens = 0;
  EXPECT_TRUE(generate(model_, prompt_, options).empty());
  options.max_new_tokens = 1;
  options.seed = 17;
  EXPECT_EQ(generate(model_, prompt_, options), std::vector<std::int32_t>{first[0]});
}

TEST_F(GenerateTest, StopsAfterTheStopToken) {
  SamplingOptions options;
  options.max_new_tokens = 30;
  options.seed = 5;
  const auto free_run = generate(model_, prompt_, options);
  // The first token that first appears after position 3 becomes the stop token.
  std::size_t stop_at = 0;
  for (std::size_t i = 3; i < free_run.size() && stop_at == 0; ++i) {
    if (std::find(free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(i), free_run[i]) ==
        free_run.begin() + static_cast<std::ptrdiff_t>(i)) {
      stop_at = i;
    }
  }
  ASSERT_NE(stop_at, 0u) << "the free run repeats one token";
  options.stop_token = free_run[stop_at];
  const auto stopped = generate(model_, prompt_, options);
  EXPECT_EQ(stopped,
            std::vector<std::int32_t>(free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(stop_at) + 1));
}

TEST_F(GenerateTest, CropsTheContextToSeqLength) {
  // Only the last seq_length (8) tokens matter: a 20-token prompt continues like its
  // last 8 tokens, and the output may run far past seq_length.
  std::vector<std::int32_t> long_prompt(20);
  for (std::size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<std::int32_t>((i * 7 + 2) % 37);
  SamplingOptions options;
  options.max_new_tokens = 25;
  options.seed = 99;
  options.top_k = 10;
  const auto from_long = generate(model_, long_prompt, options);
  ASSERT_EQ(from_long.size(), 25u);
  const std::vector<std::int32_t> tail(long_prompt.end() - 8, long_prompt.end());
  EXPECT_EQ(generate(model_, tail, options), from_long);
  std::vector<std::int32_t> other_head = tail;
  other_head.insert(other_head.begin(), {1, 2, 3});
  EXPECT_EQ(generate(model_, other_head, options), from_long);
}

TEST_F(GenerateTest, GreedyEqualsArgmaxOfAFullForwardPerStep) {
  SamplingOptions options;
  options.max_new_tokens = 14;  // the context passes seq_length on the way
  options.temperature = 0.0f;
  options.seed = 1;
  const auto greedy = generate(model_, prompt_, options);
  ASSERT_EQ(greedy.size(), 14u);
  options.seed = 2;
  EXPECT_EQ(generate(model_, prompt_, options), greedy) << "greedy does not depend on the seed";

  GPT reference(tiny_config());
  randomize(reference, 4242);
  const int V = reference.config().vocab_size;
  const std::size_t Vp = static_cast<std::size_t>(reference.config().padded_vocab_size());
  std::vector<std::int32_t> context = prompt_;
  for (std::size_t step = 0; step < greedy.size(); ++step) {
    const std::size_t T = std::min<std::size_t>(context.size(), 8);
    const std::vector<std::int32_t> window(context.end() - static_cast<std::ptrdiff_t>(T), context.end());
    reference.forward(window, {}, 1, static_cast<int>(T));
    const auto logits = reference.logits();
    const float* last = logits.data() + (T - 1) * Vp;
    const auto expected = static_cast<std::int32_t>(std::max_element(last, last + V) - last);
    ASSERT_EQ(greedy[step], expected) << "step " << step;
    context.push_back(expected);
  }
  std::set<std::int32_t> distinct(greedy.begin(), greedy.end());
  EXPECT_GT(distinct.size(), 1u) << "weights too uniform to test much";
}

TEST_F(GenerateTest, RefusesBadInput) {
  SamplingOptions options;
  expect_error([&] { generate(model_, std::vector<std::int32_t>{}, options); }, {"prompt is empty"});
  expect_error(
      [&] {
        generate(model_, std::vector<std::int32_t>{1, 37}, options);
      },
      {"token 37", "position 1", "vocabulary"});
  expect_error([&] { generate(model_, std::vector<std::int32_t>{-1}, options); }, {"token -1"});
  options.temperature = -1.0f;
  expect_error([&] { generate(model_, prompt_, options); }, {"temperature"});
  options = {};
  options.top_k = -3;
  expect_error([&] { generate(model_, prompt_, options); }, {"top_k"});
  options = {};
  options.max_new_tokens = -1;
  expect_error([&] { generate(model_, prompt_, options); }, {"max_new_tokens"});
  options = {};
  options.stop_token = 37;
  expect_error([&] { generate(model_, prompt_, options); }, {"stop_token 37"});
  options.stop_token = -2;
  expect_error([&] { generate(model_, prompt_, options); }, {"stop_token -2"});
}

}  // namespace
}  // namespace dufu::trainer
