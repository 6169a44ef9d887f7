// The bf16 storage of activations under train.precision = bf16: what a model allocates
// for its activations, measured on a counting device, against the memory plan's
// estimate (training_memory.h) under both precisions, and the half that bf16 storage
// saves on the tensors a backward reads; and pipeline activation slots whose forwards
// run before their backwards (as in the 1F1B schedule), so each backward must read its
// own micro-batch's bf16 copies, not the working layer the later forward overwrote.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/gpt_layout.h"
#include "dufu/trainer/model/gpt_pieces.h"
#include "dufu/trainer/run/training_memory.h"
#include "support/activation_bytes.h"
#include "support/counting_cpu_device.h"
#include "support/gpt_fixture.h"

namespace {

using dufu::trainer::GPT;
using dufu::trainer::GPTConfig;
using dufu::trainer::Precision;

// The vocabulary is a multiple of vocab_multiple, so the plan's padding allowance (a
// whole vocab_multiple of logit columns) is exactly what it over-counts.
GPTConfig storage_model() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 3, .n_head = 2, .d_model = 32, .vocab_size = 64, .vocab_multiple = 16, .seq_length = 16});
}

constexpr int kB = 4;
constexpr int kT = 16;

double measured_activation_bytes(Precision precision) {
  return dufu::testing::measured_activation_bytes(storage_model(), precision, dufu::trainer::Recompute::kNone, kB, kT);
}

TEST(Bf16Storage, ActivationMemoryIsWhatThePlanSays) {
  const GPTConfig config = storage_model();
  const double N = kB * kT;
  // The plan's allowances the model does not allocate: the padding columns of the
  // logits it assumes and the loss the model keeps on the device (one float, which
  // the plan leaves out), whatever the precision.
  const double padding = 4.0 * N * config.vocab_multiple;
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(dufu::trainer::precision_name(precision));
    const double planned = dufu::trainer::activation_bytes(config, kB, kT, 1, {}, 1, 0, precision);
    EXPECT_EQ(measured_activation_bytes(precision), planned - padding + 4.0);
  }
}

TEST(Bf16Storage, HalvesTheActivationsTheBackwardReads) {
  const GPTConfig config = storage_model();
  const double N = kB * kT;
  const double C = config.d_model;
  const double L = config.n_layer;
  // Per layer the backward reads ln_1, ln_2, the two residuals, qkv, the attention
  // output and the MLP's two hidden tensors (4C + 12C floats per token); attention's
  // lse and the stage's output stay fp32. bf16 keeps them in 2 bytes instead of 4, and
  // computes a layer in an fp32 working layer of 5C + 12C floats per token; the LM
  // head reads a bf16 copy of ln_f besides its fp32 one.
  const double kept = L * 16.0 * C * N - C * N;
  const double working_layer = 17.0 * C * N;
  const double ln_f_copy = C * N;
  EXPECT_EQ(measured_activation_bytes(Precision::kFp32) - measured_activation_bytes(Precision::kBf16),
            2.0 * kept - 4.0 * working_layer - 2.0 * ln_f_copy);
}

// Gradients of every parameter a stage holds but wte, in the serial layout (0 where
// the stage does not hold the tensor).
std::vector<float> full_gradients(const GPT& model) {
  std::vector<float> full(dufu::trainer::gpt_layout_size(dufu::trainer::gpt_parameter_layout(model.config())), 0.0f);
  const std::vector<float> grads(model.grads().begin(), model.grads().end());
  dufu::trainer::unstage_gpt_buffer(model.config(), model.pipeline_stage(), grads, full);
  return full;
}

TEST(Bf16Storage, PipelineSlotsKeepTheirOwnActivations) {
  const GPTConfig config = storage_model();
  const auto first_batch = dufu::testing::next_token_batch(kB, kT, config.vocab_size, 21, {3});
  const auto second_batch = dufu::testing::next_token_batch(kB, kT, config.vocab_size, 22, {});
  const float scale = 1.0f / static_cast<float>(2 * kB * kT - 1);

  GPT whole(config);
  whole.set_precision(Precision::kBf16);
  whole.init_gpt2(5);
  whole.zero_grad();
  const float whole_first = whole.forward(first_batch.tokens, first_batch.targets, kB, kT, scale);
  whole.backward();
  const float whole_second = whole.forward(second_batch.tokens, second_batch.targets, kB, kT, scale);
  whole.backward();

  const std::vector<int> split = dufu::trainer::pipeline_layer_split(config.n_layer, 2);
  GPT head(config, nullptr, dufu::trainer::pipeline_stage(split, 0));
  GPT tail(config, nullptr, dufu::trainer::pipeline_stage(split, 1));
  for (GPT* stage : {&head, &tail}) {
    stage->set_precision(Precision::kBf16);
    stage->init_gpt2(5);
    stage->zero_grad();
  }
  // Both micro-batches go through the first stage before either comes back: the
  // second forward overwrites the working layer the first one computed in.
  head.forward_stage(0, first_batch.tokens, {}, {}, kB, kT, scale);
  head.forward_stage(1, second_batch.tokens, {}, {}, kB, kT, scale);
  const std::vector<float> first_output(head.stage_output(0).begin(), head.stage_output(0).end());
  const std::vector<float> second_output(head.stage_output(1).begin(), head.stage_output(1).end());
  const float tail_first = tail.forward_stage(0, {}, first_output, first_batch.targets, kB, kT, scale);
  const std::span<const float> first_grad = tail.backward_stage(0, {});
  const std::vector<float> first_d_output(first_grad.begin(), first_grad.end());
  const float tail_second = tail.forward_stage(1, {}, second_output, second_batch.targets, kB, kT, scale);
  const std::span<const float> second_grad = tail.backward_stage(1, {});
  const std::vector<float> second_d_output(second_grad.begin(), second_grad.end());
  head.backward_stage(0, first_d_output);
  head.backward_stage(1, second_d_output);

  EXPECT_EQ(tail_first, whole_first);
  EXPECT_EQ(tail_second, whole_second);
  // The serial model sums wte's two gradients in one buffer, the stages in two: every
  // other gradient is the serial model's, bit for bit.
  const std::vector<float> expected = full_gradients(whole);
  const std::vector<float> head_grads = full_gradients(head);
  const std::vector<float> tail_grads = full_gradients(tail);
  int compared = 0;
  for (const auto& tensor : whole.parameter_tensors()) {
    if (tensor.name == "wte.weight") continue;
    std::size_t count = 1;
    for (const std::size_t extent : tensor.shape) count *= extent;
    for (std::size_t i = tensor.offset; i < tensor.offset + count; ++i) {
      ASSERT_EQ(head_grads[i] + tail_grads[i], expected[i]) << tensor.name << " [" << i - tensor.offset << "]";
      ++compared;
    }
  }
  EXPECT_GT(compared, 10000);
}

}  // namespace
