// `train plot` and `train generate` end to end, as a user runs them: a loss plot from
// a hand-written metrics.jsonl is a complete PNG put in place atomically, and bad
// input (missing or malformed metrics, no gnuplot, gnuplot failing) fails naming the
// problem; text generated from a checkpoint this test writes is the prompt followed by
// what trainer::generate gives, the same for the same seed, with clear errors for a
// missing checkpoint and a tokenizer larger than the model's vocabulary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "dufu/dataprep/tokenizer.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/run/generate.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

namespace fs = std::filesystem;
using dufu::testing::CommandResult;
using dufu::testing::file_exists;
using dufu::testing::fixture_path;
using dufu::testing::read_all;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\"\ndoes not contain\n\"" << part << "\"";
}

CommandResult train(const std::string& arguments) { return run_command(shell_quote(train_tool()) + " " + arguments); }

// stdout alone (stderr dropped), for output compared byte for byte.
CommandResult train_stdout(const std::string& arguments) {
  return run_command("{ " + shell_quote(train_tool()) + " " + arguments + " 2>/dev/null; }");
}

bool have_gnuplot() { return run_command("command -v gnuplot").exit_code == 0; }

#define REQUIRE_GNUPLOT()                                                \
  if (!have_gnuplot())                                                   \
  GTEST_SKIP() << "gnuplot is not installed (scripts/setup.sh installs " \
                  "gnuplot-nox)"

std::uint32_t big_endian32(const std::string& bytes, std::size_t at) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) value = value << 8 | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

// A PNG that gnuplot finished: signature, IHDR first with a sane size, IEND last.
::testing::AssertionResult IsCompletePng(const std::string& path) {
  if (!file_exists(path)) return ::testing::AssertionFailure() << path << " does not exist";
  const std::string bytes = read_all(path);
  if (bytes.size() < 8 + 25 + 12) return ::testing::AssertionFailure() << path << " has " << bytes.size() << " bytes";
  if (bytes.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) != 0) {
    return ::testing::AssertionFailure() << path << " lacks the PNG signature";
  }
  if (bytes.compare(12, 4, "IHDR") != 0) return ::testing::AssertionFailure() << path << ": no IHDR chunk first";
  const std::uint32_t width = big_endian32(bytes, 16);
  const std::uint32_t height = big_endian32(bytes, 20);
  if (width < 200 || height < 200) {
    return ::testing::AssertionFailure() << path << " is " << width << " x " << height;
  }
  if (bytes.compare(bytes.size() - 8, 4, "IEND") != 0) {
    return ::testing::AssertionFailure() << path << " does not end with IEND (truncated?)";
  }
  return ::testing::AssertionSuccess();
}

// Records as the training loop writes them, with a non-finite loss (null) at step 3
// and two evaluations.
const char kMetrics[] =
    "{\"type\":\"train\",\"step\":1,\"loss\":7.61,\"lr\":0.0003,\"grad_norm\":1.2,\"tokens_per_second\":12345.0,"
    "\"ms_per_step\":123.4,\"mfu\":0.45,\"consumed_samples\":8,\"consumed_tokens\":256,\"skipped\":false}\n"
    "{\"type\":\"train\",\"step\":2,\"loss\":7.02,\"lr\":0.0003,\"grad_norm\":1.1,\"tokens_per_second\":12345.0,"
    "\"ms_per_step\":123.4,\"mfu\":0.45,\"consumed_samples\":16,\"consumed_tokens\":512,\"skipped\":false}\n"
    "{\"type\":\"train\",\"step\":3,\"loss\":null,\"lr\":0.0003,\"grad_norm\":null,\"tokens_per_second\":12345.0,"
    "\"ms_per_step\":123.4,\"mfu\":0.45,\"consumed_samples\":24,\"consumed_tokens\":768,\"skipped\":true}\n"
    "{\"type\":\"train\",\"step\":4,\"loss\":6.5,\"lr\":0.0003,\"grad_norm\":0.9,\"tokens_per_second\":12345.0,"
    "\"ms_per_step\":123.4,\"mfu\":0.45,\"consumed_samples\":32,\"consumed_tokens\":1024,\"skipped\":false}\n"
    "{\"type\":\"eval\",\"step\":4,\"val_loss\":6.7,\"val_perplexity\":812.4}\n"
    "{\"type\":\"train\",\"step\":5,\"loss\":6.1,\"lr\":0.0003,\"grad_norm\":0.8,\"tokens_per_second\":12345.0,"
    "\"ms_per_step\":123.4,\"mfu\":0.45,\"consumed_samples\":40,\"consumed_tokens\":1280,\"skipped\":false}\n"
    "{\"type\":\"train\",\"step\":6,\"loss\":5.9,\"lr\":0.0003,\"grad_norm\":0.8,\"tokens_per_second\":12345.0,"
    "\"ms_per_step\":123.4,\"mfu\":0.45,\"consumed_samples\":48,\"consumed_tokens\":1536,\"skipped\":false}\n"
    "{\"type\":\"eval\",\"step\":6,\"val_loss\":6.2,\"val_perplexity\":492.7}\n";

