// Host staging (trainer/src/checkpoint/host_staging.h): everything that reads or writes a
// model's device memory as host memory (checkpoints, parallel checkpoints, generation,
// export) must download or upload it. Run on the guarded device
// (support/guarded_device.h), whose memory is PROT_NONE outside its own kernels and
// copies, so a host read of device memory dies here as it would be garbage on a GPU;
// every result must be byte for byte the CPU device's. Also: a training step allocates
// no device memory after the first.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/dataprep/tokenizer.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/hf_export.h"
#include "dufu/trainer/checkpoint/parallel_checkpoint.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "dufu/trainer/run/generate.h"
#include "support/gpt_fixture.h"
#include "support/guarded_device.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::trainer {
namespace {

using dufu::testing::guarded_device;
using dufu::testing::GuardedMemory;
using dufu::testing::TempDir;

GPTConfig config_of_vocab(int vocab_size) {
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = vocab_size, .vocab_multiple = 8, .seq_length = 8});
}
GPTConfig small_config() { return config_of_vocab(37); }

constexpr int kB = 2;
constexpr int kT = 8;

TrainingState state_of(const GPTConfig& config, std::int64_t step) {
  TrainingState state;
  state.step = step;
  state.model = config;
  return state;
}

std::vector<float> host_copy(const GPT& model) {
  std::vector<float> host(model.num_parameters());
  model.device().download(host.data(), model.params().data(), host.size() * sizeof(float));
  return host;
}

// Steps [first, last) of fwd/bwd/AdamW on a fixed batch per step; their losses.
std::vector<float> train_steps(GPT& model, AdamW& optimizer, int first, int last) {
  std::vector<float> losses;
  for (int step = first; step < last; ++step) {
    const auto batch =
        dufu::testing::next_token_batch(kB, kT, model.config().vocab_size, static_cast<std::uint32_t>(100 + step), {3});
    model.zero_grad();
    losses.push_back(model.forward(batch.tokens, batch.targets, kB, kT));
    model.backward();
    optimizer.step(model.params(), model.grads(), 1e-2f);
  }
  return losses;
}

struct SerialRun {
  std::vector<float> losses;
  std::string model_file;
  std::string optimizer_file;
  std::vector<float> final_params;
  std::vector<std::int32_t> generated;
};

// 3 steps, a checkpoint, a fresh model and optimizer loaded from it, 2 more steps,
// then greedy and sampled generation; everything on `device`.
SerialRun serial_run(Device& device, const std::string& run_dir, Precision precision) {
  SerialRun run;
  GPT model(small_config(), nullptr, {}, &device, GPTRecipe{.precision = precision});
  model.init_gpt2(7);
  AdamW optimizer(model, AdamWOptions{});
  run.losses = train_steps(model, optimizer, 0, 3);
  const std::string dir = save_checkpoint(run_dir, model, optimizer, state_of(model.config(), 3), 1);
  run.model_file = dufu::testing::read_all(dir + "/model.safetensors");
  run.optimizer_file = dufu::testing::read_all(dir + "/optimizer.safetensors");

  GPT resumed(small_config(), nullptr, {}, &device, GPTRecipe{.precision = precision});
  AdamW resumed_optimizer(resumed, AdamWOptions{});
  load_checkpoint(dir, resumed, &resumed_optimizer);
  const std::vector<float> more = train_steps(resumed, resumed_optimizer, 3, 5);
  run.losses.insert(run.losses.end(), more.begin(), more.end());
  run.final_params = host_copy(resumed);

  const std::vector<std::int32_t> prompt = {1, 2, 3};
  SamplingOptions sampled;
  sampled.max_new_tokens = 12;  // past seq_length: the window slides
  sampled.top_k = 5;
  sampled.seed = 11;
  run.generated = generate(resumed, prompt, sampled);
  SamplingOptions greedy;
  greedy.max_new_tokens = 4;
  greedy.temperature = 0.0f;
  const std::vector<std::int32_t> more_tokens = generate(resumed, prompt, greedy);
  run.generated.insert(run.generated.end(), more_tokens.begin(), more_tokens.end());
  return run;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GuardedDeviceTest, HostReadOfDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        GPT model(small_config(), nullptr, {}, &guarded_device());
        volatile float first = model.params()[0];
        (void)first;
      },
      "");
}

