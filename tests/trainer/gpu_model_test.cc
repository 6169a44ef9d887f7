// The model on a GPU (label gpu): 10 steps of a small GPT on the CUDA device against
// the CPU device (fp32 losses within 1e-4 relative, bf16 within 1e-2), and a run
// resumed on the GPU from a checkpoint of step 5 that repeats steps 6..10 bit for bit,
// and recomputation's losses, the bits of the run that keeps the activations; the
// Llama architecture (grouped-query attention, an untied head) against the CPU too,
// and the optimizer offloaded to the host against the one on the GPU.
// Without a CUDA device every test is skipped with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir.h"

namespace dufu::trainer {
namespace {

constexpr int kB = 4;
constexpr int kT = 32;
constexpr int kSteps = 10;

GPTConfig small_config(Architecture arch = Architecture::kGpt2) {
  GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 4, .d_model = 64, .vocab_size = 97, .vocab_multiple = 32, .seq_length = kT});
  if (arch == Architecture::kLlama) {
    config.arch = arch;
    config.n_kv_head = 2;
    config.ffn_hidden = 160;
    config.tie_embeddings = false;
  }
  return config;
}

class GpuModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceAvailability cuda = device_availability(DeviceKind::kCuda);
    if (!cuda.available) GTEST_SKIP() << "cuda skipped: " << cuda.reason;
  }
  static Device& cuda() { return device_of_kind(DeviceKind::kCuda); }
};

struct Model {
  GPT gpt;
  AdamW optimizer;
  Model(Device& device, Precision precision, Recompute recompute = Recompute::kNone,
        const GPTConfig& config = small_config(), Precision attention_products = Precision::kFp32)
      : gpt(config, nullptr, {}, &device,
            GPTRecipe{.precision = precision, .attention_products = attention_products, .recompute = recompute}),
        optimizer(gpt, AdamWOptions{}) {}
};

// Steps [first, last) with clipping at norm 1, one fixed batch per step; their losses.
std::vector<float> train(Model& model, int first, int last) {
  std::vector<float> losses;
  for (int step = first; step < last; ++step) {
    const auto batch =
        dufu::testing::next_token_batch(kB, kT, small_config().vocab_size, static_cast<std::uint32_t>(step), {5});
    model.gpt.zero_grad();
    losses.push_back(model.gpt.forward(batch.tokens, batch.targets, kB, kT));
    model.gpt.backward();
    const double norm = gradient_norm(model.gpt.grads(), model.gpt.device());
    model.optimizer.step(model.gpt.params(), model.gpt.grads(), 3e-3f, gradient_clip_scale(norm, 1.0));
  }
  return losses;
}

std::vector<float> losses_on(Device& device, Precision precision, Recompute recompute = Recompute::kNone,
                             Architecture arch = Architecture::kGpt2,
                             Precision attention_products = Precision::kFp32) {
  Model model(device, precision, recompute, small_config(arch), attention_products);
  model.gpt.init_gpt2(42);
  return train(model, 0, kSteps);
}

void expect_losses_close(const std::vector<float>& cuda, const std::vector<float>& cpu, double relative) {
  ASSERT_EQ(cuda.size(), cpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_TRUE(std::isfinite(cuda[i])) << "step " << i + 1;
    EXPECT_LE(std::abs(static_cast<double>(cuda[i]) - cpu[i]), relative * std::abs(cpu[i]))
        << "step " << i + 1 << ": cuda " << cuda[i] << ", cpu " << cpu[i];
  }
}

TEST_F(GpuModelTest, Fp32LossesMatchTheCpu) {
  expect_losses_close(losses_on(cuda(), Precision::kFp32), losses_on(cpu_device(), Precision::kFp32), 1e-4);
}

TEST_F(GpuModelTest, Bf16LossesMatchTheCpu) {
  expect_losses_close(losses_on(cuda(), Precision::kBf16), losses_on(cpu_device(), Precision::kBf16), 1e-2);
}

// bf16 attention products: the tensor-core kernels (attention_bf16.cu) against the
// CPU's same recipe, for GPT-2 and Llama (grouped heads).
TEST_F(GpuModelTest, Bf16AttentionProductsMatchTheCpu) {
  const Precision bf16 = Precision::kBf16;
  for (const Architecture arch : {Architecture::kGpt2, Architecture::kLlama}) {
    expect_losses_close(losses_on(cuda(), bf16, Recompute::kNone, arch, bf16),
                        losses_on(cpu_device(), bf16, Recompute::kNone, arch, bf16), 1e-2);
  }
}

