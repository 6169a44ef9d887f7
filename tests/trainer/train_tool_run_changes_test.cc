// Issue 44 ("never lose a run"), the train tool end to end: a vocabulary that cannot
// hold the tokenizer's ids is refused at start and a larger (padded) one trains,
// generates and exports; a resume that changes the architecture is refused naming
// the knob; raising train.steps of a finished run trains on; export-hf without a
// tokenizer (--no-tokenizer); files that are not regular (a FIFO, /dev/zero) are
// refused in one line instead of hanging the tool.
#include <sys/stat.h>

#include <string>

#include "train_tool_fixture.h"

namespace train_tool_testing {
namespace {

using dufu::testing::dataprep_tool;
using dufu::testing::fixture_path;

// A bound on every command: a tool that hangs on a FIFO fails the test instead of
// hanging ctest (timeout's 124, or 137 after the KILL).
constexpr char kBound[] = "timeout -s KILL 10 ";

class TrainRunChangesTest : public TrainToolTest {
 protected:
  CommandResult bounded_train(const std::string& arguments) {
    return run_command(kBound + shell_quote(train_tool()) + " " + arguments);
  }
  // A two-step run of `write_config(name, extra)`, its checkpoint at step 2.
  std::string trained_run(const std::string& name, const std::string& extra = "") {
    const std::string dir = run_dir(name);
    const CommandResult result = bounded_train(shell_quote(write_config(name, extra)) + " run.dir=" +
                                               shell_quote(dir) + " train.steps=2 eval.interval=0");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return dir;
  }
  std::string fifo(const std::string& name) {
    const std::string path = dir_.file(name);
    EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
    return path;
  }
};

TEST_F(TrainRunChangesTest, VocabularySmallerThanTheTokenizersIsRefusedAtStart) {
  const std::string dir = run_dir("small_vocab");
  const CommandResult result =
      bounded_train(shell_quote(write_config("small_vocab")) + " run.dir=" + shell_quote(dir) + " model.vocab_size=1000");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "model.vocab_size = 1000")) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "2000")) << result.output;
  EXPECT_FALSE(file_exists(dir + "/checkpoints")) << result.output;
}

TEST_F(TrainRunChangesTest, PaddedVocabularyTrainsGeneratesAndExports) {
  const std::string padded = run_dir("padded_vocab");
  CommandResult result = bounded_train(shell_quote(write_config("padded_vocab")) + " run.dir=" + shell_quote(padded) +
                                       " train.steps=2 eval.interval=0 model.vocab_size=2100");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  result = bounded_train("generate -c " + shell_quote(padded) + " -p 'The' -n 8 --seed 3");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const std::string exported = dir_.file("padded_export");
  result = bounded_train("export-hf " + shell_quote(padded) + " " + shell_quote(exported));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::string config = read_all(exported + "/config.json");
  std::erase(config, ' ');
  EXPECT_NE(config.find("\"vocab_size\":2100"), std::string::npos) << config;
}

TEST_F(TrainRunChangesTest, ArchitectureChangeOnResumeIsRefusedNamingTheKnob) {
  const std::string dir = run_dir("arch_change");
  const std::string config = write_config("arch_change");
  CommandResult result =
      bounded_train(shell_quote(config) + " run.dir=" + shell_quote(dir) + " train.exit_at_step=2 eval.interval=0");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  result = bounded_train(shell_quote(config) + " run.dir=" + shell_quote(dir) + " eval.interval=0 model.n_head=4");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "model.n_head = 2")) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "4")) << result.output;
  EXPECT_FALSE(file_exists(checkpoint_dir(dir, 4))) << result.output;
}

// Ten documents: 8 steps of 8 samples take the dataset's 3 epochs (66 samples) to the
// end, where the loader wraps; 12 steps build it with 5 epochs, as Megatron sizes its
// dataset for train_iters.
TEST_F(TrainRunChangesTest, RaisingTrainStepsOfAFinishedRunTrainsOn) {
  std::istringstream corpus(read_all(fixture_path("fortunes.jsonl")));
  std::string documents, line;
  for (int i = 0; i < 10 && std::getline(corpus, line); ++i) documents += line + "\n";
  write_all(dir_.file("ten.jsonl"), documents);
  const std::string prefix = dir_.file("ten");
  const CommandResult made = run_command(kBound + shell_quote(dataprep_tool()) + " preprocess -q --append-eod -i " +
                                         shell_quote(dir_.file("ten.jsonl")) + " -m " +
                                         shell_quote(fixture_path("fortunes.model")) + " -o " + shell_quote(prefix));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string dir = run_dir("extend");
  const std::string run = shell_quote(write_config("extend")) + " run.dir=" + shell_quote(dir) +
                          " eval.interval=0 data.blend=" + shell_quote(prefix) + " data.cache_dir=" +
                          shell_quote(dir_.file("ten_cache"));
  CommandResult result = bounded_train(run);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_TRUE(file_exists(checkpoint_dir(dir, 8))) << result.output;
  result = bounded_train(run + " train.steps=12");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(file_exists(checkpoint_dir(dir, 12))) << result.output;
}

