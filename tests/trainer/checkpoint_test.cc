// Tests for saving and loading checkpoints (checkpoint.h): a save and load restores
// weights, AdamW moments, step count and training state bit for bit; model.safetensors
// has HF's GPT-2 layout, checked tensor by tensor and by PyTorch (tests/reference/
// hf_checkpoint_reference.py computes the loss of the file's weights); old and
// replaced checkpoints are cleaned up on save; and a load refuses another model shape
// or wrong tensors, and a save non-finite weights, with a message naming the file and
// the problem. What a load verifies of state.json and the files is
// checkpoint_state_test.cc's, finding a usable checkpoint checkpoint_find_test.cc's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "checkpoint_test_support.h"
#include "dufu/common/error.h"
#include "dufu/common/npy.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/safetensors.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/expect_error.h"
#include "support/float_compare.h"
#include "support/gpt_fixture.h"
#include "support/tool_runner.h"

namespace dufu::trainer {
namespace {

using namespace checkpoint_testing;  // the fixture and helpers the checkpoint tests share
using dufu::testing::bitwise_equal;
using dufu::testing::expect_error;
using dufu::testing::read_all;
using dufu::testing::relative_error;
using dufu::testing::write_all;

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

// model.arch = llama: model.safetensors under LlamaForCausalLM's names (written out
// here), [out, in] as dufu's, embed_tokens and the untied lm_head cut to the real
// vocabulary; the metadata carries the llama knobs; the round trip is bitwise.
TEST_F(CheckpointTest, LlamaModelFileHasLlamaForCausalLMLayout) {
  GPTConfig config = small_config();
  config.arch = Architecture::kLlama;
  config.ffn_hidden = 48;
  config.rope_theta = 500000.0f;
  config.norm_eps = 1e-6f;
  config.tie_embeddings = false;
  Trained run(13, 2, config);
  TrainingState state = make_state(2);
  state.model = config;
  const std::string dir = save_checkpoint(run_dir(), run.model, run.optimizer, state, 2);
  const auto file = safetensors::File::open(dir + "/model.safetensors");
  EXPECT_EQ(file.metadata().at("arch"), "llama");
  EXPECT_EQ(file.metadata().at("n_kv_head"), "0");
  EXPECT_EQ(file.metadata().at("ffn_hidden"), "48");
  EXPECT_EQ(file.metadata().at("rope_theta"), "5e+05");  // the shortest text of the float
  EXPECT_EQ(file.metadata().at("norm_eps"), "1e-06");
  EXPECT_EQ(file.metadata().at("tie_embeddings"), "false");
  std::map<std::string, std::string> hf_of = {{"model.embed_tokens.weight", "wte.weight"},
                                              {"model.norm.weight", "ln_f.weight"},
                                              {"lm_head.weight", "lm_head.weight"}};
  for (int l = 0; l < config.n_layer; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".", dufu = "h." + std::to_string(l) + ".";
    hf_of[hf + "input_layernorm.weight"] = dufu + "ln_1.weight";
    hf_of[hf + "post_attention_layernorm.weight"] = dufu + "ln_2.weight";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      hf_of[hf + "self_attn." + proj + ".weight"] = dufu + "attn." + proj + ".weight";
    }
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      hf_of[hf + "mlp." + proj + ".weight"] = dufu + "mlp." + proj + ".weight";
    }
  }
  EXPECT_EQ(file.tensors().size(), hf_of.size());
  EXPECT_EQ(run.model.parameter_tensors().size(), hf_of.size());
  for (const auto& [hf, dufu] : hf_of) {
    SCOPED_TRACE(hf);
    ASSERT_NE(file.find(hf), nullptr);
    const ParamTensor& tensor = run.model.tensor(dufu);
    std::vector<std::uint64_t> shape(tensor.shape.begin(), tensor.shape.end());
    if (dufu == "wte.weight" || dufu == "lm_head.weight") shape[0] = 100;
    EXPECT_EQ(file.find(hf)->shape, shape);
    const std::span<const float> values = file.view<float>(hf);
    EXPECT_TRUE(bitwise_equal(values, run.model.params().subspan(tensor.offset, values.size())));
  }
  EXPECT_EQ(file.find("lm_head.weight")->shape, (std::vector<std::uint64_t>{100, 32}));

  EXPECT_TRUE(read_checkpoint_state(dir) == state);
  GPT model(config);
  AdamW optimizer(model, AdamWOptions{});
  load_checkpoint(dir, model, &optimizer);
  EXPECT_TRUE(bitwise_equal(model.params(), run.model.params()));
  EXPECT_TRUE(bitwise_equal(optimizer.m(), run.optimizer.m()));
  EXPECT_TRUE(bitwise_equal(optimizer.v(), run.optimizer.v()));
  // A GPT-2 model of the same sizes is another model, named by its field.
  GPT gpt2(small_config());
  expect_error([&] { load_checkpoint(dir, gpt2, nullptr); }, {"arch llama", "arch gpt2"});
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

}  // namespace
}  // namespace dufu::trainer
