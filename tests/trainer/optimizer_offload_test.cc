// optim.offload = cpu (GPTRecipe::optimizer_offload): the fp32 masters and the AdamW
// moments in host memory, the update on the host, the device keeping the bf16 working
// copy, the gradients and the activations. On the guarded device (device memory the
// host cannot touch, guarded_device.h) an offloaded run trains, checkpoints and
// resumes to the same bits as the run that keeps everything on the device; a counting
// device shows what leaves it (4 bytes of master and 8 of moments per parameter); and
// every combination that cannot work is refused with its reason. (With ZeRO-1 over
// MPI ranks: data_parallel_buckets_test.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/config.h"
#include "dufu/common/error.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "dufu/trainer/checkpoint/parallel_checkpoint.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "dufu/trainer/run/training_config.h"
#include "support/counting_cpu_device.h"
#include "support/gpt_fixture.h"
#include "support/guarded_device.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::trainer {
namespace {

using dufu::testing::guarded_device;
using dufu::testing::TempDir;

constexpr int kB = 2;
constexpr int kT = 8;

GPTConfig small_config(Architecture arch = Architecture::kGpt2) {
  GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 37, .vocab_multiple = 8, .seq_length = kT});
  if (arch == Architecture::kLlama) {
    config.arch = arch;
    config.ffn_hidden = 40;
    config.tie_embeddings = false;
  }
  return config;
}

std::unique_ptr<GPT> make_model(Device& device, bool offload, Architecture arch) {
  return std::make_unique<GPT>(small_config(arch), nullptr, PipelineStage{}, &device,
                               GPTRecipe{.precision = Precision::kBf16, .optimizer_offload = offload});
}

std::vector<float> train_steps(GPT& model, DataParallelOptimizer& optimizer, int first, int last) {
  std::vector<float> losses;
  for (int step = first; step < last; ++step) {
    const auto batch = dufu::testing::next_token_batch(kB, kT, 37, static_cast<std::uint32_t>(step), {});
    model.zero_grad();
    losses.push_back(model.forward(batch.tokens, batch.targets, kB, kT));
    model.backward();
    optimizer.reduce_gradients_and_clip(1.0);
    optimizer.step(1e-2f);
  }
  return losses;
}

struct TrainingRun {
  std::vector<float> losses;
  std::string model_file;
  std::string optimizer_file;
  std::vector<float> final_params;
};

