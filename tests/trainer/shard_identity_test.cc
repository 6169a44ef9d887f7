// Tests for the shard identity a checkpoint records and the watch over the shards
// during a run (shard_identity.h): the same documents give the same identity wherever
// the files are and whenever they were written; another index, other tokens or other
// sizes give another, and the change is named; a shard changed in place under a run
// is caught, one renamed over it is not the run's concern.
#include "dufu/trainer/checkpoint/shard_identity.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dufu/dataprep/indexed_dataset.h"
#include "support/expect_error.h"
#include "support/synthetic_shard.h"
#include "support/temp_dir.h"

namespace dufu::trainer {
namespace {

namespace fs = std::filesystem;
using dufu::testing::expect_error;
using dufu::testing::read_all;
using dufu::testing::TempDir;
using dufu::testing::write_all;
using dufu::testing::write_synthetic_shard;

class ShardIdentityTest : public ::testing::Test {
 protected:
  std::string shard(const std::string& name, const std::vector<std::uint64_t>& lengths) {
    const std::string prefix = dir_.file(name);
    write_synthetic_shard(prefix, lengths);
    return prefix;
  }
  // The identity `prefix` had, recorded under the prefix of `as`.
  static ShardIdentity identity_as(const std::string& prefix, const std::string& as) {
    ShardIdentity identity = shard_identity(prefix);
    identity.prefix = as;
    return identity;
  }

  TempDir dir_;
};

TEST_F(ShardIdentityTest, SameDocumentsAreTheSameShardWhereverAndWhenever) {
  const std::string a = shard("a", {3, 5, 8});
  const ShardIdentity identity = shard_identity(a);
  EXPECT_EQ(identity.prefix, a);
  EXPECT_EQ(identity.bin_bytes, fs::file_size(a + ".bin"));
  EXPECT_EQ(identity.idx_bytes, fs::file_size(a + ".idx"));
  EXPECT_EQ(identity.idx_sha256.size(), 64u);
  EXPECT_EQ(identity.bin_sample_sha256.size(), 64u);
  // Written again later, elsewhere: another modification time, the same identity.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string b = shard("b", {3, 5, 8});
  EXPECT_TRUE(identity_as(b, a) == identity);
  EXPECT_EQ(shard_change({identity}, {identity_as(b, a)}, "ckpt"), std::nullopt);
}

TEST_F(ShardIdentityTest, AnotherIndexOrOtherTokensAreAnotherShardNamedInTheChange) {
  const std::string a = shard("a", {3, 5, 8});
  const std::vector<ShardIdentity> recorded = {shard_identity(a)};
  // The same sizes, the documents in another order: only the index digest differs.
  const std::string reordered = shard("reordered", {5, 3, 8});
  ASSERT_EQ(fs::file_size(reordered + ".idx"), fs::file_size(a + ".idx"));
  const std::optional<std::string> order = shard_change(recorded, {identity_as(reordered, a)}, "run/step_00000004");
  ASSERT_TRUE(order.has_value());
  EXPECT_NE(order->find("data shard '" + a + "' changed since run/step_00000004 was written: " + a +
                        ".idx has SHA-256 "),
            std::string::npos)
      << *order;
  EXPECT_NE(order->find("(its documents changed)"), std::string::npos) << *order;

  // More documents: the .bin's size says it first.
  const std::string longer = shard("longer", {3, 5, 8, 1});
  const auto grown = shard_change(recorded, {identity_as(longer, a)}, "c");
  ASSERT_TRUE(grown.has_value());
  EXPECT_NE(grown->find(a + ".bin is " + std::to_string(fs::file_size(longer + ".bin")) + " bytes, it was " +
                        std::to_string(fs::file_size(a + ".bin"))),
            std::string::npos)
      << *grown;

  // Tokens rewritten in place, anywhere the samples reach (the first and the last
  // block always): the index is the same, the tokens are not.
  const std::string big = shard("big", std::vector<std::uint64_t>(400, 100));  // 160 kB, sampled
  const std::vector<ShardIdentity> before = {shard_identity(big)};
  for (const std::uint64_t offset : {std::uint64_t{0}, fs::file_size(big + ".bin") - 1}) {
    std::string bytes = read_all(big + ".bin");
    bytes[offset] ^= 1;
    write_all(big + ".bin", bytes);
    const auto tokens = shard_change(before, {shard_identity(big)}, "c");
    ASSERT_TRUE(tokens.has_value()) << offset;
    EXPECT_NE(tokens->find(big + ".bin holds other tokens"), std::string::npos) << *tokens;
    bytes[offset] ^= 1;
    write_all(big + ".bin", bytes);
    EXPECT_EQ(shard_change(before, {shard_identity(big)}, "c"), std::nullopt);
  }
}

TEST_F(ShardIdentityTest, OnlyShardsInBothListsAreCompared) {
  const std::string a = shard("a", {3, 5});
  const std::string b = shard("b", {4});
  // A blend changed on purpose (another shard added, one left out): the config says so.
  EXPECT_EQ(shard_change({shard_identity(a)}, {shard_identity(b)}, "c"), std::nullopt);
  EXPECT_EQ(shard_change({shard_identity(a)}, {shard_identity(b), shard_identity(a)}, "c"), std::nullopt);
  EXPECT_EQ(shard_change({}, {shard_identity(a)}, "c"), std::nullopt);  // a checkpoint from before
  const auto changed = shard_change({shard_identity(b), identity_as(a, b)}, {shard_identity(b)}, "c");
  ASSERT_TRUE(changed.has_value());
  EXPECT_NE(changed->find("data shard '" + b + "'"), std::string::npos) << *changed;
}

TEST_F(ShardIdentityTest, MissingShardIsNamed) {
  expect_error([&] { shard_identity(dir_.file("nothing")); }, {dir_.file("nothing") + ".bin"});
  const std::string a = shard("a", {3});
  fs::remove(a + ".idx");
  expect_error([&] { shard_identity(a); }, {a + ".idx"});
}

TEST_F(ShardIdentityTest, WatchCatchesAShardChangedInPlaceButNotOneRenamedOverIt) {
  const std::string a = shard("a", {3, 5, 8});
  const std::string b = shard("b", {2});
  {
    const ShardWatch watch({a, b});
    EXPECT_NO_THROW(watch.check());
    fs::resize_file(a + ".bin", 4);
    expect_error([&] { watch.check(); },
                 {"data shard file '" + a + ".bin' changed while training: it is 4 bytes, it was 64 (truncated)",
                  "HINT: a shard must not change while a run reads it"});
  }
  {
    const std::string c = shard("c", {3, 5, 8});
    const ShardWatch watch({c});
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::fstream bin(c + ".bin", std::ios::binary | std::ios::in | std::ios::out);
    bin.put('\x7f');  // same size, new modification time
    bin.close();
    expect_error([&] { watch.check(); }, {c + ".bin' changed while training: it was modified"});
  }
  {
    const std::string d = shard("d", {3, 5, 8});
    const ShardWatch watch({d});
    // dataprep replaces a shard by renaming new files over it: the run keeps reading
    // the files it opened, and a resume compares the new ones.
    const std::string e = shard("e", {7});
    fs::rename(e + ".bin", d + ".bin");
    fs::rename(e + ".idx", d + ".idx");
    EXPECT_NO_THROW(watch.check());
    fs::remove(d + ".idx");
    expect_error([&] { watch.check(); }, {"cannot stat data shard file '" + d + ".idx'"});
  }
}

}  // namespace
}  // namespace dufu::trainer
