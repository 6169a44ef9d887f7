// A run keeps its data's tokenizer (run_tokenizer.h): `train` copies the file the
// shards' sidecars name into RUN/tokenizer/ and into every checkpoint, named in
// state.json; `train generate` and `train export-hf` then need no --tokenizer, even
// for a checkpoint directory copied on its own, and refuse a --tokenizer that is not
// the recorded one (naming both files). A blend of shards of two tokenizers is
// refused; a run on shards without sidecars records nothing and its checkpoints need
// the flag, which says why. The old flag spellings still work.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>

#include "dufu/trainer/checkpoint/checkpoint.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string sha256sum(const std::string& path) {
  const CommandResult result = run_command("sha256sum " + shell_quote(path));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return result.output.substr(0, 64);
}

class RunTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string lines;
    for (int i = 0; i < 300; ++i) {
      lines += "{\"text\": \"A fortune for day " + std::to_string(i) + ": the bold and the patient share it.\"}\n";
    }
    write_all(corpus(), lines);
    preprocess("corpus", model());
    // The same data without a sidecar: a shard written before dufu wrote them.
    preprocess("old", model());
    fs::remove(dir_->file("old.dufu.json"));
    train_run("run", dir_->file("corpus"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string corpus() { return dir_->file("corpus.jsonl"); }
  static std::string model() { return fixture_path("fortunes.model"); }

  static void preprocess(const std::string& name, const std::string& tokenizer) {
    const CommandResult made = run_command(shell_quote(dataprep_tool()) + " preprocess -q --append-eod -j 1 -i " +
                                           shell_quote(corpus()) + " -o " + shell_quote(dir_->file(name)) +
                                           " --tokenizer " + shell_quote(tokenizer) + " 2>&1");
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }

  // 4 steps of a tiny model, a checkpoint at the end.
  static CommandResult train_run(const std::string& name, const std::string& blend) {
    const std::string config = dir_->file(name + ".toml");
    write_all(config,
              "[model]\nn_layer = 1\nn_head = 2\nd_model = 16\nvocab_size = 2000\nseq_length = 16\n"
              "[data]\nblend = \"" +
                  blend + "\"\ncache_dir = \"" + dir_->file("cache") +
                  "\"\nsplit = \"90,10,0\"\nworkers = 1\n"
                  "[train]\nmicro_batch = 2\nglobal_batch = 2\nsteps = 4\nthreads = 1\n"
                  "[optim]\nlr = 1e-2\nwarmup_steps = 1\n[eval]\ninterval = 0\n"
                  "[checkpoint]\ninterval = 4\nkeep = 1\n[run]\nlog_interval = 4\n");
    return run_command(shell_quote(train_tool()) + " " + shell_quote(config) + " run.dir=" +
                       shell_quote(dir_->file(name)) + " 2>&1");
  }

  static CommandResult train(const std::string& arguments) {
    return run_command(shell_quote(train_tool()) + " " + arguments + " 2>&1");
  }
  static std::string generate(const std::string& checkpoint, const std::string& flags = "") {
    return "generate -c " + shell_quote(checkpoint) + " -p " + shell_quote("A fortune") + " -n 4 -t 0" + flags;
  }

  static TempDir* dir_;
};

TempDir* RunTokenizer::dir_ = nullptr;

TEST_F(RunTokenizer, TheRunAndEveryCheckpointKeepTheDataTokenizer) {
  const std::string run = dir_->file("run");
  const std::string checkpoint = checkpoint_dir(run, 4);
  ASSERT_TRUE(fs::exists(checkpoint + "/state.json"));
  EXPECT_EQ(sha256sum(run + "/tokenizer/fortunes.model"), sha256sum(model()));
  EXPECT_EQ(sha256sum(checkpoint + "/tokenizer/fortunes.model"), sha256sum(model()));
  const trainer::TrainingState state = trainer::read_checkpoint_state(checkpoint);
  ASSERT_TRUE(state.tokenizer.has_value());
  EXPECT_EQ(state.tokenizer->kind, "sentencepiece");
  EXPECT_EQ(state.tokenizer->model.file, "fortunes.model");
  EXPECT_EQ(state.tokenizer->model.path, "tokenizer/fortunes.model");
  EXPECT_EQ(state.tokenizer->model.sha256, sha256sum(model()));
  const std::string json = read_all(checkpoint + "/state.json");
  EXPECT_TRUE(contains(json, "\"tokenizer\":{\"kind\":\"sentencepiece\",\"model\":{\"file\":\"fortunes.model\","
                             "\"path\":\"tokenizer/fortunes.model\",\"sha256\":\"" + sha256sum(model()) + "\""))
      << json;
  // The weights are where and what they were: one file, beside the tokenizer.
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(checkpoint)) names.insert(entry.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.toml", "model.safetensors", "optimizer.safetensors", "state.json",
                                          "tokenizer"}));
}

