// Tests for checkpoints (checkpoint.h): a save and load restores weights, AdamW
// moments, step count and training state bit for bit; model.safetensors has HF's
// GPT-2 layout, checked tensor by tensor and by PyTorch (tests/reference/
// hf_checkpoint_reference.py computes the loss of the file's weights); old, partial
// and replaced checkpoints are cleaned up; and every kind of damage (truncation, a
// flipped byte, a garbled state.json, another model shape, wrong tensors) is refused
// with a message naming the file and the problem.
#include "dufu/trainer/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "dufu/common/npy.h"
#include "dufu/trainer/checkpoint/safetensors.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/expect_error.h"
#include "support/float_compare.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir_test.h"
#include "support/tool_runner.h"

namespace dufu::trainer {
namespace {

namespace fs = std::filesystem;
using dufu::testing::bitwise_equal;
using dufu::testing::expect_error;
using dufu::testing::read_all;
using dufu::testing::relative_error;
using dufu::testing::write_all;

constexpr int kB = 2;
constexpr int kT = 16;

GPTConfig small_config() {
  // vocab_size 100 is padded to 128: 28 padding rows that the checkpoint cuts.
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 4, .d_model = 32, .vocab_size = 100, .vocab_multiple = 64, .seq_length = kT});
}

using Batch = dufu::testing::TokenBatch;