TEST(TrainPlot, WritesTheLossPngIntoTheRunDirectory) {
  REQUIRE_GNUPLOT();
  TempDir run;
  write_all(run.file("metrics.jsonl"), kMetrics);
  const CommandResult result = train("plot " + shell_quote(run.path()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output, "5 train points, 2 validation points"));
  EXPECT_TRUE(IsCompletePng(run.file("loss.png")));
  // Nothing else left behind: the temporary PNG was renamed into place.
  EXPECT_EQ(run.list(), (std::set<std::string>{"metrics.jsonl", "loss.png"}));
}

TEST(TrainPlot, MetricsFileOutputAndTitle) {
  REQUIRE_GNUPLOT();
  TempDir dir;
  fs::create_directories(dir.file("plots"));
  // Train records only, and a title that needs quoting.
  std::string train_only;
  for (int step = 1; step <= 50; ++step) {
    train_only += "{\"type\":\"train\",\"step\":" + std::to_string(step) +
                  ",\"loss\":" + std::to_string(8.0 / (1.0 + 0.05 * step)) + "}\n";
  }
  write_all(dir.file("my metrics.jsonl"), train_only + "\n");  // a trailing blank line is fine
  const CommandResult result =
      train("plot " + shell_quote(dir.file("my metrics.jsonl")) + " -o " +
            shell_quote(dir.file("plots/it's_loss.png")) + " --title " + shell_quote("run 'a' \"b\" 50% \\n_x"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output, "50 train points, 0 validation points"));
  EXPECT_TRUE(IsCompletePng(dir.file("plots/it's_loss.png")));
  EXPECT_FALSE(file_exists(dir.file("loss.png")));

  // Plotting again replaces the file.
  const CommandResult again = train("plot " + shell_quote(dir.file("my metrics.jsonl")) + " -o " +
                                    shell_quote(dir.file("plots/it's_loss.png")));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(IsCompletePng(dir.file("plots/it's_loss.png")));
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.file("plots"))) ++files;
  EXPECT_EQ(files, 1u);
}

TEST(TrainPlot, MissingMetricsIsAnError) {
  TempDir run;
  CommandResult result = train("plot " + shell_quote(run.path()));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, run.file("metrics.jsonl")));
  EXPECT_TRUE(Contains(result.output, "does not exist"));
  result = train("plot " + shell_quote(run.file("nope.jsonl")));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "nope.jsonl' does not exist"));
  EXPECT_TRUE(run.list().empty());
}

TEST(TrainPlot, MalformedLinesNameFileAndLine) {
  TempDir run;
  const std::string metrics = run.file("metrics.jsonl");
  const std::string good = "{\"type\":\"train\",\"step\":1,\"loss\":2.5}\n";
  const struct {
    std::string third_line;
    std::string message;
  } cases[] = {
      {"{\"type\":\"train\",\"step\":3,\"loss\":", "not valid JSON"},  // cut short by a kill
      {"[1, 2]", "not a JSON object"},
      {"{\"step\":3,\"loss\":1.0}", "no \"type\""},
      {"{\"type\":\"train\",\"loss\":1.0}", "\"step\""},
      {"{\"type\":\"train\",\"step\":3}", "no \"loss\""},
      {"{\"type\":\"train\",\"step\":3,\"loss\":\"low\"}", "\"loss\" is \"low\""},
      {"{\"type\":\"eval\",\"step\":3,\"val_loss\":[1]}", "\"val_loss\" is [1]"},
  };
  for (const auto& c : cases) {
    write_all(metrics, good + good + c.third_line + "\n" + good);
    const CommandResult result = train("plot " + shell_quote(run.path()));
    EXPECT_EQ(result.exit_code, 1) << c.third_line;
    EXPECT_TRUE(Contains(result.output, metrics + ":3: ")) << c.third_line;
    EXPECT_TRUE(Contains(result.output, c.message)) << c.third_line;
    EXPECT_FALSE(file_exists(run.file("loss.png")));
  }
}

