// The bf16 recipe's rounding (bf16.h) against torch's own float32 -> bfloat16
// conversion (tests/reference/bf16_reference.py) bit for bit, the CPU's round_to_bf16
// kernel against the helper, and the GPT under train.precision = bf16 without data:
// fp32 untouched by the knob, bf16 close to fp32 but not equal, deterministic, and
// its working copy of the weights following the fp32 masters.
#include "device/bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/config.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/run/training_config.h"
#include "support/expect_error.h"
#include "support/forwarding_cpu_device.h"
#include "support/gpt_fixture.h"
#include "support/tool_runner.h"

namespace {

using namespace dufu::trainer;

float float_from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

struct TorchConversion {
  std::uint32_t float_bits;
  std::uint16_t bf16_bits;
};

// Every line the reference prints: a float's bits and torch's bf16 bits for it.
std::vector<TorchConversion> torch_conversions() {
  const std::string command =
      dufu::str_cat(DUFU_REFERENCE_PYTHON, " ", DUFU_SOURCE_DIR, "/tests/reference/bf16_reference.py");
  const dufu::testing::CommandResult result = dufu::testing::run_command(command);
  EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.output;
  std::vector<TorchConversion> conversions;
  std::istringstream lines(result.output);
  std::string float_hex;
  std::string bf16_hex;
  while (lines >> float_hex >> bf16_hex) {
    conversions.push_back({static_cast<std::uint32_t>(std::stoul(float_hex, nullptr, 16)),
                           static_cast<std::uint16_t>(std::stoul(bf16_hex, nullptr, 16))});
  }
  return conversions;
}

bool is_quiet_nan_bf16(std::uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u && (bits & 0x0040u) != 0; }

TEST(Bf16Rounding, MatchesTorchBitForBit) {
  const std::vector<TorchConversion> conversions = torch_conversions();
  ASSERT_GE(conversions.size(), 25000u);  // the edge cases and both random sets
  std::vector<float> values;
  int nans = 0;
  for (const TorchConversion& c : conversions) {
    const float value = float_from_bits(c.float_bits);
    values.push_back(value);
    const std::uint16_t ours = float_to_bf16_bits(value);
    if (std::isnan(value)) {
      // torch writes 0xffff (vectorized) or 0x7fc0 (scalar) for any NaN; the recipe
      // keeps the sign and sets the quiet bit.
      ++nans;
      EXPECT_TRUE(is_quiet_nan_bf16(c.bf16_bits)) << std::hex << c.float_bits;
      EXPECT_TRUE(is_quiet_nan_bf16(ours)) << std::hex << c.float_bits << " -> " << ours;
      EXPECT_EQ(ours >> 15, c.float_bits >> 31) << std::hex << c.float_bits << " lost its sign";
      continue;
    }
    ASSERT_EQ(ours, c.bf16_bits) << std::hex << "float 0x" << c.float_bits << " (" << value << "): ours 0x" << ours
                                 << ", torch 0x" << c.bf16_bits;
    ASSERT_EQ(bits_of(round_to_bf16(value)), static_cast<std::uint32_t>(c.bf16_bits) << 16) << std::hex << c.float_bits;
  }
  EXPECT_GE(nans, 6);  // the listed NaNs, signalling ones among them
  // The CPU kernel (what the model calls) gives the helper's floats, NaN included.
  std::vector<float> rounded = values;
  cpu_device().kernels().round_to_bf16(rounded.data(), rounded.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float expected = round_to_bf16(values[i]);
    ASSERT_EQ(bits_of(rounded[i]), bits_of(expected)) << std::hex << bits_of(values[i]);
  }
}

// Hand-checked cases, so the helper is pinned down even where torch is not run.
TEST(Bf16Rounding, TiesGoToEvenAndCarriesReachTheExponent) {
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0x3F808000u)), 0x3F80u);  // tie, even below
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0x3F818000u)), 0x3F82u);  // tie, odd below: up
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0x3F808001u)), 0x3F81u);
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0x3FFFFFFFu)), 0x4000u);  // 1.999... -> 2
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0x7F7FFFFFu)), 0x7F80u);  // FLT_MAX -> inf
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0x00018000u)), 0x0002u);  // subnormal tie, up
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0x7F800001u)), 0x7FC0u);  // signalling NaN: quiet, not inf
  EXPECT_EQ(float_to_bf16_bits(float_from_bits(0xFFC00000u)), 0xFFC0u);
  // Every bf16 value survives the round trip.
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    if ((b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0) continue;  // NaN payloads may gain the quiet bit
    ASSERT_EQ(float_to_bf16_bits(bf16_bits_to_float(b)), b) << std::hex << bits;
  }
}

GPTConfig small_model() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 50, .vocab_multiple = 16, .seq_length = 16});
}

struct StepResult {
  std::vector<float> losses;
  std::vector<float> params;
};

// Three training steps (forward, backward, AdamW) of a fresh model from seed 7.
// touch_precision: the recipe names the precision (else the model's default recipe).
StepResult train_three_steps(const GPTConfig& config, Precision precision, bool touch_precision = true) {
  GPT model = touch_precision ? GPT(config, nullptr, {}, nullptr, GPTRecipe{.precision = precision}) : GPT(config);
  model.init_gpt2(7);
  AdamW optimizer(model, AdamWOptions{});
  StepResult result;
  for (int step = 0; step < 3; ++step) {
    const auto batch = dufu::testing::next_token_batch(4, 16, config.vocab_size, 100 + step, {});
    model.zero_grad();
    result.losses.push_back(model.forward(batch.tokens, batch.targets, 4, 16));
    model.backward();
    optimizer.step(model.params(), model.grads(), 1e-2f);
  }
  result.params.assign(model.params().begin(), model.params().end());
  return result;
}