// Next-token targets with a few positions ignored (-1).
Batch make_batch(int vocab_size, std::uint32_t seed) {
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
TrainingState make_state(std::int64_t step) {
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

std::vector<std::string> names_of(const std::vector<std::string>& paths) {
  std::vector<std::string> names;
  for (const std::string& path : paths) names.push_back(fs::path(path).filename().string());
  return names;
}

std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// The tensors of a safetensors file, to write back with changes.
std::vector<safetensors::TensorRef> refs_of(const safetensors::File& file) {
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

TEST_F(CheckpointTest, RoundTripIsBitwise) {
  Trained run(11, 3);
  const TrainingState state = make_state(3);
  const std::string dir = save_checkpoint(run_dir(), run.model, run.optimizer, state, 2);
  EXPECT_EQ(dir, run_dir() + "/checkpoints/step_00000003");
  EXPECT_EQ(list_dir(dir), (std::set<std::string>{"config.toml", "model.safetensors", "optimizer.safetensors",
                                                    "state.json"}));
  EXPECT_EQ(list_dir(run_dir() + "/checkpoints"), (std::set<std::string>{"step_00000003"}));
  EXPECT_EQ(read_all(dir + "/config.toml"), state.config_toml);
  const std::string json = read_all(dir + "/state.json");
  EXPECT_EQ(json.rfind("{\"format\":\"dufu-checkpoint\",\"version\":2,\"step\":3,", 0), 0u) << json;
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 1) << "one line of compact JSON";

  EXPECT_TRUE(read_checkpoint_state(dir) == state);

  GPT model(small_config());
  AdamW optimizer(model, AdamWOptions{});
  load_checkpoint(dir, model, &optimizer);
  EXPECT_TRUE(bitwise_equal(model.params(), run.model.params()));
  EXPECT_TRUE(bitwise_equal(optimizer.m(), run.optimizer.m()));
  EXPECT_TRUE(bitwise_equal(optimizer.v(), run.optimizer.v()));
  EXPECT_EQ(optimizer.step_count(), 3);

  // Resuming is exact: one more step on each gives the same weights.
  Trained resumed(11, 0);
  load_checkpoint(dir, resumed.model, &resumed.optimizer);
  run.step();
  resumed.step();
  EXPECT_TRUE(bitwise_equal(resumed.model.params(), run.model.params()));
  EXPECT_EQ(resumed.optimizer.step_count(), 4);

  // Weights only: the optimizer file is not needed.
  fs::remove(dir + "/optimizer.safetensors");
  GPT weights_only(small_config());
  load_checkpoint(dir, weights_only, nullptr);
  EXPECT_TRUE(bitwise_equal(weights_only.params(), model.params()));
}

TEST_F(CheckpointTest, ModelFileHasHuggingFaceLayout) {
  Trained run(12, 2);
  const std::string dir = save(run, 2);
  const GPTConfig config = small_config();
  const auto file = safetensors::File::open(dir + "/model.safetensors");
  EXPECT_EQ(file.metadata(), (safetensors::Metadata{{"format", "pt"},
                                                    {"n_layer", "2"},
                                                    {"n_head", "4"},
                                                    {"d_model", "32"},
                                                    {"vocab_size", "100"},
                                                    {"vocab_multiple", "64"},
                                                    {"seq_length", "16"}}));
  std::set<std::string> want_names, names;
  for (const ParamTensor& tensor : run.model.parameter_tensors()) want_names.insert(tensor.name);
  for (const safetensors::TensorView& tensor : file.tensors()) names.insert(tensor.name);
  EXPECT_EQ(names, want_names);
  EXPECT_TRUE(want_names.contains("h.1.attn.c_attn.weight"));

  const std::uint64_t C = 32;
  const std::set<std::string> conv1d = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                        "mlp.c_proj.weight"};
  int transposed = 0;
  for (const ParamTensor& tensor : run.model.parameter_tensors()) {
    SCOPED_TRACE(tensor.name);
    const std::span<const float> values = file.view<float>(tensor.name);
    const std::span<const float> params = run.model.params().subspan(tensor.offset, tensor.size());
    const std::vector<std::uint64_t>& shape = file.tensor(tensor.name).shape;
    const std::string suffix = tensor.name.substr(tensor.name.find('.', 2) + 1);  // past "h.<i>."
    if (tensor.name == "wte.weight") {
      EXPECT_EQ(shape, (std::vector<std::uint64_t>{100, C}));
      EXPECT_TRUE(bitwise_equal(values, params.first(100 * C)));
    } else if (tensor.name.starts_with("h.") && conv1d.contains(suffix)) {
      const std::size_t out = tensor.shape[0], in = tensor.shape[1];
      EXPECT_EQ(shape, (std::vector<std::uint64_t>{in, out}));
      ASSERT_EQ(values.size(), in * out);
      for (std::size_t i = 0; i < out; ++i) {
        for (std::size_t j = 0; j < in; ++j) ASSERT_EQ(values[j * out + i], params[i * in + j]) << i << ", " << j;
      }
      ++transposed;
    } else {
      EXPECT_EQ(shape, std::vector<std::uint64_t>(tensor.shape.begin(), tensor.shape.end()));
      EXPECT_TRUE(bitwise_equal(values, params));
    }
  }
  EXPECT_EQ(transposed, 4 * config.n_layer);
  const auto c_attn = file.tensor("h.0.attn.c_attn.weight").shape;
  EXPECT_EQ(c_attn, (std::vector<std::uint64_t>{C, 3 * C}));
  EXPECT_EQ(file.tensor("h.0.mlp.c_proj.weight").shape, (std::vector<std::uint64_t>{4 * C, C}));

  // The optimizer file keeps dufu's layout: padded, untransposed.
  const auto moments = safetensors::File::open(dir + "/optimizer.safetensors");
  EXPECT_EQ(moments.tensors().size(), 2 * run.model.parameter_tensors().size() + 1);
  EXPECT_EQ(moments.tensor("exp_avg.wte.weight").shape, (std::vector<std::uint64_t>{128, C}));
  EXPECT_EQ(moments.tensor("exp_avg_sq.h.0.attn.c_attn.weight").shape, (std::vector<std::uint64_t>{3 * C, C}));
  EXPECT_TRUE(moments.tensor("step").shape.empty());
  EXPECT_EQ(moments.view<std::int64_t>("step")[0], 2);
}

// PyTorch's GPT-2 with HF's Conv1D layout, fed the file's tensors as they are, must
// compute the loss dufu computes with its own model. fp32 on both sides, summed in
// different orders: the same tolerance as gpt_torch_test.
constexpr double kLossRelTolerance = 1e-5;
TEST_F(CheckpointTest, PyTorchComputesTheSameLossFromModelFile) {
  Trained run(13, 3);
  // Weights well away from GPT-2's initialisation, so that every tensor, and a
  // wrongly transposed one, moves the loss clearly.
  dufu::testing::fill_uniform(run.model.params(), 13, -0.3f, 0.3f);
  const ParamTensor& wte = run.model.tensor("wte.weight");
  const std::size_t real = static_cast<std::size_t>(small_config().vocab_size * small_config().d_model);
  std::fill_n(run.model.params().begin() + static_cast<std::ptrdiff_t>(wte.offset + real), wte.size() - real, 0.0f);
  const std::string dir = save(run, 3);
  const Batch batch = make_batch(small_config().vocab_size, 99);
  const float loss = run.model.forward(batch.tokens, batch.targets, kB, kT);
  write_npy(dir_.file("tokens.npy"), std::span<const std::int32_t>(batch.tokens), {kB, kT});
  write_npy(dir_.file("targets.npy"), std::span<const std::int32_t>(batch.targets), {kB, kT});

  const auto reference_loss = [&](const std::string& checkpoint) {
    const std::string command = str_cat(
        DUFU_REFERENCE_PYTHON, " ", DUFU_SOURCE_DIR, "/tests/reference/hf_checkpoint_reference.py --checkpoint ",
        dufu::testing::shell_quote(checkpoint), " --tokens ", dufu::testing::shell_quote(dir_.file("tokens.npy")),
        " --targets ", dufu::testing::shell_quote(dir_.file("targets.npy")), " --n-head ", small_config().n_head,
        " --out ", dufu::testing::shell_quote(dir_.file("loss.npy")));
    const dufu::testing::CommandResult result = dufu::testing::run_command(command);
    EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.output;
    if (result.exit_code != 0) return std::nanf("");
    return NpyArray::open(dir_.file("loss.npy")).view<float>()[0];
  };
  const float want = reference_loss(dir);
  std::printf("loss: dufu %.8f torch %.8f rel err %.3e\n", loss, want, relative_error(loss, want));
  EXPECT_RELATIVE_NEAR(loss, want, kLossRelTolerance);

  // The comparison sees a square Conv1D weight written untransposed (same shape).
  {
    const auto file = safetensors::File::open(dir + "/model.safetensors");
    std::vector<safetensors::TensorRef> refs = refs_of(file);
    const ParamTensor& c_proj = run.model.tensor("h.1.attn.c_proj.weight");
    for (auto& ref : refs) {
      if (ref.name == c_proj.name) ref.data = run.model.params().data() + c_proj.offset;
    }
    fs::create_directories(dir_.file("untransposed"));
    safetensors::write(dir_.file("untransposed/model.safetensors"), refs, file.metadata());
  }
  const float wrong = reference_loss(dir_.file("untransposed"));
  std::printf("with h.1.attn.c_proj.weight untransposed: torch %.8f rel diff %.3e\n", wrong,
              relative_error(wrong, loss));
  EXPECT_GT(relative_error(wrong, loss), 10 * kLossRelTolerance) << "the comparison is too coarse to see it";
}

TEST_F(CheckpointTest, KeepLastRemovesOlderAndUnfinishedDirectories) {
  const std::string checkpoints = run_dir() + "/checkpoints";
  fs::create_directories(checkpoints + "/step_00000002.partial-12345");
  write_all(checkpoints + "/step_00000002.partial-12345/model.safetensors", "half");
  fs::create_directories(checkpoints + "/step_00000001.replaced-777");
  fs::create_directories(checkpoints + "/notes");
  fs::create_directories(checkpoints + "/step_00000009");  // no state.json: not a checkpoint, not ours

  Trained run(14, 1);
  for (int step = 1; step <= 5; ++step) save(run, step, /*keep_last=*/2);
  EXPECT_EQ(names_of(list_checkpoints(run_dir())), (std::vector<std::string>{"step_00000004", "step_00000005"}));
  EXPECT_EQ(list_dir(checkpoints),
            (std::set<std::string>{"notes", "step_00000004", "step_00000005", "step_00000009"}));

  save(run, 6, /*keep_last=*/1);
  EXPECT_EQ(names_of(list_checkpoints(run_dir())), (std::vector<std::string>{"step_00000006"}));
}

TEST_F(CheckpointTest, SameStepIsReplaced) {
  Trained first(15, 1);
  Trained second(16, 2);
  save(first, 3);
  TrainingState state = make_state(3);
  state.consumed_samples = 4242;
  const std::string dir = save_checkpoint(run_dir(), second.model, second.optimizer, state, 3);
  EXPECT_EQ(list_dir(run_dir() + "/checkpoints"), (std::set<std::string>{"step_00000003"}));
  EXPECT_TRUE(read_checkpoint_state(dir) == state);
  GPT model(small_config());
  AdamW optimizer(model, AdamWOptions{});
  load_checkpoint(dir, model, &optimizer);
  EXPECT_TRUE(bitwise_equal(model.params(), second.model.params()));
  EXPECT_EQ(optimizer.step_count(), 2);
}

TEST_F(CheckpointTest, ListIsOrderedByStepNumber) {
  EXPECT_TRUE(list_checkpoints(run_dir()).empty());  // no run directory
  fs::create_directories(run_dir());
  EXPECT_TRUE(list_checkpoints(run_dir()).empty());  // no checkpoints/ directory
  Trained run(17, 1);
  for (const std::int64_t step : {7, 20, 100000000}) save(run, step);
  const std::string checkpoints = run_dir() + "/checkpoints";
  fs::create_directories(checkpoints + "/step_00000030");  // without state.json
  fs::create_directories(checkpoints + "/step_abc");
  fs::create_directories(checkpoints + "/step_00000040.partial-1");
  write_all(checkpoints + "/step_00000050", "a file");
  EXPECT_EQ(list_checkpoints(run_dir()),
            (std::vector<std::string>{checkpoints + "/step_00000007", checkpoints + "/step_00000020",
                                      checkpoints + "/step_100000000"}));
}

// A run resumed from an earlier checkpoint rewrites the later ones' future: they are
// removed so that a later resume cannot pick them up.
TEST_F(CheckpointTest, LaterCheckpointsAreRemovedOnSave) {
  Trained run(18, 1);
  save(run, 10);
  save(run, 20);
  ::testing::internal::CaptureStderr();
  save(run, 15);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(names_of(list_checkpoints(run_dir())), (std::vector<std::string>{"step_00000010", "step_00000015"}));
  EXPECT_NE(log.find("step_00000020"), std::string::npos) << log;
}

TEST_F(CheckpointTest, SaveRejectsBadArgumentsAndReportsIOFailures) {
  Trained run(19, 1);
  expect_error([&] { save(run, 1, /*keep_last=*/0); }, {"keep_last", "at least 1"});
  TrainingState state = make_state(1);
  state.model.n_layer = 3;
  expect_error([&] { save_checkpoint(run_dir(), run.model, run.optimizer, state, 1); }, {"n_layer 3", "n_layer"});
  EXPECT_FALSE(fs::exists(run_dir()));

  fs::create_directories(run_dir());
  write_all(run_dir() + "/checkpoints", "not a directory");
  expect_error([&] { save(run, 1); }, {run_dir() + "/checkpoints"});
}

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

TEST_F(CheckpointTest, OtherModelShapeIsRefusedNamingTheField) {
  Trained run(23, 1);
  const std::string dir = save(run, 1);
  GPTConfig deeper = small_config();
  deeper.n_layer = 3;
  Trained other(23, 0, deeper);
  expect_error([&] { load_checkpoint(dir, other.model, &other.optimizer); },
               {dir, "the checkpoint's model has n_layer 2", "has n_layer 3"});
  GPTConfig wider = small_config();
  wider.d_model = 64;
  GPT wide(wider);
  expect_error([&] { load_checkpoint(dir, wide, nullptr); }, {"d_model 32", "d_model 64"});
  GPTConfig padded = small_config();
  padded.vocab_multiple = 128;
  GPT padded_model(padded);
  expect_error([&] { load_checkpoint(dir, padded_model, nullptr); }, {"vocab_multiple 64", "vocab_multiple 128"});
}

// load_checkpoint trusts state.json's digests to have been checked, but still checks
// every tensor; these files are rewritten by hand to get past the digests.
TEST_F(CheckpointTest, WrongTensorsAreRefusedAndNothingIsLoaded) {
  Trained run(24, 2);
  const std::string dir = save(run, 2);
  const std::string model_path = dir + "/model.safetensors";
  const std::string optimizer_path = dir + "/optimizer.safetensors";
  const std::string model_bytes = read_all(model_path);
  const std::string optimizer_bytes = read_all(optimizer_path);
  const std::vector<double> f64_bias(32, 0.0);
  const std::vector<float> untransposed(32 * 128, 0.5f);

  struct Case {
    std::string file;    // the file to rewrite
    std::string name;    // the tensor to change
    std::string change;  // "drop", "add", "f64", "untransposed"
    std::string message;
  };
  const std::vector<Case> cases = {
      {model_path, "h.1.ln_2.bias", "drop", "model.safetensors: missing tensor \"h.1.ln_2.bias\""},
      {model_path, "h.0.attn.bias", "add", "model.safetensors: unexpected tensor \"h.0.attn.bias\""},
      {model_path, "ln_f.bias", "f64", "model.safetensors: tensor \"ln_f.bias\" is F64, read as F32"},
      {model_path, "h.0.mlp.c_fc.weight", "untransposed",
       "model.safetensors: tensor \"h.0.mlp.c_fc.weight\" has shape [128, 32], expected [32, 128]"},
      {optimizer_path, "exp_avg_sq.wpe.weight", "drop",
       "optimizer.safetensors: missing tensor \"exp_avg_sq.wpe.weight\""},
      {optimizer_path, "step", "drop", "optimizer.safetensors: missing tensor \"step\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    write_all(model_path, model_bytes);
    write_all(optimizer_path, optimizer_bytes);
    {
      const auto file = safetensors::File::open(c.file);
      std::vector<safetensors::TensorRef> refs = refs_of(file);
      if (c.change == "drop") {
        std::erase_if(refs, [&](const safetensors::TensorRef& ref) { return ref.name == c.name; });
      } else if (c.change == "add") {
        refs.push_back({c.name, safetensors::Dtype::kF32, {2}, untransposed.data()});
      } else {
        for (auto& ref : refs) {
          if (ref.name != c.name) continue;
          if (c.change == "f64") ref = {c.name, safetensors::Dtype::kF64, {32}, f64_bias.data()};
          if (c.change == "untransposed") ref = {c.name, safetensors::Dtype::kF32, {128, 32}, untransposed.data()};
        }
      }
      safetensors::write(c.file, refs, file.metadata());
    }
    Trained fresh(25, 1);
    const std::vector<float> params(fresh.model.params().begin(), fresh.model.params().end());
    const std::vector<float> m(fresh.optimizer.m().begin(), fresh.optimizer.m().end());
    expect_error([&] { load_checkpoint(dir, fresh.model, &fresh.optimizer); }, {c.file, c.message});
    EXPECT_TRUE(bitwise_equal(fresh.model.params(), params)) << "a failed load changed the weights";
    EXPECT_TRUE(bitwise_equal(fresh.optimizer.m(), m)) << "a failed load changed the moments";
    EXPECT_EQ(fresh.optimizer.step_count(), 1);
  }
}

TEST_F(CheckpointTest, FindUsableSkipsCorruptNewestWithAWarning) {
  Trained run(26, 1);
  const std::string older = save(run, 10);
  const std::string newer = save(run, 20);
  std::string bytes = read_all(newer + "/model.safetensors");
  bytes[bytes.size() - 5] ^= 0x01;
  write_all(newer + "/model.safetensors", bytes);

  ::testing::internal::CaptureStderr();
  const std::optional<std::string> found = find_usable_checkpoint(run_dir());
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, older);
  EXPECT_NE(log.find("WARN"), std::string::npos) << log;
  EXPECT_NE(log.find("skipping checkpoint '" + newer + "'"), std::string::npos) << log;
  EXPECT_NE(log.find("model.safetensors has SHA-256"), std::string::npos) << log;

  // A checkpoint directory named directly is returned as it is, or refused.
  EXPECT_EQ(find_usable_checkpoint(older), older);
  expect_error([&] { find_usable_checkpoint(newer); }, {newer, "(corrupt)"});

  // None usable: the newest one's reason.
  fs::resize_file(older + "/optimizer.safetensors", 64);
  ::testing::internal::CaptureStderr();
  expect_error([&] { find_usable_checkpoint(run_dir()); },
               {run_dir(), "none of its 2 checkpoints verifies", "model.safetensors has SHA-256"});
  ::testing::internal::GetCapturedStderr();
}

TEST_F(CheckpointTest, FindUsableOnRunWithoutCheckpointsOrMissingPath) {
  fs::create_directories(run_dir());
  EXPECT_EQ(find_usable_checkpoint(run_dir()), std::nullopt);
  fs::create_directories(run_dir() + "/checkpoints/step_00000005.partial-3");
  EXPECT_EQ(find_usable_checkpoint(run_dir()), std::nullopt);

  expect_error([&] { find_usable_checkpoint(dir_.file("nowhere")); }, {dir_.file("nowhere"), "no such"});
  write_all(dir_.file("file"), "x");
  expect_error([&] { find_usable_checkpoint(dir_.file("file")); }, {dir_.file("file"), "not a directory"});

  // Neither is the checkpoints/ directory, nor a checkpoint without its state.json.
  Trained run(27, 1);
  const std::string dir = save(run, 1);
  expect_error([&] { find_usable_checkpoint(run_dir() + "/checkpoints"); },
               {run_dir() + "/checkpoints", "checkpoints/ directory", "HINT"});
  fs::remove(dir + "/state.json");
  expect_error([&] { find_usable_checkpoint(dir); }, {dir, "incomplete checkpoint", "no state.json"});
}

// A step directory without state.json is a checkpoint that cannot be used: skipped
// with a warning when an older one verifies, and when none does the run directory is
// refused (training must not start over it and replace them), naming the newest and
// why.
TEST_F(CheckpointTest, FindUsableRefusesARunWhoseCheckpointsLackStateJson) {
  Trained run(28, 1);
  const std::string older = save(run, 10);
  const std::string newer = save(run, 20);
  fs::remove(newer + "/state.json");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_usable_checkpoint(run_dir()), older);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("skipping checkpoint '" + newer + "': " + newer + ": it has no state.json"), std::string::npos)
      << log;

  fs::remove(older + "/state.json");
  ::testing::internal::CaptureStderr();
  expect_error([&] { find_usable_checkpoint(run_dir()); },
               {run_dir() + ": none of its 2 checkpoints verifies, and training will not start over them",
                newer + ": it has no state.json", "HINT: restore a good checkpoint there, or remove " + run_dir() +
                                                      "/checkpoints (or choose another run.dir)"});
  ::testing::internal::GetCapturedStderr();
  // Not even a partial directory beside them makes it a run without checkpoints.
  fs::remove_all(older);
  ::testing::internal::CaptureStderr();
  expect_error([&] { find_usable_checkpoint(run_dir()); }, {"none of its 1 checkpoints verifies"});
  ::testing::internal::GetCapturedStderr();
}