TEST_F(RunTokenizer, GenerateAndExportNeedNoFlag) {
  const std::string run = dir_->file("run");
  const CommandResult generated = train(generate(run));
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_TRUE(contains(generated.output, "\nA fortune")) << generated.output;
  // The same text as with the flag, in each of its spellings.
  for (const std::string flag : {" --tokenizer ", " --model ", " -m "}) {
    EXPECT_EQ(train(generate(run, flag + shell_quote(model()))).output, generated.output) << flag;
  }
  const CommandResult exported = train("export-hf " + shell_quote(run) + " " + shell_quote(dir_->file("hf")));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(sha256sum(dir_->file("hf/tokenizer.model")), sha256sum(model()));
  const CommandResult aliased = train("export-hf " + shell_quote(run) + " " + shell_quote(dir_->file("hf-alias")) +
                                      " --tokenizer-model " + shell_quote(model()));
  EXPECT_EQ(aliased.exit_code, 0) << aliased.output;
  EXPECT_TRUE(contains(train("export-hf --help").output, "--tokenizer-pattern"));
}

TEST_F(RunTokenizer, ACheckpointCopiedAloneStillFindsItsTokenizer) {
  const std::string copy = dir_->file("copied/step_00000004");
  fs::create_directories(dir_->file("copied"));
  fs::copy(checkpoint_dir(dir_->file("run"), 4), copy, fs::copy_options::recursive);
  const CommandResult generated = train(generate(copy));
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  const std::string original = train(generate(dir_->file("run"))).output;
  EXPECT_EQ(generated.output.substr(generated.output.find("\nA fortune")), original.substr(original.find("\nA fortune")));
}

TEST_F(RunTokenizer, ATokenizerThatIsNotTheRecordedOneIsRefusedNamingBoth) {
  const std::string other = dir_->file("other.model");
  write_all(other, read_all(model()) + "x");
  const std::string checkpoint = checkpoint_dir(dir_->file("run"), 4);
  for (const std::string& command :
       {generate(checkpoint, " --tokenizer " + shell_quote(other)),
        "export-hf " + shell_quote(checkpoint) + " " + shell_quote(dir_->file("hf-other")) + " -m " +
            shell_quote(other)}) {
    const CommandResult refused = train(command);
    EXPECT_EQ(refused.exit_code, 1) << refused.output;
    EXPECT_TRUE(contains(refused.output, "'" + other + "'")) << refused.output;
    EXPECT_TRUE(contains(refused.output, "tokenizer/fortunes.model'")) << refused.output;
    EXPECT_EQ(std::count(refused.output.begin(), refused.output.end(), '\n'), 1) << refused.output;
  }
  EXPECT_FALSE(fs::exists(dir_->file("hf-other")));
}

TEST_F(RunTokenizer, ARunOnShardsWithoutSidecarsRecordsNothingAndSaysWhy) {
  const CommandResult trained = train_run("old-run", dir_->file("old"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string checkpoint = checkpoint_dir(dir_->file("old-run"), 4);
  EXPECT_FALSE(trainer::read_checkpoint_state(checkpoint).tokenizer.has_value());
  EXPECT_FALSE(fs::exists(dir_->file("old-run/tokenizer")));
  EXPECT_FALSE(fs::exists(checkpoint + "/tokenizer"));
  const CommandResult refused = train(generate(checkpoint));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "records no tokenizer")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "give --tokenizer FILE")) << refused.output;
  EXPECT_EQ(train(generate(checkpoint, " --model " + shell_quote(model()))).exit_code, 0);
}

TEST_F(RunTokenizer, ABlendOfTwoTokenizersIsRefusedNamingShardsAndFiles) {
  const std::string other = dir_->file("second.model");
  const CommandResult trained_tokenizer =
      run_command(shell_quote(dataprep_tool()) + " train-tokenizer -i " + shell_quote(corpus()) + " --output-prefix " +
                  shell_quote(dir_->file("second")) + " --vocab-size 120 --model-type bpe 2>&1");
  ASSERT_EQ(trained_tokenizer.exit_code, 0) << trained_tokenizer.output;
  preprocess("second", other);
  const CommandResult refused =
      train_run("mixed", "0.5 " + dir_->file("corpus") + " 0.5 " + dir_->file("second"));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "'" + dir_->file("corpus") + "' and '" + dir_->file("second") + "'"))
      << refused.output;
  EXPECT_TRUE(contains(refused.output, "fortunes.model")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "second.model")) << refused.output;
  EXPECT_FALSE(fs::exists(dir_->file("mixed")));
}

TEST_F(RunTokenizer, MergeCheckpointCarriesTheTokenizer) {
  const std::string merged = dir_->file("merged");
  const CommandResult result = train("merge-checkpoint " + shell_quote(dir_->file("run")) + " " + shell_quote(merged));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(sha256sum(merged + "/tokenizer/fortunes.model"), sha256sum(model()));
  EXPECT_TRUE(trainer::read_checkpoint_state(merged).tokenizer.has_value());
  EXPECT_EQ(train(generate(merged)).exit_code, 0);
}

}  // namespace
}  // namespace dufu::testing
