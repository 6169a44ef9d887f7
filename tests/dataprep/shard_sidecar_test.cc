// Shards remember their tokenizer: `dataprep preprocess` (undivided and --shard parts)
// and `dataprep merge` write PREFIX.dufu.json beside the pair (shard_sidecar.h), whose
// SHA-256 is the file's (checked against sha256sum); `inspect` and `sample` decode
// with the recorded tokenizer when no --tokenizer is given and refuse one that is not
// the recorded one, naming both files; a shard without a sidecar (written before
// dufu wrote them) still decodes with the flag, and without it prints ids and says
// why. Every old spelling of the flag (--tokenizer-model, --model, -m) still works.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>

#include "dufu/dataprep/shard_sidecar.h"
#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

namespace fs = std::filesystem;

std::string sha256sum(const std::string& path) {
  const CommandResult result = run_command("sha256sum " + shell_quote(path));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return result.output.substr(0, 64);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class ShardSidecar : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string lines;
    for (int i = 0; i < 40; ++i) {
      lines += "{\"text\": \"Fortune number " + std::to_string(i) + " favours the bold and the patient.\"}\n";
    }
    write_all(corpus(), lines);
  }

  std::string corpus() const { return dir_.file("corpus.jsonl"); }
  static std::string model() { return fixture_path("fortunes.model"); }

  CommandResult dataprep(const std::string& arguments) const {
    return run_command(shell_quote(dataprep_tool()) + " " + arguments + " 2>&1");
  }
  std::string output(const std::string& arguments) const { return dataprep(arguments).output; }
  // preprocess of the corpus into `name`, the tokenizer given by `flag`.
  CommandResult preprocess(const std::string& name, const std::string& flag = "--tokenizer",
                           const std::string& tokenizer = model(), const std::string& extra = "") const {
    return dataprep("preprocess -q --append-eod -j 1 -i " + shell_quote(corpus()) + " -o " +
                    shell_quote(dir_.file(name)) + " " + flag + " " + shell_quote(tokenizer) + extra);
  }
  // A second tokenizer, trained on the corpus.
  std::string other_model() const {
    const std::string prefix = dir_.file("other");
    if (!fs::exists(prefix + ".model")) {
      const CommandResult trained = dataprep("train-tokenizer -i " + shell_quote(corpus()) + " -o " +
                                             shell_quote(prefix) + " --vocab-size 120 --model-type bpe");
      EXPECT_EQ(trained.exit_code, 0) << trained.output;
    }
    return prefix + ".model";
  }

  TempDir dir_;
};

TEST_F(ShardSidecar, PreprocessRecordsTheTokenizerWithItsSha256) {
  const CommandResult made = preprocess("corpus");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string prefix = dir_.file("corpus");
  ASSERT_TRUE(fs::exists(prefix + ".dufu.json"));
  const auto sidecar = dataprep::read_shard_sidecar(prefix);
  ASSERT_TRUE(sidecar.has_value());
  EXPECT_EQ(sidecar->tokenizer.kind, "sentencepiece");
  EXPECT_EQ(sidecar->tokenizer.model.file, "fortunes.model");
  EXPECT_EQ(sidecar->tokenizer.model.path, fs::absolute(model()).lexically_normal().string());
  EXPECT_EQ(sidecar->tokenizer.model.sha256, sha256sum(model()));
  EXPECT_EQ(sidecar->tokenizer.model.bytes, fs::file_size(model()));
  EXPECT_FALSE(sidecar->tokenizer.merges.has_value());
  EXPECT_EQ(sidecar->tokenizer.pattern, "");
  EXPECT_EQ(sidecar->dtype, dataprep::DType::kUInt16);
  EXPECT_EQ(sidecar->eod_id, 2);  // sentencepiece's </s>
  EXPECT_EQ(sidecar->append_eod, true);
  EXPECT_EQ(sidecar->json_key, "text");
  EXPECT_EQ(sidecar->json_keys, std::vector<std::string>{"text"});
  EXPECT_EQ(sidecar->bin_bytes, fs::file_size(prefix + ".bin"));
  EXPECT_EQ(sidecar->idx_bytes, fs::file_size(prefix + ".idx"));
  // The file itself, as other programs read it.
  const std::string text = read_all(prefix + ".dufu.json");
  EXPECT_TRUE(contains(text, "\"format\":\"dufu shard sidecar\",\"version\":1")) << text;
  EXPECT_TRUE(contains(text, "\"sha256\":\"" + sha256sum(model()) + "\"")) << text;
  // Nothing else appears beside the pair (no temporary left).
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_.path())) names.insert(entry.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"corpus.jsonl", "corpus.bin", "corpus.idx", "corpus.dufu.json"}));
}