// 3 steps, a checkpoint, a fresh model resumed from it, 2 more steps.
TrainingRun run_on_guarded_device(bool offload, Architecture arch, const std::string& run_dir) {
  TrainingRun run;
  const std::unique_ptr<Communicator> world = make_single_process_communicator();
  auto model = make_model(guarded_device(), offload, arch);
  model->init_gpt2(5);
  DataParallelOptimizer optimizer(*model, AdamWOptions{}, *world, 0);
  run.losses = train_steps(*model, optimizer, 0, 3);
  TrainingState state;
  state.step = 3;
  state.model = small_config(arch);
  state.layout.data_parallel_size = 1;
  const std::string dir = save_parallel_checkpoint(run_dir, *world, RankPlace{}, *model, optimizer, state, 1);
  run.model_file = dufu::testing::read_all(dir + "/model.safetensors");
  run.optimizer_file = dufu::testing::read_all(dir + "/optimizer.safetensors");

  auto resumed = make_model(guarded_device(), offload, arch);
  DataParallelOptimizer resumed_optimizer(*resumed, AdamWOptions{}, *world, 0);
  load_parallel_checkpoint(dir, read_checkpoint_state(dir), RankPlace{}, 1, *resumed, resumed_optimizer);
  const std::vector<float> more = train_steps(*resumed, resumed_optimizer, 3, 5);
  run.losses.insert(run.losses.end(), more.begin(), more.end());
  run.final_params.resize(resumed->num_parameters());
  resumed->parameter_device().download(run.final_params.data(), resumed->params().data(),
                                       run.final_params.size() * sizeof(float));
  return run;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class OptimizerOffloadTest : public ::testing::TestWithParam<Architecture> {};

TEST_P(OptimizerOffloadTest, TrainsCheckpointsAndResumesToTheDeviceRunsBits) {
  TempDir kept_dir, offloaded_dir;
  const TrainingRun kept = run_on_guarded_device(false, GetParam(), kept_dir.path());
  const TrainingRun offloaded = run_on_guarded_device(true, GetParam(), offloaded_dir.path());
  EXPECT_TRUE(same_bits(kept.losses, offloaded.losses));
  EXPECT_TRUE(kept.model_file == offloaded.model_file) << "model.safetensors differs";
  EXPECT_TRUE(kept.optimizer_file == offloaded.optimizer_file) << "optimizer.safetensors differs";
  EXPECT_TRUE(same_bits(kept.final_params, offloaded.final_params));
  EXPECT_EQ(offloaded.losses.size(), 5u);
}

INSTANTIATE_TEST_SUITE_P(Architectures, OptimizerOffloadTest,
                         ::testing::Values(Architecture::kGpt2, Architecture::kLlama),
                         [](const auto& info) { return std::string(architecture_name(info.param)); });

TEST(OptimizerOffloadMemoryTest, TheMastersAndMomentsLeaveTheDevice) {
  const std::unique_ptr<Communicator> world = make_single_process_communicator();
  std::size_t device_bytes[2] = {0, 0};
  std::size_t parameters = 0;
  for (const bool offload : {false, true}) {
    dufu::testing::CountingCpuDevice device;
    auto model = make_model(device, offload, Architecture::kGpt2);
    model->init_gpt2(5);
    DataParallelOptimizer optimizer(*model, AdamWOptions{}, *world, 0);
    train_steps(*model, optimizer, 0, 1);
    EXPECT_EQ(model->optimizer_offloaded(), offload);
    EXPECT_EQ(&optimizer.local_state().device(), &model->parameter_device());
    device_bytes[offload] = device.live_bytes();
    parameters = model->num_parameters();
  }
  EXPECT_EQ(device_bytes[0] - device_bytes[1], parameters * (sizeof(float) + 2 * sizeof(float)));
}

TEST(OptimizerOffloadRefusalTest, CombinationsThatCannotWorkAreRefusedWithTheReason) {
  const auto refused = [](auto&& action, const std::string& words) {
    try {
      action();
      ADD_FAILURE() << "not refused: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  // The recipe is fixed at construction, so the model refuses the combination there
  // (an offloaded model can no longer be switched back to fp32 afterwards: a
  // different recipe is a different model).
  refused([] { GPT model(small_config(), nullptr, {}, &guarded_device(), GPTRecipe{.optimizer_offload = true}); },
          "needs train.precision = bf16");  // the default precision, fp32
  refused(
      [] {
        GPT model(small_config(), nullptr, {}, &cpu_device(),
                  GPTRecipe{.precision = Precision::kBf16, .optimizer_offload = true});
      },
      "with train.device = cpu");
  refused(
      [] {
        GPT model(small_config(), nullptr, {}, &guarded_device(),
                  GPTRecipe{.precision = Precision::kFp32, .optimizer_offload = true});
      },
      "optim.offload = cpu needs train.precision = bf16");
  // The configuration refuses them before any rank starts.
  const auto options_with = [](const std::vector<std::string>& overrides) {
    std::vector<std::string> all = {"data.blend=unused", "optim.offload=cpu"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return training_options(Config::load(training_config_schema(), "", all));
  };
  refused([&] { options_with({"train.device=cpu", "train.precision=bf16"}); }, "with train.device = cpu");
  refused([&] { options_with({"train.device=cuda", "train.precision=fp32"}); }, "needs train.precision = bf16");
  refused([&] { options_with({"optim.offload=gpu"}); }, "optim.offload must be");
  EXPECT_TRUE(options_with({"train.device=cuda", "train.precision=bf16"}).optimizer_offload);
  EXPECT_TRUE(options_with({"train.device=cuda", "train.precision=bf16", "dist.zero_stage=1"}).optimizer_offload);
}

}  // namespace
}  // namespace dufu::trainer
