// The causal-LM dataset's index cache as the dataset uses it: the same samples as in
// memory, found again without a rebuild, a key for every input that changes the
// arrays, Megatron's int64 arrays, refusals, and processes that race to build one.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "causal_lm_test_support.h"
#include "dufu/common/npy.h"
#include "dufu/dataprep/causal_lm_dataset.h"
#include "support/expect_error.h"
#include "support/fork_child.h"
#include "support/synthetic_shard.h"
#include "support/temp_dir.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;
using dufu::testing::TempDir;
using namespace causal_lm_testing;

namespace fs = std::filesystem;

TEST(CausalLMCacheTest, CachedAndInMemoryDatasetsAgree) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", varied_lengths(60));
  const CausalLMDataset on_disk(shard, cached(dir, 16, 200, 3));
  const CausalLMDataset in_ram(shard, in_memory(16, 200, 3));
  EXPECT_TRUE(in_ram.cache_path().empty());
  EXPECT_EQ(on_disk.description(), in_ram.description());
  EXPECT_EQ(on_disk.num_epochs(), in_ram.num_epochs());
  EXPECT_EQ(all_samples(on_disk), all_samples(in_ram));
  EXPECT_EQ(dufu::testing::read_all(on_disk.cache_path() + "/description.txt"), on_disk.description());
}

TEST(CausalLMCacheTest, SecondConstructionFindsTheCacheWithoutRebuilding) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", varied_lengths(60));
  const CausalLMDataset first(shard, cached(dir, 16, 200, 3));
  std::map<std::string, fs::file_time_type> mtimes;
  for (const auto& entry : fs::directory_iterator(first.cache_path())) {
    mtimes[entry.path().string()] = entry.last_write_time();
  }
  ASSERT_EQ(mtimes.size(), 5u);  // three arrays, description.txt, done
  const CausalLMDataset second(shard, cached(dir, 16, 200, 3));
  EXPECT_EQ(second.cache_path(), first.cache_path());
  for (const auto& [path, mtime] : mtimes) EXPECT_EQ(fs::last_write_time(path), mtime) << path;
  EXPECT_EQ(all_samples(second), all_samples(first));
}

TEST(CausalLMCacheTest, EveryInputThatChangesTheArraysChangesTheKey) {
  TempDir dir;
  const auto lengths = varied_lengths(60);
  const auto shard = make_shard(dir, "shard", lengths);
  const std::vector<CausalLMOptions> variants = {
      cached(dir, 16, 200, 3),
      cached(dir, 16, 200, 3, megatron("8,1,1", 0)),  // OSLO's key forgot the split
      cached(dir, 16, 200, 3, megatron("8,1,1", 1)),
      cached(dir, 16, 200, 3, oslo(0.0, 0.5)),
      cached(dir, 16, 200, 4),
      cached(dir, 17, 200, 3),
      cached(dir, 16, 201, 3),
      cached(dir, 16, std::nullopt, 3),
  };
  std::set<std::string> paths;
  for (const auto& options : variants) paths.insert(CausalLMDataset(shard, options).cache_path());
  EXPECT_EQ(paths.size(), variants.size());

  // Rewriting the shard (new mtime) is a new key as well.
  const std::string before = CausalLMDataset(shard, variants[0]).cache_path();
  dufu::testing::write_synthetic_shard(dir.file("shard"), lengths);
  const std::string after = CausalLMDataset(open_shard(dir.file("shard")), variants[0]).cache_path();
  EXPECT_NE(before, after);
}

