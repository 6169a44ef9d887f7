// `train export-hf` against HuggingFace transformers (tests/reference/hf_export_check.py
// in the venv of scripts/setup_reference_venv.sh --transformers): the export of a run
// trained on the fixture corpus with its sentencepiece model, and of models with
// byte-level tokenizers (tokenizer.json; vocab.json + merges.txt), loads with no
// warning and no missing or unexpected weight, computes dufu's loss on a batch,
// generates dufu's greedy tokens (and `train generate`'s text), and its tokenizer
// encodes as dufu's. A sharded checkpoint exports the weights `train merge-checkpoint`
// assembles; the checkpoint is left as it was; refusals are one line and leave
// nothing behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "dufu/common/json_writer.h"
#include "dufu/dataprep/tokenizer.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/run/generate.h"
#include "support/fortunes_shard.h"
#include "support/gpt_fixture.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

namespace fs = std::filesystem;
using dufu::JsonWriter;
using dufu::dataprep::Tokenizer;
using dufu::dataprep::TokenizerSpec;
using dufu::testing::CommandResult;
using dufu::testing::fixture_path;
using dufu::testing::read_all;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;
namespace trainer = dufu::trainer;

constexpr int kBatchRows = 2;

// The python of the transformers venv (made by the hf_venv ctest fixture; this only
// reads its path).
const std::string& hf_python() {
  static const std::string python = [] {
    const CommandResult result =
        run_command(shell_quote(std::string(DUFU_SOURCE_DIR) + "/scripts/setup_reference_venv.sh") +
                    " --transformers 2>/dev/null | tail -n 1");
    std::string path = result.output;
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
    return path;
  }();
  return python;
}

std::string check_script() { return std::string(DUFU_SOURCE_DIR) + "/tests/reference/hf_export_check.py"; }

std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// Texts whose encodings the exported tokenizer must reproduce: prose, whitespace runs
// and control characters, special-token text (ordinary text to dufu), numbers,
// accents, CJK, emoji, the empty string.
const std::vector<std::string>& sample_texts() {
  static const std::vector<std::string> texts = {
      "A fool and his money are soon parted.",
      "  two  spaces,\ttabs\tand\nnewlines\n\n",
      "</s> and <s> and <unk> and <|endoftext|> are text here",
      "3.14159 is not 22/7; 1,000,000 > 999999",
      "caf\xc3\xa9 na\xc3\xafve \xc3\xbc"
      "ber \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80",
      " leading space",
      "",
  };
  return texts;
}

// What dufu computes, for hf_export_check.py to compare.
struct DufuSide {
  std::vector<std::int32_t> tokens, targets;
  float loss = 0;
  std::vector<std::int32_t> prompt, greedy;
  int max_new_tokens = 0;
  const std::string* generate_text = nullptr;  // `train generate`'s line, when run
  std::string tokenizer_class;
  bool use_fast = false;
  std::int32_t bos = -1, eos = -1, pad = -1;
};

DufuSide compute_dufu_side(const std::string& checkpoint, const Tokenizer& tokenizer, const std::string& prompt,
                           int max_new_tokens) {
  const trainer::TrainingState state = trainer::read_checkpoint_state(checkpoint);
  trainer::GPT model(state.model);
  trainer::load_checkpoint(checkpoint, model, nullptr);
  DufuSide side;
  // One target ignored (-1), as the training loss ignores the padding.
  auto batch = dufu::testing::next_token_batch(kBatchRows, state.model.seq_length, state.model.vocab_size, 31, {5});
  side.tokens = batch.tokens;
  side.targets = batch.targets;
  side.loss = model.forward(side.tokens, side.targets, kBatchRows, state.model.seq_length);
  tokenizer.encode(prompt, &side.prompt);
  trainer::SamplingOptions greedy;
  greedy.temperature = 0.0f;
  greedy.max_new_tokens = max_new_tokens;
  greedy.stop_token = tokenizer.eos_id();
  side.greedy = trainer::generate(model, side.prompt, greedy);
  side.max_new_tokens = max_new_tokens;
  return side;
}