// What processes killed while saving leave behind, cleaned up by the next run: partial
// directories go; a checkpoint moved aside for a new version of its step goes once the
// new one is in place, and is put back when it is not (killed between the renames).
TEST_F(CheckpointTest, LeftoversAreRemovedAndAReplacedCheckpointPutBack) {
  Trained run(29, 1);
  save(run, 1);
  const std::string second = save(run, 2);
  const std::string checkpoints = run_dir() + "/checkpoints";
  const std::string model_bytes = read_all(second + "/model.safetensors");
  fs::rename(second, checkpoints + "/step_00000002.replaced-31");
  fs::create_directories(checkpoints + "/step_00000001.replaced-32");
  fs::create_directories(checkpoints + "/step_00000003.partial-33");
  write_all(checkpoints + "/step_00000003.partial-33/model.safetensors", "half");
  fs::create_directories(checkpoints + "/notes.replaced-34");  // not a checkpoint's name: not ours
  ::testing::internal::CaptureStderr();
  remove_checkpoint_leftovers(run_dir());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(list_dir(checkpoints),
            (std::set<std::string>{"step_00000001", "step_00000002", "notes.replaced-34"}));
  EXPECT_NE(log.find("restored checkpoint '" + second + "'"), std::string::npos) << log;
  EXPECT_EQ(read_all(second + "/model.safetensors"), model_bytes);
  EXPECT_EQ(find_usable_checkpoint(run_dir()), second);
  remove_checkpoint_leftovers(dir_.file("no-run"));  // nothing there: nothing to do
}