TEST_F(ShardSidecar, EveryOldSpellingOfTheFlagIsAccepted) {
  for (const std::string flag : {"--tokenizer-model", "--model", "-m"}) {
    const CommandResult made = preprocess("alias", flag);
    ASSERT_EQ(made.exit_code, 0) << flag << ": " << made.output;
    const std::string shown = output("inspect " + shell_quote(dir_.file("alias")) + " --show 0 " + flag + " " +
                                       shell_quote(model()));
    EXPECT_TRUE(contains(shown, "Fortune number 0 favours")) << flag << ": " << shown;
  }
  const CommandResult help = dataprep("inspect --help");
  EXPECT_TRUE(contains(help.output, "--tokenizer")) << help.output;
  EXPECT_TRUE(contains(help.output, "--tokenizer-pattern")) << help.output;
}

TEST_F(ShardSidecar, InspectAndSampleFindTheTokenizerThemselves) {
  ASSERT_EQ(preprocess("corpus").exit_code, 0);
  const std::string prefix = dir_.file("corpus");
  const std::string shown = output("inspect " + shell_quote(prefix) + " --show 3");
  EXPECT_TRUE(contains(shown, "Fortune number 3 favours the bold")) << shown;
  EXPECT_TRUE(contains(shown, "tokenizer:  sentencepiece '" + fs::absolute(model()).lexically_normal().string()))
      << shown;
  EXPECT_EQ(shown, output("inspect " + shell_quote(prefix) + " --show 3 --tokenizer " + shell_quote(model())));
  const std::string sampled = output("sample --data-path " + shell_quote(prefix) +
                                       " --seq-length 8 --count 1 --cache-dir " + shell_quote(dir_.file("cache")));
  EXPECT_TRUE(contains(sampled, "--- sample 0")) << sampled;
  EXPECT_FALSE(contains(sampled, "printing ids only")) << sampled;
}

TEST_F(ShardSidecar, ATokenizerThatIsNotTheRecordedOneIsRefusedNamingBoth) {
  ASSERT_EQ(preprocess("corpus").exit_code, 0);
  const std::string other = other_model();
  const CommandResult refused =
      run_command("(" + shell_quote(dataprep_tool()) + " inspect " + shell_quote(dir_.file("corpus")) +
                  " --show 0 --tokenizer " + shell_quote(other) + " >/dev/null)");  // stderr only
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "'" + other + "'")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "'" + fs::absolute(model()).lexically_normal().string() + "'"))
      << refused.output;
  EXPECT_TRUE(contains(refused.output, "is not the one")) << refused.output;
  const auto lines = std::count(refused.output.begin(), refused.output.end(), '\n');
  EXPECT_EQ(lines, 1) << refused.output;
}

TEST_F(ShardSidecar, InspectRefusesAWrongTokenizerEvenWithoutShowingDocuments) {
  ASSERT_EQ(preprocess("corpus").exit_code, 0);
  const std::string other = other_model();
  const CommandResult refused =
      run_command("(" + shell_quote(dataprep_tool()) + " inspect " + shell_quote(dir_.file("corpus")) +
                  " --tokenizer " + shell_quote(other) + " >/dev/null)");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "'" + other + "'")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "is not the one")) << refused.output;
  EXPECT_EQ(run_command(shell_quote(dataprep_tool()) + " inspect " + shell_quote(dir_.file("corpus")) +
                        " --tokenizer " + shell_quote(model()) + " >/dev/null").exit_code,
            0);
}

TEST_F(ShardSidecar, AShardWithoutASidecarNeedsTheFlagAndSaysWhy) {
  ASSERT_EQ(preprocess("corpus").exit_code, 0);
  const std::string prefix = dir_.file("corpus");
  fs::remove(prefix + ".dufu.json");
  const CommandResult ids = run_command(shell_quote(dataprep_tool()) + " inspect " + shell_quote(prefix) + " --show 0");
  EXPECT_EQ(ids.exit_code, 0) << ids.output;
  EXPECT_FALSE(contains(ids.output, "Fortune number 0")) << ids.output;
  EXPECT_TRUE(contains(ids.output, "tokenizer:  not recorded")) << ids.output;
  EXPECT_TRUE(contains(ids.output, "records no tokenizer")) << ids.output;
  EXPECT_TRUE(contains(ids.output, "give --tokenizer FILE to decode them")) << ids.output;
  const std::string decoded = output("inspect " + shell_quote(prefix) + " --show 0 -m " + shell_quote(model()));
  EXPECT_TRUE(contains(decoded, "Fortune number 0 favours")) << decoded;
  // A recorded tokenizer that moved away is named, with what to do.
  ASSERT_EQ(preprocess("moved", "--tokenizer", model()).exit_code, 0);
  fs::copy_file(model(), dir_.file("copy.model"));
  ASSERT_EQ(preprocess("moved", "--tokenizer", dir_.file("copy.model")).exit_code, 0);
  fs::remove(dir_.file("copy.model"));
  const std::string missing = output("inspect " + shell_quote(dir_.file("moved")) + " --show 0");
  EXPECT_TRUE(contains(missing, "'" + dir_.file("copy.model") + "' that ")) << missing;
  EXPECT_TRUE(contains(missing, "is missing; HINT: give --tokenizer")) << missing;
}