void write_ids(JsonWriter& json, const std::vector<std::int32_t>& ids) {
  json.begin_array();
  for (const std::int32_t id : ids) json.value(static_cast<std::int64_t>(id));
  json.end_array();
}

void write_rows(JsonWriter& json, const std::vector<std::int32_t>& flat, int rows) {
  const std::size_t width = flat.size() / static_cast<std::size_t>(rows);
  json.begin_array();
  for (int r = 0; r < rows; ++r) {
    write_ids(json, std::vector<std::int32_t>(flat.begin() + static_cast<std::ptrdiff_t>(r * width),
                                              flat.begin() + static_cast<std::ptrdiff_t>((r + 1) * width)));
  }
  json.end_array();
}

void write_token_id(JsonWriter& json, const char* key, std::int32_t id) {
  json.key(key);
  if (id >= 0) {
    json.value(static_cast<std::int64_t>(id));
  } else {
    json.null();
  }
}

// The expectations file of hf_export_check.py check.
std::string expected_json(const DufuSide& side, const trainer::GPTConfig& model, const Tokenizer& tokenizer) {
  JsonWriter json;
  json.begin_object();
  json.key("tokens");
  write_rows(json, side.tokens, kBatchRows);
  json.key("targets");
  write_rows(json, side.targets, kBatchRows);
  json.key("loss").value(static_cast<double>(side.loss));
  json.key("prompt");
  write_ids(json, side.prompt);
  json.key("greedy");
  write_ids(json, side.greedy);
  json.key("max_new_tokens").value(side.max_new_tokens);
  json.key("generate_text");
  if (side.generate_text != nullptr) {
    json.value(*side.generate_text);
  } else {
    json.null();
  }
  json.key("texts").begin_array();
  for (const std::string& text : sample_texts()) json.value(text);
  json.end_array();
  json.key("encodings").begin_array();
  std::vector<std::int32_t> ids;
  for (const std::string& text : sample_texts()) {
    tokenizer.encode(text, &ids);
    write_ids(json, ids);
  }
  json.end_array();
  json.key("tokenizer_class").value(side.tokenizer_class);
  json.key("use_fast").value(side.use_fast);
  // What config.json must say, hand-written from the model's shape: the names
  // transformers gives dufu's fields.
  json.key("config").begin_object();
  json.key("n_layer").value(model.n_layer);
  json.key("n_head").value(model.n_head);
  json.key("n_embd").value(model.d_model);
  json.key("n_positions").value(model.seq_length);
  json.key("vocab_size").value(model.vocab_size);
  json.key("n_inner").null();
  json.key("activation_function").value("gelu_new");
  json.key("layer_norm_epsilon").value(1e-5);
  json.key("tie_word_embeddings").value(true);
  write_token_id(json, "bos_token_id", side.bos);
  write_token_id(json, "eos_token_id", side.eos);
  write_token_id(json, "pad_token_id", side.pad);
  json.end_object();
  json.end_object();
  return json.str();
}

// Runs hf_export_check.py check; returns its output and exit code.
CommandResult run_check(const std::string& export_dir, const std::string& expected_path) {
  return run_command(shell_quote(hf_python()) + " " + shell_quote(check_script()) + " check --export " +
                     shell_quote(export_dir) + " --expected " + shell_quote(expected_path));
}

CommandResult export_hf(const std::string& checkpoint, const std::string& destination, const std::string& tokenizer,
                        const std::string& extra = "") {
  return run_command(shell_quote(train_tool()) + " export-hf " + shell_quote(checkpoint) + " " +
                     shell_quote(destination) + " -m " + shell_quote(tokenizer) + extra);
}

class ExportHfTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(hf_python().empty()) << "setup_reference_venv.sh --transformers failed"; }

  // A 2-layer model trained on the fixture corpus for 100 steps (about a second), so
  // that its greedy text is more than one repeated token.
  std::string train_run(const std::string& name, const std::string& extra_toml = "") {
    const std::string run_dir = dir_.file(name);
    const std::string config = dir_.file(name + ".toml");
    write_all(config,
              "[model]\nn_layer = 2\nn_head = 2\nd_model = 32\nvocab_size = 2000\nseq_length = 32\n"
              "[data]\nblend = \"" +
                  dufu::testing::fortunes_shard() + "\"\ncache_dir = \"" + dufu::testing::fortunes_shard_dir() +
                  "/cache\"\nsplit = \"90,10,0\"\nworkers = 1\n"
                  "[train]\nmicro_batch = 4\nglobal_batch = 8\nsteps = 100\nthreads = 1\n"
                  "[optim]\nlr = 1e-2\nwarmup_steps = 5\n[eval]\ninterval = 0\n"
                  "[checkpoint]\ninterval = 100\nkeep = 1\n[run]\nlog_interval = 100\n" +
                  extra_toml);
    const CommandResult result =
        run_command(shell_quote(train_tool()) + " " + shell_quote(config) + " run.dir=" + shell_quote(run_dir));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return run_dir;
  }

  TempDir dir_;
};

TEST_F(ExportHfTest, SentencePieceRunLoadsInTransformersAndComputesWhatDufuComputes) {
  const std::string run_dir = train_run("run");
  const std::string checkpoint = dufu::testing::checkpoint_dir(run_dir, 100);
  const std::string model_path = fixture_path("fortunes.model");
  const std::string checkpoint_model = read_all(checkpoint + "/model.safetensors");
  const std::string out = dir_.file("hf");
  const CommandResult exported = export_hf(run_dir, out, model_path);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("tokenizer LlamaTokenizer: bos 1, eos 2, pad 2"), std::string::npos)
      << exported.output;
  EXPECT_EQ(list_dir(out), (std::set<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                                  "tokenizer.model", "tokenizer_config.json"}));
  // The weights are the checkpoint's file, byte for byte, and the checkpoint is as it
  // was (its digests still verify).
  EXPECT_TRUE(read_all(out + "/model.safetensors") == checkpoint_model);
  EXPECT_NO_THROW(trainer::read_checkpoint_state(checkpoint));
  EXPECT_TRUE(read_all(out + "/tokenizer.model") == read_all(model_path));

  const Tokenizer tokenizer = Tokenizer::load(model_path);
  const std::string prompt = "A fool and his money";
  DufuSide side = compute_dufu_side(checkpoint, tokenizer, prompt, 12);
  // `train generate` at temperature 0: the text transformers' greedy tokens must decode to.
  const CommandResult generated =
      run_command(shell_quote(train_tool()) + " generate -c " + shell_quote(checkpoint) + " -m " +
                  shell_quote(model_path) + " -p " + shell_quote(prompt) + " -t 0 -n 12");
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  // The line that starts with the prompt (what was loaded goes to stderr, also captured).
  const auto line = generated.output.find("\n" + prompt);
  ASSERT_NE(line, std::string::npos) << generated.output;
  const std::string generate_text = generated.output.substr(line + 1, generated.output.find('\n', line + 1) - line - 1);
  side.generate_text = &generate_text;
  side.tokenizer_class = "LlamaTokenizer";
  side.use_fast = false;
  side.bos = 1;  // sentencepiece's defaults: <unk> 0, <s> 1, </s> 2, no <pad>
  side.eos = 2;
  side.pad = 2;
  std::printf("dufu: loss %.8f, greedy text '%s'\n", side.loss, generate_text.c_str());
  write_all(dir_.file("expected.json"),
            expected_json(side, trainer::read_checkpoint_state(checkpoint).model, tokenizer));
  const CommandResult check = run_check(out, dir_.file("expected.json"));
  std::printf("%s", check.output.c_str());
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("\nOK\n"), std::string::npos) << check.output;

  // The check sees a wrong activation, in the config and in the loss. (Exact GELU
  // instead of its tanh form would not move the loss of weights this small beyond the
  // tolerance; ReLU does.)
  const std::string wrong = dir_.file("hf-wrong-activation");
  fs::copy(out, wrong);
  std::string config = read_all(wrong + "/config.json");
  const auto at = config.find("\"gelu_new\"");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, 10, "\"relu\"");
  write_all(wrong + "/config.json", config);
  const CommandResult wrong_check = run_check(wrong, dir_.file("expected.json"));
  EXPECT_EQ(wrong_check.exit_code, 1) << wrong_check.output;
  EXPECT_NE(wrong_check.output.find("config.activation_function is 'relu'"), std::string::npos) << wrong_check.output;
  EXPECT_NE(wrong_check.output.find("FAIL: loss "), std::string::npos) << wrong_check.output;

  // Refusals: one line, status 1, nothing left behind.
  const std::set<std::string> before = list_dir(dir_.path());
  const CommandResult exists = export_hf(run_dir, out, model_path);
  EXPECT_EQ(exists.exit_code, 1);
  EXPECT_NE(exists.output.find("already exists"), std::string::npos) << exists.output;
  write_all(dir_.file("gpt2.tiktoken"), "IQ== 0\n");
  const CommandResult tiktoken = export_hf(run_dir, dir_.file("hf-tiktoken"), dir_.file("gpt2.tiktoken"));
  EXPECT_EQ(tiktoken.exit_code, 1);
  EXPECT_NE(tiktoken.output.find("tiktoken rank file, which transformers does not read"), std::string::npos)
      << tiktoken.output;
  const CommandResult no_checkpoint = export_hf(dir_.file("nowhere"), dir_.file("hf-none"), model_path);
  EXPECT_EQ(no_checkpoint.exit_code, 1);
  for (const CommandResult* result : {&exists, &tiktoken, &no_checkpoint}) {
    EXPECT_EQ(std::count(result->output.begin(), result->output.end(), '\n'), 1) << result->output;
  }
  std::set<std::string> after = list_dir(dir_.path());
  after.erase("gpt2.tiktoken");
  EXPECT_EQ(after, before);
}

