// What the checkpoint tests share (checkpoint_test.cc, checkpoint_state_test.cc,
// checkpoint_find_test.cc): a small model trained a few steps, a training state with
// every field set, and a fixture whose run directory is a fresh temporary one.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "dufu/common/log.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/safetensors.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir_test.h"

namespace dufu::trainer::checkpoint_testing {

namespace fs = std::filesystem;

inline constexpr int kB = 2;
inline constexpr int kT = 16;

inline GPTConfig small_config() {
  // vocab_size 100 is padded to 128: 28 padding rows that the checkpoint cuts.
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 4, .d_model = 32, .vocab_size = 100, .vocab_multiple = 64, .seq_length = kT});
}

using Batch = dufu::testing::TokenBatch;

// Next-token targets with a few positions ignored (-1).
inline Batch make_batch(int vocab_size, std::uint32_t seed) {
  return dufu::testing::next_token_batch(kB, kT, vocab_size, seed, {3, kT + 7});
}

// A model and its optimizer after `steps` AdamW updates from GPT-2's initialisation,
// so the weights and both moments are all non-trivial.
struct Trained {
  GPT model;
  AdamW optimizer;
  Batch batch;

  Trained(std::uint32_t seed, int steps, const GPTConfig& config = small_config())
      : model(config), optimizer(model, AdamWOptions{}), batch(make_batch(config.vocab_size, seed)) {
    model.init_gpt2(seed);
    for (int i = 0; i < steps; ++i) step();
  }
  void step() {
    model.zero_grad();
    model.forward(batch.tokens, batch.targets, kB, kT);
    model.backward();
    optimizer.step(model.params(), model.grads(), 1e-3f);
  }
};

// Every field set, with values that exercise the JSON: quotes, newlines, non-ASCII,
// the extremes of the integer types.
inline TrainingState make_state(std::int64_t step) {
  TrainingState state;
  state.step = step;
  state.consumed_samples = 1000 + static_cast<std::uint64_t>(step) * 8;
  state.consumed_tokens = 18446744073709551615ull;  // above INT64_MAX: JSON's unsigned range
  state.skipped_steps = 2;
  state.train_loader_state = "epoch=1 \"quoted\"\nline\t2 \\ caf\xc3\xa9 \x01";
  state.init_seed = 4294967295u;
  state.data_seed = 7;
  state.model = small_config();
  state.config_toml = "[model]\nn_layer = 2\nname = \"a \\\"b\\\"\"\n";
  state.shards = {{"data/web \"1\"", 18446744073709551615ull, 16, std::string(64, 'a'), std::string(64, 'b')},
                  {"/abs/code", 2, 0, std::string(64, '0'), std::string(64, 'f')}};
  return state;
}

inline std::vector<std::string> names_of(const std::vector<std::string>& paths) {
  std::vector<std::string> names;
  for (const std::string& path : paths) names.push_back(fs::path(path).filename().string());
  return names;
}

inline std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// The tensors of a safetensors file, to write back with changes.
inline std::vector<safetensors::TensorRef> refs_of(const safetensors::File& file) {
  std::vector<safetensors::TensorRef> refs;
  for (const safetensors::TensorView& tensor : file.tensors()) {
    refs.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.bytes.data()});
  }
  return refs;
}

class CheckpointTest : public dufu::testing::TempDirTest {
 protected:
  void SetUp() override {
    saved_level_ = log_level();
    set_log_level(LogLevel::kWarn);  // keep "saved checkpoint" lines out of the output
  }
  void TearDown() override { set_log_level(saved_level_); }

  std::string run_dir() const { return dir_.file("run"); }
  std::string save(const Trained& run, std::int64_t step, int keep_last = 100) {
    return save_checkpoint(run_dir(), run.model, run.optimizer, make_state(step), keep_last);
  }

  LogLevel saved_level_ = LogLevel::kInfo;
};

}  // namespace dufu::trainer::checkpoint_testing