TEST_F(ShardSidecar, MergeKeepsTheSidecarAndRefusesMixedTokenizers) {
  ASSERT_EQ(preprocess("a").exit_code, 0);
  ASSERT_EQ(preprocess("b").exit_code, 0);
  const CommandResult merged = dataprep("merge " + shell_quote(dir_.file("a")) + " " + shell_quote(dir_.file("b")) +
                                        " -o " + shell_quote(dir_.file("ab")));
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  const auto sidecar = dataprep::read_shard_sidecar(dir_.file("ab"));
  ASSERT_TRUE(sidecar.has_value());
  EXPECT_EQ(sidecar->tokenizer, dataprep::read_shard_sidecar(dir_.file("a"))->tokenizer);
  EXPECT_EQ(sidecar->bin_bytes, fs::file_size(dir_.file("ab.bin")));

  ASSERT_EQ(preprocess("c", "--tokenizer", other_model()).exit_code, 0);
  const CommandResult refused = run_command(shell_quote(dataprep_tool()) + " merge " + shell_quote(dir_.file("a")) +
                                            " " + shell_quote(dir_.file("c")) + " -o " + shell_quote(dir_.file("ac")));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "different tokenizers")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "fortunes.model")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "other.model")) << refused.output;
  EXPECT_FALSE(fs::exists(dir_.file("ac.bin")));
  EXPECT_FALSE(fs::exists(dir_.file("ac.dufu.json")));

  const CommandResult sample =
      run_command(shell_quote(dataprep_tool()) + " sample --seq-length 8 --count 1 --data-path " +
                  shell_quote("0.5 " + dir_.file("a") + " 0.5 " + dir_.file("c")) + " --cache-dir " +
                  shell_quote(dir_.file("cache")));
  EXPECT_EQ(sample.exit_code, 1) << sample.output;
  EXPECT_TRUE(contains(sample.output, "'" + dir_.file("a") + "' and '" + dir_.file("c") + "'")) << sample.output;
}

TEST_F(ShardSidecar, DividedJobPartsAndTheirMergeHaveSidecars) {
  for (const int part : {0, 1}) {
    const CommandResult made = preprocess("job", "--tokenizer", model(), " --shard " + std::to_string(part) + "/2");
    ASSERT_EQ(made.exit_code, 0) << made.output;
    EXPECT_TRUE(dataprep::read_shard_sidecar(dir_.file("job.part-" + std::to_string(part) + "-of-2")).has_value());
  }
  const CommandResult merged = dataprep("merge " + shell_quote(dir_.file("job.part-0-of-2")) + " " +
                                        shell_quote(dir_.file("job.part-1-of-2")) + " -o " + shell_quote(dir_.file("job")));
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  ASSERT_EQ(preprocess("whole").exit_code, 0);
  const auto job = dataprep::read_shard_sidecar(dir_.file("job"));
  const auto whole = dataprep::read_shard_sidecar(dir_.file("whole"));
  ASSERT_TRUE(job && whole);
  EXPECT_EQ(job->tokenizer, whole->tokenizer);
  EXPECT_EQ(job->eod_id, whole->eod_id);
  EXPECT_EQ(job->bin_bytes, whole->bin_bytes);
  EXPECT_EQ(read_all(dir_.file("job.dufu.json")), read_all(dir_.file("whole.dufu.json")));
}

TEST_F(ShardSidecar, ASidecarOfAnotherPairIsRefused) {
  ASSERT_EQ(preprocess("corpus").exit_code, 0);
  const std::string prefix = dir_.file("corpus");
  // A tool that writes no sidecar replaced the pair (here: with half of it).
  ASSERT_EQ(preprocess("half", "--tokenizer", model(), " --shard 0/2").exit_code, 0);
  for (const std::string suffix : {".bin", ".idx"}) {
    fs::copy_file(dir_.file("half.part-0-of-2") + suffix, prefix + suffix, fs::copy_options::overwrite_existing);
  }
  const CommandResult refused =
      run_command(shell_quote(dataprep_tool()) + " inspect " + shell_quote(prefix) + " --show 0");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "describes a pair of")) << refused.output;
}

}  // namespace
}  // namespace dufu::testing