TEST(GuardedDeviceTest, DownloadedParametersAreReadable) {
  GPT model(small_config(), nullptr, {}, &guarded_device());
  model.init_gpt2(3);
  GPT reference(small_config());
  reference.init_gpt2(3);
  const std::vector<float> cpu(reference.params().begin(), reference.params().end());
  EXPECT_TRUE(same_bits(host_copy(model), cpu));
}

class HostStagingTest : public ::testing::TestWithParam<Precision> {};

TEST_P(HostStagingTest, TrainingCheckpointResumeAndGenerationMatchTheCpuBitwise) {
  TempDir cpu_dir, guarded_dir;
  const SerialRun cpu = serial_run(cpu_device(), cpu_dir.path(), GetParam());
  const SerialRun guarded = serial_run(guarded_device(), guarded_dir.path(), GetParam());
  EXPECT_TRUE(same_bits(cpu.losses, guarded.losses));
  EXPECT_TRUE(cpu.model_file == guarded.model_file) << "model.safetensors differs";
  EXPECT_TRUE(cpu.optimizer_file == guarded.optimizer_file) << "optimizer.safetensors differs";
  EXPECT_TRUE(same_bits(cpu.final_params, guarded.final_params));
  EXPECT_EQ(cpu.generated, guarded.generated);
  EXPECT_EQ(cpu.generated.size(), 16u);
}