// A model whose tokenizer is byte-level, as tokenizer.json and as vocab.json +
// merges.txt (trained by HuggingFace tokenizers), saved with random weights.
TEST_F(ExportHfTest, ByteLevelTokenizersLoadInTransformersAndEncodeAsDufu) {
  const std::string tokenizers = dir_.file("tokenizers");
  const CommandResult made = run_command(shell_quote(hf_python()) + " " + shell_quote(check_script()) +
                                         " make-bytelevel " + shell_quote(tokenizers));
  ASSERT_EQ(made.exit_code, 0) << made.output;

  struct Case {
    std::string name;
    TokenizerSpec spec;
    std::string tokenizer_class;
    bool use_fast;
    std::set<std::string> tokenizer_files;
  };
  const std::vector<Case> cases = {
      {"tokenizer-json",
       {.model = tokenizers + "/tokenizer.json", .merges = {}, .pattern = {}},
       "PreTrainedTokenizerFast",
       true,
       {"tokenizer.json"}},
      {"vocab-json",
       {.model = tokenizers + "/vocab.json", .merges = tokenizers + "/merges.txt", .pattern = {}},
       "GPT2Tokenizer",
       false,
       {"vocab.json", "merges.txt"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tokenizer tokenizer = Tokenizer::load(c.spec);
    trainer::GPTConfig config = dufu::testing::small_gpt_config({.n_layer = 1,
                                                                 .n_head = 2,
                                                                 .d_model = 16,
                                                                 .vocab_size = static_cast<int>(tokenizer.vocab_size()),
                                                                 .vocab_multiple = 64,
                                                                 .seq_length = 32});
    trainer::GPT model(config);
    // Weights far larger than GPT-2's initialisation, so that greedy generation does not
    // settle on one token and every tensor moves the loss.
    dufu::testing::fill_uniform(model.params(), 13, -0.3f, 0.3f);
    const trainer::ParamTensor& wte = model.tensor("wte.weight");  // its padding rows stay 0
    const std::size_t real = static_cast<std::size_t>(config.vocab_size) * static_cast<std::size_t>(config.d_model);
    std::fill(model.params().begin() + static_cast<std::ptrdiff_t>(wte.offset + real),
              model.params().begin() + static_cast<std::ptrdiff_t>(wte.offset + wte.size()), 0.0f);
    trainer::AdamW optimizer(model, trainer::AdamWOptions{});
    trainer::TrainingState state;
    state.step = 1;
    state.model = config;
    const std::string run_dir = dir_.file("run-" + c.name);
    const std::string checkpoint = trainer::save_checkpoint(run_dir, model, optimizer, state, 1);

    const std::string out = dir_.file("hf-" + c.name);
    const std::string merges = c.spec.merges.empty() ? "" : " --tokenizer-merges " + shell_quote(c.spec.merges);
    const CommandResult exported = export_hf(checkpoint, out, c.spec.model, merges);
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    std::set<std::string> files = c.tokenizer_files;
    files.insert({"config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"});
    EXPECT_EQ(list_dir(out), files);

    DufuSide side = compute_dufu_side(checkpoint, tokenizer, "The quick brown fox", 10);
    side.tokenizer_class = c.tokenizer_class;
    side.use_fast = c.use_fast;
    side.eos = tokenizer.eos_id();  // <|endoftext|>, also BOS and pad as in GPT-2
    EXPECT_EQ(tokenizer.piece(side.eos), "<|endoftext|>");
    side.bos = side.eos;
    side.pad = side.eos;
    write_all(dir_.file("expected.json"), expected_json(side, config, tokenizer));
    const CommandResult check = run_check(out, dir_.file("expected.json"));
    std::printf("%s", check.output.c_str());
    EXPECT_EQ(check.exit_code, 0) << check.output;

    // Another vocabulary than the model's is refused, as `train generate` refuses it.
    const CommandResult mismatch = export_hf(checkpoint, dir_.file("hf-mismatch"), fixture_path("fortunes.model"));
    EXPECT_EQ(mismatch.exit_code, 1);
    EXPECT_NE(mismatch.output.find("has 2000 pieces but the model"), std::string::npos) << mismatch.output;
    EXPECT_FALSE(fs::exists(dir_.file("hf-mismatch")));
  }
}

// Tensor-parallel pieces go through the same assembly as `train merge-checkpoint`.
TEST_F(ExportHfTest, ShardedCheckpointExportsTheMergedWeights) {
  const std::string run_dir = dir_.file("tp2");
  const std::string config = dir_.file("tp2.toml");
  write_all(config,
            "[model]\nn_layer = 2\nn_head = 2\nd_model = 32\nvocab_size = 2000\nseq_length = 32\n"
            "[data]\nblend = \"" +
                dufu::testing::fortunes_shard() + "\"\ncache_dir = \"" + dufu::testing::fortunes_shard_dir() +
                "/cache\"\nsplit = \"90,10,0\"\nworkers = 1\n"
                "[train]\nmicro_batch = 4\nglobal_batch = 8\nsteps = 4\nthreads = 1\n[optim]\nwarmup_steps = 1\n"
                "[eval]\ninterval = 0\n[checkpoint]\ninterval = 4\nkeep = 1\n"
                "[dist]\ntensor_parallel_size = 2\n");
  const CommandResult trained =
      run_command(std::string("timeout -k 5 300 ") + DUFU_MPIRUN + " -np 2 " + shell_quote(train_tool()) + " " +
                  shell_quote(config) + " run.dir=" + shell_quote(run_dir));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string checkpoint = dufu::testing::checkpoint_dir(run_dir, 4);
  ASSERT_FALSE(fs::exists(checkpoint + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(checkpoint + "/model-tp01.safetensors"));

  const std::string out = dir_.file("hf");
  const CommandResult exported = export_hf(checkpoint, out, fixture_path("fortunes.model"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string merged = dir_.file("merged");
  const CommandResult merge = run_command(shell_quote(train_tool()) + " merge-checkpoint " + shell_quote(checkpoint) +
                                          " " + shell_quote(merged));
  ASSERT_EQ(merge.exit_code, 0) << merge.output;
  EXPECT_TRUE(read_all(out + "/model.safetensors") == read_all(merged + "/model.safetensors"));
  EXPECT_NO_THROW(trainer::read_checkpoint_state(checkpoint));  // the pieces as they were
}

}  // namespace