// No checkpoint with a NaN or an infinity is ever published: the save fails naming
// the step, the file and the first tensor, and the checkpoints before stay the newest.
TEST_F(CheckpointTest, NonFiniteWeightsOrMomentsAreNeverPublished) {
  Trained run(30, 1);
  const std::string good = save(run, 1);
  const std::string checkpoints = run_dir() + "/checkpoints";
  const std::size_t in_c_fc = run.model.tensor("h.1.mlp.c_fc.weight").offset + 5;
  const float weight = run.model.params()[in_c_fc];
  run.model.params()[in_c_fc] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { save(run, 2); },
               {"checkpoint of step 2 not written: model.safetensors: 1 of ",
                " weights are not finite (the first in h.1.mlp.c_fc.weight is nan)", "never published"});
  run.model.params()[in_c_fc] = weight;
  run.optimizer.v()[7] = std::numeric_limits<float>::infinity();
  expect_error([&] { save(run, 2); },
               {"checkpoint of step 2 not written: optimizer.safetensors: 1 of ", "AdamW second moments",
                "the first in wte.weight is inf"});
  EXPECT_EQ(list_dir(checkpoints), (std::set<std::string>{"step_00000001"}));
  EXPECT_EQ(find_usable_checkpoint(run_dir()), good);
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

