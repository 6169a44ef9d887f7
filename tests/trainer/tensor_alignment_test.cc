// Every activation a matmul reads or writes starts on kTensorAlignmentBytes, whatever
// the number of rows: an odd prompt length gives LayerNorm statistics of 4 N bytes,
// which, were they not rounded up, would shift every tensor carved after them off
// cuBLASLt's 256-byte alignment (NOT_SUPPORTED or a misaligned address on a GPU). Checked on a CPU device
// that notes misaligned operands (support/alignment_checking_device.h), under both
// precisions, for generation and for a training step.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/run/generate.h"
#include "support/alignment_checking_device.h"
#include "support/gpt_fixture.h"

namespace dufu::trainer {
namespace {

using dufu::testing::AlignmentCheckingDevice;

GPTConfig odd_sizes_model() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 37, .vocab_multiple = 8, .seq_length = 16});
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

TEST(TensorAlignment, GenerationWithAnOddPromptLength) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    AlignmentCheckingDevice device;
    GPT model(odd_sizes_model(), nullptr, {}, &device, GPTRecipe{.precision = precision});
    model.init_gpt2(5);
    AlignmentCheckingDevice::take_misaligned();
    SamplingOptions options;
    options.max_new_tokens = 3;  // forwards over 5, 6 and 7 positions
    EXPECT_EQ(generate(model, std::vector<std::int32_t>{3, 14, 15, 9, 2}, options).size(), 3u);
    const std::vector<std::string> misaligned = AlignmentCheckingDevice::take_misaligned();
    EXPECT_TRUE(misaligned.empty()) << joined(misaligned);
  }
}

TEST(TensorAlignment, TrainingStepWithAnOddNumberOfRows) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    AlignmentCheckingDevice device;
    GPT model(odd_sizes_model(), nullptr, {}, &device, GPTRecipe{.precision = precision});
    model.init_gpt2(6);
    AlignmentCheckingDevice::take_misaligned();
    const auto batch = dufu::testing::next_token_batch(1, 7, odd_sizes_model().vocab_size, 3, {});
    model.forward(batch.tokens, batch.targets, 1, 7);
    model.backward();
    const std::vector<std::string> misaligned = AlignmentCheckingDevice::take_misaligned();
    EXPECT_TRUE(misaligned.empty()) << joined(misaligned);
  }
}

}  // namespace
}  // namespace dufu::trainer
