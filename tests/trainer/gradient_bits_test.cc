// Under bf16 every backward GEMM of a training step reads its dout with the bits its
// kernel kept beside it (KeptIn), which a GPU multiplies as they are instead of
// copying dout to bf16 first: so the bits must be there, and be exactly the bf16 of
// the values, at every call. Checked on a CPU device that notes each call's dout
// (the CPU reads the values, so a missing or stale bit would not show otherwise), for
// GPT-2 and Llama, serial and as two pipeline stages (the later stage's output
// gradient arrives as values and gets its bits there), and under fp32, where no bits
// are made.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "device/bf16.h"
#include "dufu/trainer/model/gpt.h"
#include "support/forwarding_cpu_device.h"
#include "support/gpt_fixture.h"

namespace dufu::trainer {
namespace {

// What one backward GEMM got as dout.
struct DoutSeen {
  std::string entry;
  bool bf16_operands;
  bool has_bits;
  std::size_t stale_bits;  // bits that are not the bf16 of their value
};

// A CPU device whose two backward GEMM entries note their dout before running.
class DoutRecordingDevice final : public dufu::testing::ForwardingCpuDevice {
 public:
  DoutRecordingDevice() : table_(cpu().kernels()) {
    table_.matmul_backward = [](TensorOut dx, float* dweight, float* dbias, KeptIn dout, TensorIn x, TensorIn weight,
                                int N, int C, int OC) {
      note("matmul_backward", dout, x, static_cast<std::size_t>(N) * static_cast<std::size_t>(OC));
      cpu().kernels().matmul_backward(dx, dweight, dbias, dout, x, weight, N, C, OC);
    };
    table_.matmul_gelu_backward = [](TensorOut dpre, float* dweight, float* dbias, KeptIn dout, TensorIn x,
                                     TensorIn weight, const float* pre, int N, int C, int OC) {
      note("matmul_gelu_backward", dout, x, static_cast<std::size_t>(N) * static_cast<std::size_t>(OC));
      cpu().kernels().matmul_gelu_backward(dpre, dweight, dbias, dout, x, weight, pre, N, C, OC);
    };
  }
  const KernelTable& kernels() const override { return table_; }

  static std::vector<DoutSeen> take_seen() {
    std::vector<DoutSeen> taken;
    taken.swap(seen());
    return taken;
  }

 private:
  static std::vector<DoutSeen>& seen() {
    static std::vector<DoutSeen> calls;
    return calls;
  }
  static void note(const char* entry, KeptIn dout, TensorIn x, std::size_t count) {
    std::size_t stale = 0;
    if (dout.bits != nullptr) {
      for (std::size_t i = 0; i < count; ++i) stale += dout.bits[i] != float_to_bf16_bits(dout.values[i]);
    }
    seen().push_back({entry, x.bf16(), dout.bits != nullptr, stale});
  }

  KernelTable table_;
};

constexpr int kB = 2;
constexpr int kT = 6;

GPTConfig model_config(bool llama) {
  GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 37, .vocab_multiple = 8, .seq_length = kT});
  if (llama) {
    config.arch = Architecture::kLlama;
    config.n_kv_head = 1;
    config.ffn_hidden = 24;
    config.tie_embeddings = false;
  }
  config.validate();
  return config;
}

// Every call as a line, for a failure's message.
std::string described(const std::vector<DoutSeen>& calls) {
  std::string text;
  for (const DoutSeen& call : calls) {
    text += str_cat(call.entry, call.bf16_operands ? " bf16" : " fp32", call.has_bits ? " with bits" : " no bits",
                    ", stale ", call.stale_bits, "\n");
  }
  return text;
}

// Under bf16 every call with its bits, none stale; under fp32 none with bits. `calls`
// backward GEMMs in all: GPT-2's four per layer and the head, Llama's the same.
void expect_douts(const std::vector<DoutSeen>& calls, Precision precision, std::size_t expected_calls) {
  EXPECT_EQ(calls.size(), expected_calls) << described(calls);
  for (const DoutSeen& call : calls) {
    EXPECT_EQ(call.bf16_operands, precision == Precision::kBf16) << described(calls);
    EXPECT_EQ(call.has_bits, precision == Precision::kBf16) << described(calls);
    EXPECT_EQ(call.stale_bits, 0u) << described(calls);
  }
}

class GradientBitsTest : public ::testing::TestWithParam<bool> {};

TEST_P(GradientBitsTest, EveryBackwardGemmReadsTheBitsOfItsDout) {
  const GPTConfig config = model_config(GetParam());
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    DoutRecordingDevice device;
    GPT model(config, nullptr, {}, &device, GPTRecipe{.precision = precision});
    model.init_gpt2(3);
    // Two steps: the second reads bits its buffers already held from the first, and
    // ignores another position, whose row of the logits' gradient is zero only if the
    // classifier keeps ignored rows too (the padding columns 37..39 as well).
    for (const std::size_t ignored : {std::size_t{3}, std::size_t{8}}) {
      const auto batch = dufu::testing::next_token_batch(kB, kT, config.vocab_size, 17, {ignored});
      DoutRecordingDevice::take_seen();
      model.zero_grad();
      model.forward(batch.tokens, batch.targets, kB, kT);
      model.backward();
      expect_douts(DoutRecordingDevice::take_seen(), precision, 4u * config.n_layer + 1);
    }
  }
}

TEST_P(GradientBitsTest, TwoPipelineStagesKeepTheBitsOfTheGradientPassedBetweenThem) {
  const GPTConfig config = model_config(GetParam());
  const auto batch = dufu::testing::next_token_batch(kB, kT, config.vocab_size, 18, {});
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    DoutRecordingDevice device;
    const bool tied = config.tie_embeddings;
    GPT first(config, nullptr, PipelineStage{.stage = 0, .num_stages = 2, .first_layer = 0, .num_layers = 1,
                                             .tied_head = tied},
              &device, GPTRecipe{.precision = precision});
    GPT last(config, nullptr, PipelineStage{.stage = 1, .num_stages = 2, .first_layer = 1, .num_layers = 1,
                                            .tied_head = tied},
             &device, GPTRecipe{.precision = precision});
    for (GPT* stage : {&first, &last}) stage->init_gpt2(4);
    DoutRecordingDevice::take_seen();
    first.forward_stage(0, batch.tokens, {}, {}, kB, kT, 1.0f);
    last.forward_stage(0, {}, first.stage_output(0), batch.targets, kB, kT, 1.0f / (kB * kT));
    const std::span<const float> d_input = last.backward_stage(0, {});
    expect_douts(DoutRecordingDevice::take_seen(), precision, 4u + 1);
    first.backward_stage(0, d_input);
    expect_douts(DoutRecordingDevice::take_seen(), precision, 4u);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GradientBitsTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Llama" : "Gpt2"; });

}  // namespace
}  // namespace dufu::trainer