// The pieces of every (tensor rank, stage) of a layout tile the serial buffer, and
// each piece is what the separate tensor-parallel and pipeline moves give.
TEST(GptPieces, TileTheSerialLayoutLikeShardAndStage) {
  GPTConfig config = small_config();
  config.n_layer = 4;
  const std::size_t full_size = GPT(config).num_parameters();
  std::vector<float> full = dufu::testing::random_floats(full_size, 5, -1.0f, 1.0f);
  // wte's padding rows are not carried by the pieces: the serial buffer holds 0 there.
  const ParamTensor wte = gpt_parameter_layout(config).front();
  std::fill(full.begin() + static_cast<std::ptrdiff_t>(config.vocab_size * config.d_model),
            full.begin() + static_cast<std::ptrdiff_t>(wte.size()), 0.0f);
  for (const int tp : {1, 2, 4}) {
    for (const std::vector<int>& split : {std::vector<int>{4}, std::vector<int>{1, 3}, std::vector<int>{2, 1, 1}}) {
      SCOPED_TRACE(str_cat("tp ", tp, ", ", split.size(), " stages starting with ", split.front(), " layers"));
      std::vector<float> assembled(full_size, 0.0f);
      for (int stage_index = 0; stage_index < static_cast<int>(split.size()); ++stage_index) {
        const PipelineStage stage = pipeline_stage(split, stage_index);
        const std::vector<ParamTensor> stage_layout = gpt_stage_layout(config, gpt_parameter_layout(config), stage);
        std::vector<float> staged(stage_layout.back().offset + stage_layout.back().size());
        stage_gpt_buffer(config, stage, full, staged);
        const std::vector<ParamTensor> piece_layout =
            gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage);
        for (int rank = 0; rank < tp; ++rank) {
          std::vector<float> piece(piece_layout.back().offset + piece_layout.back().size(), -7.0f);
          shard_gpt_piece(config, tp, rank, stage, full, piece);
          // The reference: stage first, then cut the stage's tensors as shard_gpt_buffer
          // cuts the whole model's (tensor by tensor, by name).
          std::vector<float> local(gpt_parameter_layout(config, tp).back().offset +
                                   gpt_parameter_layout(config, tp).back().size());
          shard_gpt_buffer(config, tp, rank, full, local);
          const std::vector<ParamTensor> local_layout = gpt_parameter_layout(config, tp);
          for (const ParamTensor& tensor : piece_layout) {
            const auto match = std::find_if(local_layout.begin(), local_layout.end(),
                                            [&](const ParamTensor& t) { return t.name == tensor.name; });
            ASSERT_NE(match, local_layout.end());
            ASSERT_EQ(match->size(), tensor.size());
            EXPECT_TRUE(std::equal(piece.begin() + static_cast<std::ptrdiff_t>(tensor.offset),
                                   piece.begin() + static_cast<std::ptrdiff_t>(tensor.offset + tensor.size()),
                                   local.begin() + static_cast<std::ptrdiff_t>(match->offset)))
                << tensor.name << " of rank " << rank;
          }
          if (tp == 1) {
            EXPECT_EQ(piece, staged);
          }
          unshard_gpt_piece(config, tp, rank, stage, piece, assembled);
        }
      }
      EXPECT_EQ(assembled, full);
    }
  }
  std::vector<float> wrong(3);
  expect_error([&] { shard_gpt_piece(config, 2, 0, PipelineStage{}, full, wrong); },
               {"shard_gpt_piece", "floats"});
  expect_error([&] { unshard_gpt_piece(config, 2, 2, PipelineStage{}, wrong, full); },
               {"unshard_gpt_piece", "tensor rank 2 is not in [0, 2)"});
}

}  // namespace
}  // namespace dufu::trainer
