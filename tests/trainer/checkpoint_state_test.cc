// What a checkpoint records besides its tensors (checkpoint_state.h): state.json read
// back with every check, so that a truncated or corrupt tensor file and every kind of
// damage to state.json is refused naming the file and the problem; the training
// state's equality; and the file names of each layout.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_test_support.h"
#include "dufu/common/error.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "support/expect_error.h"
#include "support/tool_runner.h"

namespace dufu::trainer {
namespace {

using namespace checkpoint_testing;  // the fixture and helpers the checkpoint tests share
using dufu::testing::expect_error;
using dufu::testing::read_all;
using dufu::testing::write_all;

TEST_F(CheckpointTest, TruncatedModelFileIsRefused) {
  Trained run(20, 1);
  const std::string dir = save(run, 1);
  const std::string path = dir + "/model.safetensors";
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 100);
  expect_error([&] { read_checkpoint_state(dir); },
               {dir, str_cat("model.safetensors is ", size - 100, " bytes, state.json says ", size, " (truncated?)")});
}

TEST_F(CheckpointTest, FlippedByteInOptimizerFileIsRefused) {
  Trained run(21, 1);
  const std::string dir = save(run, 1);
  const std::string path = dir + "/optimizer.safetensors";
  std::string bytes = read_all(path);
  bytes[bytes.size() / 2] ^= 0x10;
  write_all(path, bytes);
  expect_error([&] { read_checkpoint_state(dir); }, {dir, "optimizer.safetensors has SHA-256 ", "(corrupt)"});
}

TEST_F(CheckpointTest, MissingOrGarbledStateIsRefused) {
  Trained run(22, 1);
  const std::string dir = save(run, 3);
  const std::string state_path = dir + "/state.json";
  const std::string original = read_all(state_path);
  // Each case edits one thing in the original state.json.
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {"\"consumed_tokens\":", "\"consumed_tokenz\":", "missing field \"consumed_tokens\""},
      {"\"step\":3,", "\"step\":\"3\",", "field \"step\" is a string, expected a non-negative integer"},
      {"\"step\":3,", "\"step\":3.5,", "field \"step\" is a non-integer number"},
      {"\"skipped_steps\":2", "\"skipped_steps\":-2", "field \"skipped_steps\" is -2, expected a non-negative"},
      {"\"init_seed\":4294967295", "\"init_seed\":4294967296", "\"init_seed\" is 4294967296, more than the largest"},
      {"\"n_head\":4,", "\"n_headz\":4,", "missing field \"model.n_head\""},
      {"\"n_head\":4,", "\"n_head\":5,", "\"model\": GPT config: d_model 32 is not divisible by n_head 5"},
      {"\"model\":{", "\"model\":[1],\"x\":{", "field \"model\" is an array, expected an object"},
      {"\"train_loader_state\":\"", "\"train_loader_state\":null,\"x\":\"", "\"train_loader_state\" is null"},
      {"\"format\":\"dufu-checkpoint\"", "\"format\":\"other\"", "\"format\" is \"other\", not \"dufu-checkpoint\""},
      {"\"version\":2,", "\"version\":3,", "checkpoint format version 3, this build reads versions 1 to 2"},
      {"\"tensor_parallel_size\":1", "\"tensor_parallel_size\":3",
       "\"layout\": tensor_parallel_size 3 does not divide n_head 4"},
      {"\"pipeline_parallel_size\":1", "\"pipeline_parallel_size\":3",
       "\"layout\": pipeline_parallel_size 3 is more stages than the model's 2 layers"},
      {"\"optimizer_sharded\":false", "\"optimizer_sharded\":true",
       "\"layout\": optimizer_sharded with data_parallel_size 1"},
      {"\"optimizer_sharded\":false", "\"optimizer_sharded\":0", "\"layout.optimizer_sharded\" is "},
      // A forged layout of 2^31 - 1 ranks: refused by counting, before naming 2^31 files.
      {"\"data_parallel_size\":1,\"optimizer_sharded\":false",
       "\"data_parallel_size\":2147483647,\"optimizer_sharded\":true",
       "\"files\" lists 2 files; a checkpoint of this layout has 2147483648"},
      {"\"pipeline_layers\":[]", "\"pipeline_layers\":[\"2\"]", "\"layout.pipeline_layers\" holds \"2\""},
      {"\"layout\":{", "\"layoutz\":{", "missing field \"layout\""},
      {"\"files\":{", "\"files\":{\"model-tp01.safetensors\":{\"bytes\":1,\"sha256\":\"" + std::string(64, 'a') +
                         "\"},",
       "\"files\" lists \"model-tp01.safetensors\", which a checkpoint of this layout does not have"},
      {"\"step\":3,", "\"step\":4,", "step 4 does not match the directory name step_00000003"},
      {"\"sha256\":\"", "\"sha256\":\"xyz", "\"files.model.safetensors.sha256\" is \"xyz"},
      {"\"bytes\":", "\"bytez\":", "missing field \"files.model.safetensors.bytes\""},
      {"\"optimizer.safetensors\":", "\"optimiser.safetensors\":", "missing field \"files.optimizer.safetensors\""},
      {"\"shards\":[", "\"shards\":7,\"x\":[", "field \"shards\" is an integer, expected an array"},
      {"\"shards\":[", "\"shards\":[7,", "field \"shards[0]\" is an integer, expected an object"},
      {"\"bin_bytes\":", "\"bin_bytez\":", "missing field \"shards[0].bin_bytes\""},
      {"\"idx_bytes\":16", "\"idx_bytes\":-16", "field \"shards[0].idx_bytes\" is -16"},
      {"\"idx_sha256\":\"", "\"idx_sha256\":\"zz", "\"shards[0].idx_sha256\" is \"zz"},
      {"\"prefix\":\"/abs/code\"", "\"prefix\":2", "field \"shards[1].prefix\" is an integer, expected a string"},
      {original, "{\"format\":\"dufu-checkpoint\",\"version\":2,\"step\":", "state.json: not valid JSON"},
      {original, "[1, 2]", "state.json: the top level is an array, not an object"},
      {original, "", "state.json: not valid JSON"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    std::string edited = original;
    const auto at = edited.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    edited.replace(at, c.from.size(), c.to);
    write_all(state_path, edited);
    expect_error([&] { read_checkpoint_state(dir); }, {state_path + ": ", c.message});
  }
  write_all(state_path, original);
  EXPECT_TRUE(read_checkpoint_state(dir) == make_state(3));

  // Version 1 (before layouts) was always serial, and still reads.
  std::string version1 = original;
  version1.replace(version1.find("\"version\":2"), 11, "\"version\":1");
  const auto layout_at = version1.find("\"layout\":{");
  version1.erase(layout_at, version1.find('}', layout_at) + 2 - layout_at);
  ASSERT_EQ(version1.find("layout"), std::string::npos) << version1;
  write_all(state_path, version1);
  EXPECT_TRUE(read_checkpoint_state(dir) == make_state(3));
  // Checkpoints written before the shards were recorded have none, and still read.
  std::string without_shards = original;
  const auto shards_at = without_shards.find("\"shards\":[");
  without_shards.erase(shards_at, without_shards.find("],", shards_at) + 2 - shards_at);
  ASSERT_EQ(without_shards.find("shards"), std::string::npos) << without_shards;
  write_all(state_path, without_shards);
  TrainingState old_state = make_state(3);
  old_state.shards.clear();
  EXPECT_TRUE(read_checkpoint_state(dir) == old_state);
  write_all(state_path, original);

  fs::remove(state_path);
  expect_error([&] { read_checkpoint_state(dir); }, {state_path + ": missing"});
}

TEST(TrainingState, EqualityComparesEveryField) {
  const TrainingState base = make_state(5);
  EXPECT_TRUE(base == make_state(5));
  std::vector<void (*)(TrainingState&)> changes = {
      [](TrainingState& s) { ++s.step; },
      [](TrainingState& s) { ++s.consumed_samples; },
      [](TrainingState& s) { --s.consumed_tokens; },
      [](TrainingState& s) { ++s.skipped_steps; },
      [](TrainingState& s) { s.train_loader_state += " "; },
      [](TrainingState& s) { --s.init_seed; },
      [](TrainingState& s) { ++s.data_seed; },
      [](TrainingState& s) { ++s.model.n_layer; },
      [](TrainingState& s) { ++s.model.n_head; },
      [](TrainingState& s) { ++s.model.d_model; },
      [](TrainingState& s) { ++s.model.vocab_size; },
      [](TrainingState& s) { ++s.model.vocab_multiple; },
      [](TrainingState& s) { ++s.model.seq_length; },
      [](TrainingState& s) { s.config_toml.clear(); },
      [](TrainingState& s) { ++s.layout.tensor_parallel_size; },
      [](TrainingState& s) { ++s.layout.pipeline_parallel_size; },
      [](TrainingState& s) { ++s.layout.data_parallel_size; },
      [](TrainingState& s) { s.layout.optimizer_sharded = true; },
      [](TrainingState& s) { s.layout.pipeline_layers = {1, 1}; },
      [](TrainingState& s) { s.shards.pop_back(); },
      [](TrainingState& s) { s.shards[0].prefix += "x"; },
      [](TrainingState& s) { --s.shards[0].bin_bytes; },
      [](TrainingState& s) { ++s.shards[0].idx_bytes; },
      [](TrainingState& s) { s.shards[0].idx_sha256[3] = 'c'; },
      [](TrainingState& s) { s.shards[0].bin_sample_sha256[3] = 'c'; },
  };
  for (std::size_t i = 0; i < changes.size(); ++i) {
    TrainingState changed = base;
    changes[i](changed);
    EXPECT_FALSE(changed == base) << "change " << i;
  }
}

TEST(CheckpointLayout, NamesOneModelFilePerPieceAndOptimizerFilesPerShard) {
  CheckpointLayout serial;
  serial.data_parallel_size = 4;  // replicated moments: one copy whatever the data-parallel size
  EXPECT_EQ(checkpoint_file_names(serial), (std::vector<std::string>{"model.safetensors", "optimizer.safetensors"}));
  CheckpointLayout zero = serial;
  zero.data_parallel_size = 2;
  zero.optimizer_sharded = true;
  EXPECT_EQ(checkpoint_file_names(zero), (std::vector<std::string>{"model.safetensors", "optimizer-dp000.safetensors",
                                                                   "optimizer-dp001.safetensors"}));
  CheckpointLayout tensor;
  tensor.tensor_parallel_size = 2;
  EXPECT_EQ(checkpoint_file_names(tensor),
            (std::vector<std::string>{"model-tp00.safetensors", "model-tp01.safetensors", "optimizer-tp00.safetensors",
                                      "optimizer-tp01.safetensors"}));
  CheckpointLayout pipeline;
  pipeline.pipeline_parallel_size = 2;
  pipeline.pipeline_layers = {1, 3};
  EXPECT_EQ(checkpoint_file_names(pipeline),
            (std::vector<std::string>{"model-pp000.safetensors", "model-pp001.safetensors",
                                      "optimizer-pp000.safetensors", "optimizer-pp001.safetensors"}));
  CheckpointLayout all = pipeline;
  all.tensor_parallel_size = 2;
  all.data_parallel_size = 2;
  all.optimizer_sharded = true;
  const std::vector<std::string> names = checkpoint_file_names(all);
  ASSERT_EQ(names.size(), 4u + 8u);
  EXPECT_EQ(names[1], "model-tp01-pp000.safetensors");
  EXPECT_EQ(names[2], "model-tp00-pp001.safetensors");
  EXPECT_EQ(names[5], "optimizer-tp00-pp000-dp001.safetensors");
  EXPECT_EQ(names[11], "optimizer-tp01-pp001-dp001.safetensors");
  EXPECT_EQ(model_file_name(all, 1, 1), "model-tp01-pp001.safetensors");
  EXPECT_EQ(optimizer_file_name(all, 0, 1, 1), "optimizer-tp00-pp001-dp001.safetensors");
}

}  // namespace
}  // namespace dufu::trainer