INSTANTIATE_TEST_SUITE_P(Precisions, HostStagingTest, ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

struct ParallelRun {
  std::string model_file;
  std::string optimizer_file;
  std::vector<float> resumed_params;  // the same piece, loaded back and stepped once
  std::vector<float> stage_params;    // the checkpoint resharded into pipeline stage 0 of 2
  std::vector<float> stage_moments;
};

// save_parallel_checkpoint and load_parallel_checkpoint in one process: a world of one,
// the same piece and (the resharding path) a pipeline stage of two.
ParallelRun parallel_run(Device& device, const std::string& run_dir) {
  ParallelRun run;
  const std::unique_ptr<Communicator> world = make_single_process_communicator();
  GPT model(small_config(), nullptr, {}, &device);
  model.init_gpt2(5);
  DataParallelOptimizer optimizer(model, AdamWOptions{}, *world, 0);
  for (int step = 0; step < 2; ++step) {
    const auto batch = dufu::testing::next_token_batch(kB, kT, 37, static_cast<std::uint32_t>(step), {});
    model.zero_grad();
    model.forward(batch.tokens, batch.targets, kB, kT);
    model.backward();
    optimizer.reduce_gradients_and_clip(1.0);
    optimizer.step(1e-2f);
  }
  TrainingState state = state_of(model.config(), 2);
  state.layout.data_parallel_size = 1;
  const std::string dir = save_parallel_checkpoint(run_dir, *world, RankPlace{}, model, optimizer, state, 1);
  run.model_file = dufu::testing::read_all(dir + "/model.safetensors");
  run.optimizer_file = dufu::testing::read_all(dir + "/optimizer.safetensors");

  const TrainingState saved = read_checkpoint_state(dir);
  GPT resumed(small_config(), nullptr, {}, &device);
  DataParallelOptimizer resumed_optimizer(resumed, AdamWOptions{}, *world, 0);
  load_parallel_checkpoint(dir, saved, RankPlace{}, 1, resumed, resumed_optimizer);
  const auto batch = dufu::testing::next_token_batch(kB, kT, 37, 9, {});
  resumed.zero_grad();
  resumed.forward(batch.tokens, batch.targets, kB, kT);
  resumed.backward();
  resumed_optimizer.reduce_gradients_and_clip(1.0);
  resumed_optimizer.step(1e-2f);
  run.resumed_params = host_copy(resumed);

  const PipelineStage stage = pipeline_stage(pipeline_layer_split(2, 2, {}), 0);
  GPT piece(small_config(), nullptr, stage, &device);
  DataParallelOptimizer piece_optimizer(piece, AdamWOptions{}, *world, 0);
  load_parallel_checkpoint(dir, saved, RankPlace{}, 1, piece, piece_optimizer);
  run.stage_params = host_copy(piece);
  const AdamW& moments = piece_optimizer.local_state();
  run.stage_moments.resize(2 * moments.num_parameters());
  device.download(run.stage_moments.data(), moments.m().data(), moments.num_parameters() * sizeof(float));
  device.download(run.stage_moments.data() + moments.num_parameters(), moments.v().data(),
                  moments.num_parameters() * sizeof(float));
  return run;
}

TEST(HostStagingParallelTest, ParallelCheckpointSavesLoadsAndReshardsLikeTheCpu) {
  TempDir cpu_dir, guarded_dir;
  const ParallelRun cpu = parallel_run(cpu_device(), cpu_dir.path());
  const ParallelRun guarded = parallel_run(guarded_device(), guarded_dir.path());
  EXPECT_TRUE(cpu.model_file == guarded.model_file) << "model.safetensors differs";
  EXPECT_TRUE(cpu.optimizer_file == guarded.optimizer_file) << "optimizer.safetensors differs";
  EXPECT_TRUE(same_bits(cpu.resumed_params, guarded.resumed_params));
  EXPECT_TRUE(same_bits(cpu.stage_params, guarded.stage_params));
  EXPECT_TRUE(same_bits(cpu.stage_moments, guarded.stage_moments));
  EXPECT_FALSE(cpu.stage_params.empty());
}

TEST(HostStagingExportTest, ExportFromTheGuardedDeviceWritesTheCpuBytes) {
  dataprep::TokenizerSpec spec;
  spec.model = dufu::testing::fixture_path("fortunes.model");
  const int vocab = static_cast<int>(dataprep::Tokenizer::load(spec).vocab_size());
  TempDir dir;
  GPT model(config_of_vocab(vocab));
  model.init_gpt2(4);
  AdamW optimizer(model, AdamWOptions{});
  const std::string checkpoint = save_checkpoint(dir.path(), model, optimizer, state_of(model.config(), 1), 1);
  export_hf(checkpoint, dir.file("cpu"), spec);
  export_hf(checkpoint, dir.file("guarded"), spec, &guarded_device());
  const std::string cpu_weights = dufu::testing::read_all(dir.file("cpu/model.safetensors"));
  EXPECT_FALSE(cpu_weights.empty());
  EXPECT_TRUE(cpu_weights == dufu::testing::read_all(dir.file("guarded/model.safetensors")));
}

// Nothing allocated per step on the device: after the first step (which sizes the
// activations), steps of the model, the optimizer and the data-parallel reduction,
// under fp32 and bf16, allocate no device memory.
TEST(DeviceAllocationTest, StepsAfterTheFirstAllocateNothing) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const std::unique_ptr<Communicator> world = make_single_process_communicator();
    GPT model(small_config(), nullptr, {}, &guarded_device(),
              GPTRecipe{.precision = bf16 ? Precision::kBf16 : Precision::kFp32});
    model.init_gpt2(1);
    DataParallelOptimizer optimizer(model, AdamWOptions{}, *world, 0);
    const auto step = [&](std::uint32_t seed) {
      const auto batch = dufu::testing::next_token_batch(kB, kT, 37, seed, {});
      model.zero_grad();
      model.forward(batch.tokens, batch.targets, kB, kT);
      model.backward();
      optimizer.reduce_gradients_and_clip(1.0);
      optimizer.step(1e-3f);
    };
    step(0);
    const std::size_t after_first = GuardedMemory::instance().allocations();
    for (std::uint32_t seed = 1; seed < 5; ++seed) step(seed);
    EXPECT_EQ(GuardedMemory::instance().allocations(), after_first);
  }
}

}  // namespace
}  // namespace dufu::trainer