TEST(CausalLMCacheTest, MapsInt64SampleAndShuffleArrays) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", varied_lengths(60));
  const CausalLMDataset narrow(shard, cached(dir, 16, 200, 3));
  const std::string path = narrow.cache_path();
  ASSERT_EQ(NpyArray::open(path + "/sample_index.npy").descr(), "<i4");
  ASSERT_EQ(NpyArray::open(path + "/shuffle_index.npy").descr(), "<u4");
  const auto expected = all_samples(narrow);

  // What Megatron writes for very large indices: the same values as <i8.
  std::vector<std::int64_t> rows, order;
  for (std::uint64_t r = 0; r <= narrow.size(); ++r) {
    rows.push_back(narrow.sample_index_at(r).first);
    rows.push_back(narrow.sample_index_at(r).second);
  }
  for (std::uint64_t i = 0; i < narrow.size(); ++i) order.push_back(narrow.shuffle_index_at(i));
  write_npy<std::int64_t>(path + "/sample_index.npy", rows, {narrow.size() + 1, 2});
  write_npy<std::int64_t>(path + "/shuffle_index.npy", order);

  const CausalLMDataset wide(shard, cached(dir, 16, 200, 3));
  EXPECT_EQ(wide.cache_path(), path);
  EXPECT_EQ(NpyArray::open(path + "/sample_index.npy").descr(), "<i8");
  EXPECT_EQ(all_samples(wide), expected);
}

TEST(CausalLMCacheTest, ACacheOfAnotherFormatVersionIsAClearError) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", varied_lengths(60));
  const std::string path = CausalLMDataset(shard, cached(dir, 16, 200, 3)).cache_path();
  dufu::testing::write_all(path + "/done", "dufu index cache format v0\n");
  expect_error([&] { CausalLMDataset(shard, cached(dir, 16, 200, 3)); }, {path, "format", "v0", "delete"});
}

TEST(CausalLMCacheTest, ArraysThatDoNotFitTheDescriptionAreRefused) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", varied_lengths(60));
  const std::string path = CausalLMDataset(shard, cached(dir, 16, 200, 3)).cache_path();
  write_npy<std::uint32_t>(path + "/shuffle_index.npy", std::vector<std::uint32_t>{0, 1, 2});
  expect_error([&] { CausalLMDataset(shard, cached(dir, 16, 200, 3)); }, {path, "does not hold"});
}

// FNV-1a over every sample, for comparing what separate processes read.
std::uint64_t samples_digest(const TokenDataset& dataset) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (std::uint64_t i = 0; i < dataset.size(); ++i) {
    for (const std::int32_t token : sample(dataset, i)) {
      hash = (hash ^ static_cast<std::uint32_t>(token)) * 1099511628211ULL;
    }
  }
  return hash;
}

TEST(CausalLMCacheTest, ConcurrentProcessesBuildOneCacheAndReadEqualSamples) {
  TempDir dir;
  const auto lengths = varied_lengths(2000);
  const std::string prefix = dir.file("shard");
  dufu::testing::write_synthetic_shard(prefix, lengths);
  const std::uint64_t expected = samples_digest(CausalLMDataset(open_shard(prefix), in_memory(8, 20000, 11)));

  // Both children are released at once so their builds race.
  const std::vector<int> exit_codes = dufu::testing::race_children(2, [&](int k) {
    const CausalLMDataset dataset(open_shard(prefix), cached(dir, 8, 20000, 11));
    dufu::testing::write_all(dir.file("digest" + std::to_string(k)),
                             std::to_string(samples_digest(dataset)) + " " + dataset.cache_path());
    return 0;
  });
  for (const int code : exit_codes) EXPECT_EQ(code, 0) << "child exit code";
  const std::string a = dufu::testing::read_all(dir.file("digest0"));
  const std::string b = dufu::testing::read_all(dir.file("digest1"));
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.substr(0, a.find(' ')), std::to_string(expected));

  std::vector<std::string> key_dirs;
  for (const auto& entry : fs::directory_iterator(dir.file("cache"))) {
    const std::string name = entry.path().filename().string();
    EXPECT_NE(name.rfind(".tmp", 0), 0u) << "leftover temporary " << name;
    if (entry.is_directory()) key_dirs.push_back(name);
  }
  ASSERT_EQ(key_dirs.size(), 1u);
  EXPECT_TRUE(dufu::testing::file_exists(dir.file("cache/" + key_dirs[0] + "/done")));
}

}  // namespace
}  // namespace dufu::dataprep
