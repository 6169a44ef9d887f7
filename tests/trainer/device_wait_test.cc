// When the host waits for the device in a training step. On a GPU every wait drains the
// queue of kernels the host has launched, so a step's micro-batches should not wait at
// all: their losses stay on the device (GPT::forward_keeping_loss) until the step reads
// them with the gradient norm, its one wait. Counted here on the CPU device, through a
// device that counts the calls which wait on an asynchronous one (download,
// synchronize, and the kernel table's one entry that returns a value to the host).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "support/forwarding_cpu_device.h"
#include "support/gpt_fixture.h"

namespace dufu::trainer {
namespace {

std::atomic<int> sums_of_squares{0};

double counted_sum_of_squares(const float* values, std::size_t n) {
  ++sums_of_squares;
  return cpu_device().kernels().sum_of_squares(values, n);
}

class WaitCountingDevice final : public dufu::testing::ForwardingCpuDevice {
 public:
  WaitCountingDevice() : table_(cpu().kernels()) { table_.sum_of_squares = counted_sum_of_squares; }
  const KernelTable& kernels() const override { return table_; }
  void download(void* to, const void* from, std::size_t bytes) override {
    ++downloads;
    cpu().download(to, from, bytes);
  }
  void synchronize() override {
    ++synchronizations;
    cpu().synchronize();
  }
  int waits() const { return downloads + synchronizations + sums_of_squares; }
  void reset() { downloads = synchronizations = sums_of_squares = 0; }
  int downloads = 0;
  int synchronizations = 0;

 private:
  KernelTable table_;
};

GPTConfig small_config() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 37, .vocab_multiple = 8, .seq_length = 8});
}
constexpr int kB = 2;
constexpr int kT = 8;
constexpr int kMicroBatches = 3;

std::vector<float> gradient_bits_of(GPT& model) {
  std::vector<float> host(model.num_parameters());
  model.device().download(host.data(), model.grads().data(), host.size() * sizeof(float));
  return host;
}

// The losses a kept forward leaves are the ones forward() returns, bit for bit, and the
// gradients after them are too; the kept ones come back in the forwards' order.
TEST(KeptLossTest, KeptLossesAreTheReturnedOnes) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision == Precision::kBf16 ? "bf16" : "fp32");
    GPT returning(small_config(), nullptr, {}, nullptr, GPTRecipe{.precision = precision});
    GPT keeping(small_config(), nullptr, {}, nullptr, GPTRecipe{.precision = precision});
    for (GPT* model : {&returning, &keeping}) {
      model->init_gpt2(3);
      model->zero_grad();
    }
    std::vector<float> returned;
    for (std::uint32_t micro = 0; micro < kMicroBatches; ++micro) {
      // A target ignored in one micro-batch: its mean is over fewer positions.
      const auto batch = dufu::testing::next_token_batch(kB, kT, 37, 10 + micro, {micro});
      returned.push_back(returning.forward(batch.tokens, batch.targets, kB, kT, 0.01f));
      returning.backward();
      keeping.forward_keeping_loss(batch.tokens, batch.targets, kB, kT, 0.01f);
      keeping.backward();
    }
    const std::vector<float> kept = keeping.read_kept_losses();
    ASSERT_EQ(kept.size(), returned.size());
    EXPECT_EQ(0, std::memcmp(kept.data(), returned.data(), kept.size() * sizeof(float)));
    EXPECT_TRUE(keeping.read_kept_losses().empty()) << "read twice";
    const std::vector<float> a = gradient_bits_of(returning);
    const std::vector<float> b = gradient_bits_of(keeping);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  }
}

// More kept losses than the first buffer holds (it grows by copying on the device).
TEST(KeptLossTest, ManyKeptLossesComeBackInOrder) {
  GPT keeping(small_config());
  GPT returning(small_config());
  keeping.init_gpt2(4);
  returning.init_gpt2(4);
  std::vector<float> returned;
  for (std::uint32_t micro = 0; micro < 21; ++micro) {
    const auto batch = dufu::testing::next_token_batch(kB, kT, 37, 100 + micro, {});
    returned.push_back(returning.forward(batch.tokens, batch.targets, kB, kT));
    keeping.forward_keeping_loss(batch.tokens, batch.targets, kB, kT, 1.0f / (kB * kT));
    // Without targets nothing is kept.
    keeping.forward_keeping_loss(batch.tokens, {}, kB, kT, 1.0f);
  }
  const std::vector<float> kept = keeping.read_kept_losses();
  ASSERT_EQ(kept.size(), returned.size());
  EXPECT_EQ(0, std::memcmp(kept.data(), returned.data(), kept.size() * sizeof(float)));
}

// A step as the trainer runs it (three micro-batches kept, the reduction and clip, AdamW,
// then the losses read) waits for the device twice: the norm and the read right after
// it, whatever the number of micro-batches. forward() waits once per micro-batch.
TEST(DeviceWaitTest, AStepWaitsForTheNormAndTheLossesOnly) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision == Precision::kBf16 ? "bf16" : "fp32");
    WaitCountingDevice device;
    const std::unique_ptr<Communicator> world = make_single_process_communicator();
    GPT model(small_config(), nullptr, {}, &device, GPTRecipe{.precision = precision});
    model.init_gpt2(5);
    DataParallelOptimizer optimizer(model, AdamWOptions{}, *world, 0);
    const auto step = [&](std::uint32_t seed, bool keep) {
      model.zero_grad();
      for (std::uint32_t micro = 0; micro < kMicroBatches; ++micro) {
        const auto batch = dufu::testing::next_token_batch(kB, kT, 37, seed * 10 + micro, {});
        if (keep) {
          model.forward_keeping_loss(batch.tokens, batch.targets, kB, kT, 1.0f / (kMicroBatches * kB * kT));
        } else {
          model.forward(batch.tokens, batch.targets, kB, kT, 1.0f / (kMicroBatches * kB * kT));
        }
        model.backward();
      }
      optimizer.reduce_gradients_and_clip(1.0);
      if (keep) {
        EXPECT_EQ(model.read_kept_losses().size(), static_cast<std::size_t>(kMicroBatches));
      }
      optimizer.step(1e-3f);
    };
    step(0, true);  // sizes the activations and the kept losses
    for (std::uint32_t seed = 1; seed < 4; ++seed) {
      device.reset();
      step(seed, true);
      EXPECT_EQ(sums_of_squares, 1) << "step " << seed;
      EXPECT_EQ(device.downloads, 1) << "step " << seed;
      EXPECT_EQ(device.synchronizations, 0) << "step " << seed;
    }
    device.reset();
    step(4, false);
    EXPECT_EQ(device.waits(), 1 + kMicroBatches) << "the counting device must see forward()'s reads";
  }
}

}  // namespace
}  // namespace dufu::trainer