TEST(TrainPlot, NoTrainRecordsIsAnError) {
  TempDir run;
  write_all(run.file("metrics.jsonl"), "{\"type\":\"eval\",\"step\":4,\"val_loss\":6.7,\"val_perplexity\":812.4}\n");
  CommandResult result = train("plot " + shell_quote(run.path()));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "has no train records"));
  write_all(run.file("metrics.jsonl"), "");
  result = train("plot " + shell_quote(run.path()));
  EXPECT_TRUE(Contains(result.output, "has no train records"));
  write_all(run.file("metrics.jsonl"), "{\"type\":\"train\",\"step\":1,\"loss\":null}\n");
  result = train("plot " + shell_quote(run.path()));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "every train loss is null"));
}

TEST(TrainPlot, WithoutGnuplotSaysWhatToInstall) {
  TempDir run;
  write_all(run.file("metrics.jsonl"), kMetrics);
  fs::create_directories(run.file("empty_path"));
  const CommandResult result = run_command("PATH=" + shell_quote(run.file("empty_path")) + " " +
                                           shell_quote(train_tool()) + " plot " + shell_quote(run.path()));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "gnuplot is not installed"));
  EXPECT_TRUE(Contains(result.output, "install gnuplot-nox"));
  EXPECT_FALSE(file_exists(run.file("loss.png")));
}

TEST(TrainPlot, GnuplotFailingShowsItsMessages) {
  TempDir run;
  write_all(run.file("metrics.jsonl"), kMetrics);
  fs::create_directories(run.file("bin"));
  // A stand-in gnuplot that starts writing the output and then fails.
  write_all(run.file("bin/gnuplot"),
            "#!/bin/sh\n"
            "out=$(sed -n \"s/^set output '\\(.*\\)'$/\\1/p\" \"$1\")\n"
            "printf 'half a png' > \"$out\"\n"
            "echo \"\\\"$1\\\" line 12: all points y value undefined!\" >&2\n"
            "exit 1\n");
  ::chmod(run.file("bin/gnuplot").c_str(), 0755);
  const CommandResult result = run_command("PATH=" + shell_quote(run.file("bin")) + ":\"$PATH\" " +
                                           shell_quote(train_tool()) + " plot " + shell_quote(run.path()));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "gnuplot failed (exit status 1)"));
  EXPECT_TRUE(Contains(result.output, "line 12: all points y value undefined!"));
  // Neither the final PNG nor the temporary is left.
  EXPECT_EQ(run.list(), (std::set<std::string>{"metrics.jsonl", "bin"}));
}

TEST(TrainPlot, ReadOnlyOutputDirectoryIsOneLineNamingIt) {
  TempDir run;
  write_all(run.file("metrics.jsonl"), kMetrics);
  const std::string read_only = run.file("read-only");
  fs::create_directories(read_only);
  ::chmod(read_only.c_str(), 0555);
  // Root writes regardless of permissions: drop that capability when running as root.
  const std::string as_user = ::geteuid() == 0 ? "setpriv --bounding-set=-dac_override,-dac_read_search " : "";
  if (!as_user.empty() && run_command(as_user + "true").exit_code != 0) {
    GTEST_SKIP() << "setpriv cannot drop CAP_DAC_OVERRIDE";
  }
  const CommandResult result = run_command(as_user + shell_quote(train_tool()) + " plot " + shell_quote(run.path()) +
                                           " --output " + shell_quote(read_only + "/loss.png"));
  ::chmod(read_only.c_str(), 0755);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.output,
            "train: error: cannot write in the output directory '" + read_only + "': Permission denied\n");
  EXPECT_TRUE(fs::is_empty(read_only));
}