// Shards without a sidecar: the run, and so its checkpoints, record no tokenizer.
TEST_F(TrainRunChangesTest, ExportWithoutARecordedTokenizerNeedsNoTokenizerFlag) {
  const std::string bare = dir_.file("bare");
  for (const char* ext : {".bin", ".idx"}) {
    write_all(bare + ext, read_all(fortunes_shard() + ext));
  }
  const std::string dir = run_dir("no_tokenizer");
  CommandResult result = bounded_train(shell_quote(write_config("no_tokenizer")) + " run.dir=" + shell_quote(dir) +
                                       " train.steps=2 eval.interval=0 data.blend=" + shell_quote(bare));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string exported = dir_.file("no_tokenizer_export");
  result = bounded_train("export-hf " + shell_quote(dir) + " " + shell_quote(exported));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "--no-tokenizer")) << result.output;
  EXPECT_FALSE(file_exists(exported));
  result = bounded_train("export-hf --no-tokenizer " + shell_quote(dir) + " " + shell_quote(exported));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(file_exists(exported + "/config.json"));
  EXPECT_TRUE(file_exists(exported + "/model.safetensors"));
  EXPECT_FALSE(file_exists(exported + "/tokenizer.model"));
}

TEST_F(TrainRunChangesTest, TokenizerThatIsNotARegularFileIsRefusedNotWaitedOn) {
  const std::string dir = trained_run("fifo_tokenizer");
  const std::string pipe = fifo("tokenizer.pipe");
  for (const std::string& tokenizer : {pipe, std::string("/dev/zero")}) {
    CommandResult result =
        bounded_train("generate -c " + shell_quote(dir) + " -p 'The' -n 2 --tokenizer " + shell_quote(tokenizer));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_TRUE(is_one_line(result.output, "not a regular file")) << result.output;
    const std::string exported = dir_.file("fifo_export");
    result = bounded_train("export-hf " + shell_quote(dir) + " " + shell_quote(exported) + " --tokenizer " +
                           shell_quote(tokenizer));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_TRUE(is_one_line(result.output, "not a regular file")) << result.output;
  }
}

TEST_F(TrainRunChangesTest, HfConfigThatIsAFifoIsRefusedNotWaitedOn) {
  const std::string hf_dir = dir_.file("hf");
  fs::create_directories(hf_dir);
  ASSERT_EQ(::mkfifo((hf_dir + "/config.json").c_str(), 0600), 0);
  const CommandResult result = bounded_train("import-hf " + shell_quote(hf_dir) + " " + shell_quote(dir_.file("imported")));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "not a regular file")) << result.output;
}

// The sidecar names the tokenizer the shard was made with; that path is now a FIFO.
TEST_F(TrainRunChangesTest, SidecarTokenizerThatIsAFifoIsRefusedNotWaitedOn) {
  const std::string model = dir_.file("fortunes.model");
  write_all(model, read_all(fixture_path("fortunes.model")));
  const std::string prefix = dir_.file("piped");
  const CommandResult made =
      run_command(kBound + shell_quote(dataprep_tool()) + " preprocess -q --append-eod -i " +
                  shell_quote(fixture_path("fortunes.jsonl")) + " -m " + shell_quote(model) + " -o " + shell_quote(prefix));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  fs::remove(model);
  ASSERT_EQ(::mkfifo(model.c_str(), 0600), 0);
  const CommandResult result = bounded_train(shell_quote(write_config("piped")) + " run.dir=" +
                                             shell_quote(run_dir("piped")) + " data.blend=" + shell_quote(prefix));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "not a regular file")) << result.output;
}

}  // namespace
}  // namespace train_tool_testing