// optim.offload = cpu: the masters and moments on the host, AdamW there (the CPU's
// kernel where the GPU's ran), the bf16 working copy uploaded to the GPU each step.
TEST_F(GpuModelTest, OffloadedOptimizerTrainsLikeTheDevicesOwn) {
  const std::vector<float> kept = losses_on(cuda(), Precision::kBf16);
  GPT gpt(small_config(), nullptr, {}, &cuda(), GPTRecipe{.precision = Precision::kBf16, .optimizer_offload = true});
  ASSERT_EQ(&gpt.parameter_device(), &cpu_device());
  gpt.init_gpt2(42);
  AdamW optimizer(gpt, AdamWOptions{});
  std::vector<float> offloaded;
  for (int step = 0; step < kSteps; ++step) {
    const auto batch =
        dufu::testing::next_token_batch(kB, kT, small_config().vocab_size, static_cast<std::uint32_t>(step), {5});
    gpt.zero_grad();
    offloaded.push_back(gpt.forward(batch.tokens, batch.targets, kB, kT));
    gpt.backward();
    const double norm = gradient_norm(gpt.grads(), gpt.device());
    std::vector<float> host_grads(gpt.num_parameters());
    cuda().download(host_grads.data(), gpt.grads().data(), host_grads.size() * sizeof(float));
    optimizer.step(gpt.params(), host_grads, 3e-3f, gradient_clip_scale(norm, 1.0));
  }
  expect_losses_close(offloaded, kept, 1e-2);
}

// RMSNorm, rotary positions, SwiGLU, grouped-query attention and an untied head.
TEST_F(GpuModelTest, LlamaLossesMatchTheCpu) {
  const Architecture llama = Architecture::kLlama;
  expect_losses_close(losses_on(cuda(), Precision::kFp32, Recompute::kNone, llama),
                      losses_on(cpu_device(), Precision::kFp32, Recompute::kNone, llama), 1e-4);
  expect_losses_close(losses_on(cuda(), Precision::kBf16, Recompute::kNone, llama),
                      losses_on(cpu_device(), Precision::kBf16, Recompute::kNone, llama), 1e-2);
  const std::vector<float> kept = losses_on(cuda(), Precision::kBf16, Recompute::kNone, llama);
  const std::vector<float> recomputed = losses_on(cuda(), Precision::kBf16, Recompute::kFull, llama);
  EXPECT_EQ(std::memcmp(recomputed.data(), kept.data(), kept.size() * sizeof(float)), 0);
}

TEST_F(GpuModelTest, ResumeFromStepFiveIsBitwise) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    Model whole(cuda(), precision);
    whole.gpt.init_gpt2(42);
    const std::vector<float> uninterrupted = train(whole, 0, kSteps);

    dufu::testing::TempDir dir;
    std::string checkpoint;
    {
      Model first(cuda(), precision);
      first.gpt.init_gpt2(42);
      train(first, 0, 5);
      TrainingState state;
      state.step = 5;
      state.model = small_config();
      checkpoint = save_checkpoint(dir.path(), first.gpt, first.optimizer, state, 1);
    }
    Model resumed(cuda(), precision);
    load_checkpoint(checkpoint, resumed.gpt, &resumed.optimizer);
    const std::vector<float> tail = train(resumed, 5, kSteps);
    ASSERT_EQ(tail.size(), 5u);
    EXPECT_EQ(std::memcmp(tail.data(), uninterrupted.data() + 5, tail.size() * sizeof(float)), 0);
    std::vector<float> a(whole.gpt.num_parameters()), b(a.size());
    cuda().download(a.data(), whole.gpt.params().data(), a.size() * sizeof(float));
    cuda().download(b.data(), resumed.gpt.params().data(), b.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

// train.recompute on the GPU: the recomputed activations are the stored ones, so the
// losses are the bits of the run that keeps them (as recompute_test checks on the CPU).
TEST_F(GpuModelTest, RecomputationGivesTheSameBits) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const std::vector<float> kept = losses_on(cuda(), precision);
    for (const Recompute recompute : {Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE(std::string(precision_name(precision)) + ", recompute " + recompute_name(recompute));
      const std::vector<float> recomputed = losses_on(cuda(), precision, recompute);
      ASSERT_EQ(recomputed.size(), kept.size());
      EXPECT_EQ(std::memcmp(recomputed.data(), kept.data(), kept.size() * sizeof(float)), 0);
    }
  }
}

}  // namespace
}  // namespace dufu::trainer