// A run directory holding one checkpoint of a small random GPT whose vocabulary is
// the fixture tokenizer's (2000 pieces).
class TrainGenerate : public ::testing::Test {
 protected:
  static dufu::trainer::GPTConfig config(int vocab_size) {
    return dufu::testing::small_gpt_config(
        {.n_layer = 1, .n_head = 2, .d_model = 16, .vocab_size = vocab_size, .vocab_multiple = 64, .seq_length = 16});
  }

  static std::string write_checkpoint(const std::string& run_dir, int vocab_size) {
    dufu::trainer::GPT model(config(vocab_size));
    model.init_gpt2(77);
    dufu::trainer::AdamW optimizer(model, {});
    dufu::trainer::TrainingState state;
    state.step = 6;
    state.init_seed = 77;
    state.model = model.config();
    state.config_toml = "# written by train_tool_output_test\n";
    return dufu::trainer::save_checkpoint(run_dir, model, optimizer, state, 1);
  }

  void SetUp() override { checkpoint_ = write_checkpoint(run_.path(), 2000); }

  std::string generate_args(const std::string& prompt, const std::string& extra) const {
    return "generate --checkpoint " + shell_quote(run_.path()) + " --model " +
           shell_quote(fixture_path("fortunes.model")) + " --prompt " + shell_quote(prompt) + " " + extra;
  }

  TempDir run_;
  std::string checkpoint_;
};

TEST_F(TrainGenerate, PrintsThePromptAndTheSameTextForTheSameSeed) {
  const std::string args = generate_args("The fortune of the day", "--max-tokens 20 --seed 3");
  const CommandResult first = train_stdout(args);
  ASSERT_EQ(first.exit_code, 0) << train(args).output;
  EXPECT_EQ(first.output.rfind("The fortune of the day", 0), 0u) << first.output;
  EXPECT_GT(first.output.size(), std::string("The fortune of the day\n").size() + 10) << first.output;
  EXPECT_EQ(train_stdout(args).output, first.output);
  // A checkpoint directory named directly is the same as its run directory.
  const CommandResult direct = train_stdout("generate --checkpoint " + shell_quote(checkpoint_) + " --model " +
                                            shell_quote(fixture_path("fortunes.model")) +
                                            " --prompt 'The fortune of the day' --max-tokens 20 --seed 3");
  EXPECT_EQ(direct.output, first.output);
  const CommandResult other = train_stdout(generate_args("The fortune of the day", "--max-tokens 20 --seed 4"));
  ASSERT_EQ(other.exit_code, 0);
  EXPECT_NE(other.output, first.output);

  // stderr says what was loaded.
  const CommandResult with_log = train(args);
  EXPECT_TRUE(Contains(with_log.output, "step 6"));
  EXPECT_TRUE(Contains(with_log.output, checkpoint_));
}

TEST_F(TrainGenerate, OutputIsThePromptFollowedByTheLibrarysContinuation) {
  // Greedy, so the tool and this test draw the same tokens.
  const std::string prompt = "A penny saved is";
  const CommandResult result = train_stdout(generate_args(prompt, "--max-tokens 12 --temperature 0"));
  ASSERT_EQ(result.exit_code, 0) << train(generate_args(prompt, "--max-tokens 12 --temperature 0")).output;

  const auto tokenizer = dufu::dataprep::Tokenizer::load(fixture_path("fortunes.model"));
  dufu::trainer::GPT model(config(2000));
  dufu::trainer::load_checkpoint(checkpoint_, model, nullptr);
  std::vector<int> encoded;
  tokenizer.encode(prompt, &encoded);
  const std::vector<std::int32_t> ids(encoded.begin(), encoded.end());
  dufu::trainer::SamplingOptions options;
  options.max_new_tokens = 12;
  options.temperature = 0.0f;
  options.stop_token = tokenizer.eos_id();
  std::vector<std::int32_t> generated = dufu::trainer::generate(model, ids, options);
  const bool stopped = !generated.empty() && generated.back() == tokenizer.eos_id();
  if (stopped) generated.pop_back();
  std::vector<std::int32_t> all = ids;
  all.insert(all.end(), generated.begin(), generated.end());
  const std::string head = tokenizer.decode(ids);
  const std::string whole = tokenizer.decode(all);
  ASSERT_EQ(whole.rfind(head, 0), 0u);
  EXPECT_EQ(result.output, prompt + whole.substr(head.size()) + "\n" + (stopped ? "[end of document]\n" : ""));
}