TEST(Bf16Model, Fp32IsUntouchedAndBf16IsCloseButRounded) {
  const StepResult plain = train_three_steps(small_model(), Precision::kFp32, false);
  const StepResult fp32 = train_three_steps(small_model(), Precision::kFp32);
  EXPECT_EQ(fp32.losses, plain.losses);
  EXPECT_EQ(fp32.params, plain.params);
  const StepResult bf16 = train_three_steps(small_model(), Precision::kBf16);
  for (std::size_t i = 0; i < bf16.losses.size(); ++i) {
    EXPECT_NE(bf16.losses[i], fp32.losses[i]) << "step " << i << ": bf16 rounded nothing";
    EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 1e-2 * fp32.losses[i]) << "step " << i;
  }
  // The masters stay fp32: AdamW's updates are not rounded away.
  int not_bf16 = 0;
  for (const float p : bf16.params) not_bf16 += round_to_bf16(p) != p;
  EXPECT_GT(not_bf16, static_cast<int>(bf16.params.size() / 2));
  // Same inputs, same bits.
  const StepResult again = train_three_steps(small_model(), Precision::kBf16);
  EXPECT_EQ(again.losses, bf16.losses);
  EXPECT_EQ(again.params, bf16.params);
}

// The loss under bf16 is a function of the masters rounded to bf16: masters that
// differ only below bf16's precision give the same loss bits, and a change the
// rounding keeps reaches the next forward (the working copy is remade).
TEST(Bf16Model, WorkingCopyFollowsTheMasters) {
  const GPTConfig config = small_model();
  const auto batch = dufu::testing::next_token_batch(2, 16, config.vocab_size, 5, {});
  GPT model(config, nullptr, {}, nullptr, GPTRecipe{.precision = Precision::kBf16});
  model.init_gpt2(11);
  const float base = model.forward(batch.tokens, batch.targets, 2, 16);
  std::vector<float> masters(model.params().begin(), model.params().end());
  // Nudge every master by far less than half a bf16 step: no rounded value moves.
  // (Towards the value it rounds to, or away from a value bf16 holds exactly.)
  int nudged = 0;
  for (float& p : model.params()) {
    if (p == 0.0f) continue;
    p = round_to_bf16(p) == p ? std::nextafter(p, 2.0f * p) : std::nextafter(p, round_to_bf16(p));
    ++nudged;
  }
  ASSERT_GT(nudged, 1000);
  EXPECT_EQ(model.forward(batch.tokens, batch.targets, 2, 16), base);
  // The nudged masters under fp32 (another model: the recipe is fixed at construction)
  // do move the loss, and a fresh bf16 model over them gives the bf16 one's bits.
  const std::vector<float> nudged_masters = model.download_parameters();
  GPT fp32_model(config);
  fp32_model.upload_parameters(nudged_masters);
  EXPECT_NE(fp32_model.forward(batch.tokens, batch.targets, 2, 16), base);
  GPT bf16_again(config, nullptr, {}, nullptr, GPTRecipe{.precision = Precision::kBf16});
  bf16_again.upload_parameters(nudged_masters);
  EXPECT_EQ(bf16_again.forward(batch.tokens, batch.targets, 2, 16), base);
  EXPECT_EQ(model.forward(batch.tokens, batch.targets, 2, 16), base);
  // A change the rounding keeps: the working copy must be remade to see it.
  for (float& p : model.params()) p *= 1.5f;
  EXPECT_NE(model.forward(batch.tokens, batch.targets, 2, 16), base);
  std::copy(masters.begin(), masters.end(), model.params().begin());
  EXPECT_EQ(model.forward(batch.tokens, batch.targets, 2, 16), base);
}

// The CPU device with a kernel table that leaves round_to_bf16 null, as a backend
// without the recipe's kernel does.
class DeviceWithoutBf16 final : public dufu::testing::ForwardingCpuDevice {
 public:
  DeviceWithoutBf16() : table_(cpu().kernels()) { table_.round_to_bf16 = nullptr; }
  std::string describe() const override { return "cpu without bf16"; }
  const KernelTable& kernels() const override { return table_; }

 private:
  KernelTable table_;
};

TEST(Bf16Model, RefusedOnADeviceWithoutTheRoundingKernel) {
  DeviceWithoutBf16 device;
  const GPT model(small_model(), nullptr, {}, &device, GPTRecipe{.precision = Precision::kFp32});  // nothing new
  EXPECT_EQ(model.precision(), Precision::kFp32);
  dufu::testing::expect_error(
      [&] { GPT bf16_model(small_model(), nullptr, {}, &device, GPTRecipe{.precision = Precision::kBf16}); },
      {"train.precision = bf16", "cpu without bf16", "no bf16 rounding and storage kernels"});
}

dufu::Config config_with(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "data.blend=some/prefix");
  return dufu::Config::load(training_config_schema(), "", overrides);
}

TEST(Bf16Config, KnobDefaultsToFp32AndRefusesOtherValues) {
  EXPECT_EQ(training_options(config_with({})).precision, Precision::kFp32);
  EXPECT_EQ(training_options(config_with({"train.precision=bf16"})).precision, Precision::kBf16);
  dufu::testing::expect_error([] { training_options(config_with({"train.precision=fp16"})); },
                              {"train.precision", "\"fp32\" or \"bf16\"", "fp16"});
}

}  // namespace
