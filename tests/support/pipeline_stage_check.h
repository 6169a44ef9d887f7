// The in-process pipeline check that the bf16 storage and recompute tests share: a
// model cut into two stages, fed two micro-batches whose forwards both run through the
// first stage before either backward (as in the 1F1B schedule), so each backward must
// read its own micro-batch's activations (or recompute them), not those of the later
// forward; the tail's losses and the stages' gradients are the whole model's bits.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/gpt_layout.h"
#include "dufu/trainer/model/gpt_pieces.h"
#include "support/gpt_fixture.h"

namespace dufu::testing {

// Gradients of every parameter a stage holds, in the serial layout (0 where the stage
// does not hold the tensor).
inline std::vector<float> serial_layout_gradients(const trainer::GPT& model) {
  std::vector<float> full(trainer::gpt_layout_size(trainer::gpt_parameter_layout(model.config())), 0.0f);
  const std::vector<float> grads(model.grads().begin(), model.grads().end());
  trainer::unstage_gpt_buffer(model.config(), model.pipeline_stage(), grads, full);
  return full;
}

struct PipelineStageCheck {
  trainer::Precision precision;
  trainer::Recompute recompute;
  int B;
  int T;
  // The first micro-batch is next_token_batch(..., first_seed, {first_ignored}), the
  // second next_token_batch(..., first_seed + 1, {}).
  std::uint32_t first_seed;
  std::size_t first_ignored;
  // The tail's order: both forwards then both backwards, or each forward followed by
  // its backward (the first stage always runs both forwards first).
  bool tail_forwards_first;
};

// Runs the check on `config` cut into two stages; fails the calling test where a loss
// or a gradient differs. A tied wte's two gradients are summed in one buffer by the
// serial model and in two by the stages, so it alone is left out; every other tensor
// (an untied wte and lm_head included) is compared bit for bit.
inline void expect_pipeline_stages_match_whole_model(const trainer::GPTConfig& config,
                                                      const PipelineStageCheck& check) {
  const int B = check.B;
  const int T = check.T;
  const auto first_batch = next_token_batch(B, T, config.vocab_size, check.first_seed, {check.first_ignored});
  const auto second_batch = next_token_batch(B, T, config.vocab_size, check.first_seed + 1, {});
  const float scale = 1.0f / static_cast<float>(2 * B * T - 1);

  trainer::GPT whole(config, nullptr, {}, nullptr, trainer::GPTRecipe{.precision = check.precision});
  whole.init_gpt2(5);
  whole.zero_grad();
  const float whole_first = whole.forward(first_batch.tokens, first_batch.targets, B, T, scale);
  whole.backward();
  const float whole_second = whole.forward(second_batch.tokens, second_batch.targets, B, T, scale);
  whole.backward();

  const std::vector<int> split = trainer::pipeline_layer_split(config.n_layer, 2);
  const trainer::GPTRecipe stage_recipe{.precision = check.precision, .recompute = check.recompute};
  trainer::GPT head(config, nullptr, trainer::pipeline_stage(split, 0), nullptr, stage_recipe);
  trainer::GPT tail(config, nullptr, trainer::pipeline_stage(split, 1), nullptr, stage_recipe);
  for (trainer::GPT* stage : {&head, &tail}) {
    stage->init_gpt2(5);
    stage->zero_grad();
  }
  // Both micro-batches go through the first stage before either comes back: the
  // second forward overwrites the working layer the first one computed in.
  head.forward_stage(0, first_batch.tokens, {}, {}, B, T, scale);
  head.forward_stage(1, second_batch.tokens, {}, {}, B, T, scale);
  const std::vector<float> first_output(head.stage_output(0).begin(), head.stage_output(0).end());
  const std::vector<float> second_output(head.stage_output(1).begin(), head.stage_output(1).end());
  const auto tail_backward = [&tail](int slot) {
    const std::span<const float> grad = tail.backward_stage(slot, {});
    return std::vector<float>(grad.begin(), grad.end());
  };
  const float tail_first = tail.forward_stage(0, {}, first_output, first_batch.targets, B, T, scale);
  std::vector<float> first_d_output;
  if (!check.tail_forwards_first) first_d_output = tail_backward(0);
  const float tail_second = tail.forward_stage(1, {}, second_output, second_batch.targets, B, T, scale);
  if (check.tail_forwards_first) first_d_output = tail_backward(0);
  const std::vector<float> second_d_output = tail_backward(1);
  head.backward_stage(0, first_d_output);
  head.backward_stage(1, second_d_output);

  EXPECT_EQ(tail_first, whole_first);
  EXPECT_EQ(tail_second, whole_second);
  const std::vector<float> expected = serial_layout_gradients(whole);
  const std::vector<float> head_grads = serial_layout_gradients(head);
  const std::vector<float> tail_grads = serial_layout_gradients(tail);
  int compared = 0;
  for (const auto& tensor : whole.parameter_tensors()) {
    if (tensor.name == "wte.weight" && config.tie_embeddings) continue;
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) {
      ASSERT_EQ(head_grads[i] + tail_grads[i], expected[i]) << tensor.name << " [" << i - tensor.offset << "]";
      ++compared;
    }
  }
  EXPECT_GT(compared, 10000);
}

}  // namespace dufu::testing
