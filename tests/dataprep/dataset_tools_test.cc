// End-to-end tests of `dataprep build-index` and `dataprep sample` on synthetic
// shards: caches appear where asked and are reused, the sample tool reports the
// blend's proportions, and bad blends fail with a clear message.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/synthetic_shard.h"
#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

class DatasetTools : public ::testing::Test {
 protected:
  void SetUp() override {
    write_synthetic_shard(dir_.file("a"), std::vector<std::uint64_t>(200, 50));
    write_synthetic_shard(dir_.file("b"), std::vector<std::uint64_t>(100, 30));
  }

  CommandResult dataprep(const std::string& arguments) {
    return run_command(shell_quote(dataprep_tool()) + " " + arguments);
  }

  std::string blend() const { return "--data-path " + shell_quote("0.75 " + dir_.file("a") + " 0.25 " + dir_.file("b")); }
  std::string cache() const { return " --cache-dir " + dir_.file("cache"); }

  std::size_t cache_entries() const {
    std::size_t count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.file("cache"))) {
      if (entry.is_directory()) ++count;
    }
    return count;
  }

  TempDir dir_;
};

TEST_F(DatasetTools, BuildIndexWritesCachesThatSampleReuses) {
  const auto built = dataprep("build-index " + blend() + " --seq-length 16 --num-samples 400" + cache());
  ASSERT_EQ(built.exit_code, 0) << built.output;
  EXPECT_NE(built.output.find("400 samples of 17 tokens"), std::string::npos) << built.output;
  EXPECT_EQ(cache_entries(), 3U) << "two causal-LM caches and one blend cache";

  const auto sampled = dataprep("sample " + blend() + " --seq-length 16 --num-samples 400 --count 2 --ids" + cache());
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
  EXPECT_EQ(sampled.output.find("building index cache"), std::string::npos) << "the caches were rebuilt";
  EXPECT_NE(sampled.output.find("0.7500   0.7500   300"), std::string::npos) << sampled.output;
  EXPECT_NE(sampled.output.find("0.2500   0.2500   100"), std::string::npos) << sampled.output;
  EXPECT_NE(sampled.output.find("--- sample 1"), std::string::npos) << sampled.output;
  EXPECT_EQ(cache_entries(), 3U);
}

TEST_F(DatasetTools, ADifferentSeedOrSplitGetsItsOwnCache) {
  ASSERT_EQ(dataprep("build-index --data-path " + dir_.file("a") + " --seq-length 16" + cache()).exit_code, 0);
  ASSERT_EQ(dataprep("build-index --data-path " + dir_.file("a") + " --seq-length 16 --seed 7" + cache()).exit_code, 0);
  ASSERT_EQ(dataprep("build-index --data-path " + dir_.file("a") + " --seq-length 16 --split-part valid --split 50,50,0" +
                     cache()).exit_code,
            0);
  EXPECT_EQ(cache_entries(), 3U);
}

TEST_F(DatasetTools, NonPositiveWeightIsRefused) {
  const auto result = dataprep("build-index --data-path " +
                               shell_quote("0.5 " + dir_.file("a") + " -0.5 " + dir_.file("b")) +
                               " --seq-length 16" + cache());
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("blend weights must be positive"), std::string::npos) << result.output;
}

TEST_F(DatasetTools, MissingShardIsNamed) {
  const auto result = dataprep("build-index --data-path " + dir_.file("nope") + " --seq-length 16" + cache());
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find(dir_.file("nope")), std::string::npos) << result.output;
}

TEST_F(DatasetTools, SeqLengthLongerThanTheDataIsRefused) {
  const auto result = dataprep("build-index --data-path " + dir_.file("b") + " --seq-length 100000" + cache());
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("longer than the data"), std::string::npos) << result.output;
}

TEST_F(DatasetTools, SplitLeavingAPartEmptyIsRefused) {
  const auto result = dataprep("build-index --data-path " + dir_.file("a") +
                               " --seq-length 16 --split 100,0,0 --split-part valid" + cache());
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("100,0,0"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace dufu::testing