TEST_F(TrainGenerate, SeveralSamplesUseConsecutiveSeeds) {
  const CommandResult three = train_stdout(generate_args("Never", "--max-tokens 10 --seed 5 --samples 3"));
  ASSERT_EQ(three.exit_code, 0) << three.output;
  EXPECT_TRUE(Contains(three.output, "--- sample 1 of 3 (seed 5) ---\nNever"));
  EXPECT_TRUE(Contains(three.output, "--- sample 3 of 3 (seed 7) ---\nNever"));
  // The second sample is what --seed 6 gives alone.
  const CommandResult alone = train_stdout(generate_args("Never", "--max-tokens 10 --seed 6"));
  ASSERT_EQ(alone.exit_code, 0);
  EXPECT_TRUE(Contains(three.output, "--- sample 2 of 3 (seed 6) ---\n" + alone.output + "\n--- sample 3"));
}

TEST_F(TrainGenerate, PromptLongerThanTheContextWorks) {
  std::string prompt;
  for (int i = 0; i < 10; ++i) prompt += "The quick brown fox jumps over the lazy dog. ";
  const CommandResult result = train_stdout(generate_args(prompt, "--max-tokens 30 --seed 1"));
  ASSERT_EQ(result.exit_code, 0) << train(generate_args(prompt, "--max-tokens 30 --seed 1")).output;
  EXPECT_EQ(result.output.rfind(prompt, 0), 0u);
}

TEST_F(TrainGenerate, MissingCheckpointIsAnError) {
  const std::string model = shell_quote(fixture_path("fortunes.model"));
  CommandResult result =
      train("generate --checkpoint " + shell_quote(run_.file("nowhere")) + " --model " + model + " --prompt x");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, run_.file("nowhere") + "' does not exist"));

  TempDir empty_run;
  result = train("generate --checkpoint " + shell_quote(empty_run.path()) + " --model " + model + " --prompt x");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "no checkpoint in '" + empty_run.path() + "'"));

  result = train("generate --checkpoint " + shell_quote(run_.path()) + " --model " + model);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_TRUE(Contains(result.output, "--prompt"));
}

// The model's token ids are the tokenizer's pieces: a smaller vocabulary cannot hold
// them, refused with both sizes; a larger one is padding (as Megatron pads), whose
// ids are never drawn.
TEST_F(TrainGenerate, TokenizerWithMorePiecesThanTheModelIsAnError) {
  TempDir small_run;
  write_checkpoint(small_run.path(), 1000);
  CommandResult result = train("generate --checkpoint " + shell_quote(small_run.path()) + " --model " +
                               shell_quote(fixture_path("fortunes.model")) + " --prompt hello");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(Contains(result.output, "train: error: the tokenizer '" + fixture_path("fortunes.model") +
                                          "' has 2000 pieces but the model in '"))
      << result.output;
  EXPECT_TRUE(Contains(result.output, "has vocab_size 1000, too few for its ids; HINT: ")) << result.output;

  TempDir padded_run;
  write_checkpoint(padded_run.path(), 3000);
  result = train("generate --checkpoint " + shell_quote(padded_run.path()) + " --model " +
                 shell_quote(fixture_path("fortunes.model")) + " --prompt hello --max-tokens 8");
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

TEST_F(TrainGenerate, BadSamplingOptionsAreErrors) {
  CommandResult result = train(generate_args("hello", "--temperature -1"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "temperature"));
  result = train(generate_args("hello", "--top-k -2"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "top_k"));
  result = train(generate_args("hello", "--samples 0"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.output, "--samples"));
}

TEST_F(TrainGenerate, SeedOutsideUnsigned64BitsIsRefused) {
  for (const std::string seed : {"-1", "18446744073709551616", "1e23", "0x10"}) {
    const CommandResult result = train(generate_args("hello", "--seed " + seed));
    EXPECT_EQ(result.exit_code, 1) << seed << ": " << result.output;
    EXPECT_EQ(result.output.rfind("train: error: --seed: ", 0), 0u) << seed << ": " << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << seed << ": " << result.output;
  }
  const CommandResult largest = train(generate_args("hello", "--seed 18446744073709551615 --max-tokens 2"));
  EXPECT_EQ(largest.exit_code, 0) << largest.output;
}

}  // namespace
