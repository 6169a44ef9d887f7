// Issue 14: `dataprep preprocess` under mpirun (1 to 4 ranks) and as `--shard K/N`
// parts joined by `dataprep merge` must write exactly the bytes of the single
// process, over a mix of txt, jsonl, .zst, .gz and empty inputs with one file large
// enough to be cut among ranks, in both index layouts; a bad record on one rank, a
// killed rank and an output directory one rank cannot see must stop the job leaving
// nothing under the final names (and a killed job no rank's part, which are anonymous
// files; named hidden ones where the file system has none); merge must refuse
// incomplete or mixed parts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/dataprep/anonymous_file.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/part_join.h"
#include "support/compression.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::CommandResult;
using dufu::testing::fixture_path;
using dufu::testing::read_all;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::write_all;

std::string tool() { return shell_quote(dufu::testing::dataprep_tool()); }
std::string model() { return shell_quote(fixture_path("fortunes.model")); }

// Lines [first, first + count) of a fixture file.
std::string lines_of(const std::string& name, std::size_t first, std::size_t count) {
  const std::string all = read_all(fixture_path(name));
  std::size_t begin = 0;
  for (std::size_t i = 0; i < first && begin != std::string::npos; ++i) begin = all.find('\n', begin) + 1;
  std::size_t end = begin;
  for (std::size_t i = 0; i < count && end < all.size(); ++i) end = all.find('\n', end) + 1;
  return all.substr(begin, end - begin);
}

CommandResult mpirun(int ranks, const std::string& arguments, const std::string& wrapper = "") {
  return run_command(std::string("timeout -k 5 120 ") + DUFU_MPIRUN + " -np " + std::to_string(ranks) + " " + wrapper +
                     tool() + " " + arguments + " 2>&1");
}

// Whether `dir` can hold O_TMPFILE files, which a divided job's parts are where it can.
bool anonymous_files_supported(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

CommandResult dataprep(const std::string& arguments) { return run_command(tool() + " " + arguments + " 2>&1"); }

// Every file of a directory, by name.
std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// The join of anonymous parts (index from memory, .bin from a file without a name)
// writes the bytes one named writer commits for the same documents, in both layouts;
// an anonymous writer has no name to commit to, and leaves nothing in its directory.
TEST(AnonymousParts, JoinIntoTheBytesOfOneWriterOfAllTheirDocuments) {
  using namespace dufu::dataprep;
  const TempDir dir;
  if (!anonymous_files_supported(dir.path())) GTEST_SKIP() << dir.path() << " cannot hold O_TMPFILE files";
  // Documents of one to three sequences; part 0 gets the first three documents.
  const std::vector<std::vector<std::vector<std::int32_t>>> documents = {
      {{1, 2, 3}}, {{4}, {5, 6}}, {{7, 8, 9, 10}}, {{11}, {12, 13}, {}}, {{14, 15}}};
  auto add = [](IndexedDatasetWriter& writer, const std::vector<std::vector<std::int32_t>>& document) {
    for (const auto& sequence : document) writer.add_sequence(sequence);
    writer.end_document();
  };
  for (const IndexLayout layout : {IndexLayout::kMMIDIDX, IndexLayout::kTNTIDX}) {
    const std::string name(layout_name(layout));
    IndexedDatasetWriter whole(dir.file("whole-" + name), layout, DType::kUInt16);
    for (const auto& document : documents) add(whole, document);
    whole.commit();

    std::vector<AnonymousShard> parts;
    std::vector<PartShape> shapes;
    for (const auto& [first, end] : {std::pair{0, 3}, std::pair{3, 5}}) {
      std::optional<AnonymousFile> bin = AnonymousFile::create(dir.path(), "part " + std::to_string(first));
      ASSERT_TRUE(bin.has_value());
      IndexedDatasetWriter writer(std::move(*bin), "part", layout, DType::kUInt16);
      for (int d = first; d < end; ++d) add(writer, documents[static_cast<std::size_t>(d)]);
      EXPECT_THROW(writer.commit(), dufu::Error);
      parts.push_back(writer.finish_anonymous());
      shapes.push_back(anonymous_shard_shape(parts.back()));
    }
    EXPECT_EQ(shapes[0].sequences, 4u);
    EXPECT_EQ(shapes[1].documents, 2u);
    EXPECT_EQ(shapes[1].tokens, 5u);  // 1 + 2 + 0 + 2
    const std::string joined = dir.file("joined-" + name);
    const JoinLayout join(shapes, layout, DType::kUInt16);
    dufu::AtomicFile bin(bin_path(joined)), idx(idx_path(joined));
    {
      JoinTarget target(bin.temp_path(), idx.temp_path());
      target.set_sizes(join);
      target.write_header(join);
      target.write_part(join, 1, parts[1]);  // in any order, as the ranks do
      target.write_part(join, 0, parts[0]);
      target.finish();
    }
    commit_shard_pair(bin, idx, joined);
    EXPECT_TRUE(read_all(bin_path(joined)) == read_all(bin_path(dir.file("whole-" + name)))) << name;
    EXPECT_TRUE(read_all(idx_path(joined)) == read_all(idx_path(dir.file("whole-" + name)))) << name;
  }
  EXPECT_EQ(listing(dir.path()),
            (std::set<std::string>{"whole-MMIDIDX.bin", "whole-MMIDIDX.idx", "joined-MMIDIDX.bin", "joined-MMIDIDX.idx",
                                   "whole-TNTIDX.bin", "whole-TNTIDX.idx", "joined-TNTIDX.bin", "joined-TNTIDX.idx"}));
}

class DistributedPreprocess : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(in_);
    std::filesystem::create_directories(out_);
    // In sorted order: a txt, an empty jsonl, a zstd jsonl, the large plain jsonl (the
    // interval boundaries of 2 to 4 ranks fall inside it), an empty txt, a gzip txt.
    write_all(in_ + "/a.txt", lines_of("fortunes.txt", 0, 600));
    write_all(in_ + "/b.jsonl", "");
    write_all(in_ + "/c.jsonl.zst", dufu::testing::zstd_bytes(lines_of("fortunes.jsonl", 600, 500)));
    write_all(in_ + "/d.jsonl", lines_of("fortunes.jsonl", 1100, 6000));
    write_all(in_ + "/e.txt", "");
    write_all(in_ + "/f.txt.gz", dufu::testing::gzip_bytes(lines_of("fortunes.txt", 7100, 400)));
  }

  std::string preprocess_flags(const std::string& prefix, const std::string& impl) const {
    return "preprocess -i " + shell_quote(in_ + "/*") + " -o " + shell_quote(prefix) + " -m " + model() +
           " --append-eod -j 1 -q --impl " + impl;
  }

  // Both files of `prefix` are byte for byte those of `expected`.
  static void expect_same_shard(const std::string& prefix, const std::string& expected, const std::string& what) {
    ASSERT_TRUE(std::filesystem::exists(prefix + ".bin")) << what;
    EXPECT_TRUE(read_all(prefix + ".bin") == read_all(expected + ".bin")) << what << ": .bin differs";
    EXPECT_TRUE(read_all(prefix + ".idx") == read_all(expected + ".idx")) << what << ": .idx differs";
  }

  TempDir dir_;
  std::string in_ = dir_.file("in");
  std::string out_ = dir_.file("out");
};

TEST_F(DistributedPreprocess, EveryRankCountAndEveryShardingWritesTheSingleProcessBytes) {
  for (const std::string impl : {"mmap", "lazy"}) {
    const std::string single = out_ + "/single-" + impl;
    const CommandResult reference = dataprep(preprocess_flags(single, impl));
    ASSERT_EQ(reference.exit_code, 0) << reference.output;
    // mmap: every rank count; lazy (TNTIDX): one, to cover the other index layout.
    const std::vector<int> rank_counts = impl == "mmap" ? std::vector<int>{1, 2, 3, 4} : std::vector<int>{3};
    for (const int ranks : rank_counts) {
      const std::string prefix = out_ + "/np" + std::to_string(ranks) + "-" + impl;
      const CommandResult run = mpirun(ranks, preprocess_flags(prefix, impl));
      ASSERT_EQ(run.exit_code, 0) << run.output;
      expect_same_shard(prefix, single, impl + " at " + std::to_string(ranks) + " ranks");
      if (ranks > 1) {
        EXPECT_NE(run.output.find("with " + std::to_string(ranks) + " ranks of 1 workers"), std::string::npos)
            << run.output;
      }
      // The summary counts the whole job, as the single process does.
      const std::regex documents("documents +[0-9]+ written");
      std::smatch mine, theirs;
      ASSERT_TRUE(std::regex_search(run.output, mine, documents)) << run.output;
      ASSERT_TRUE(std::regex_search(reference.output, theirs, documents)) << reference.output;
      EXPECT_EQ(mine.str(), theirs.str());
    }
    // Parts written separately (as job-array tasks would), merged in any order.
    const int parts = impl == "mmap" ? 4 : 2;
    std::string part_list;
    for (int k = parts - 1; k >= 0; --k) {
      const std::string sharded = out_ + "/sharded-" + impl;
      const CommandResult part =
          dataprep(preprocess_flags(sharded, impl) + " --shard " + std::to_string(k) + "/" + std::to_string(parts));
      ASSERT_EQ(part.exit_code, 0) << part.output;
      part_list += " " + shell_quote(sharded + ".part-" + std::to_string(k) + "-of-" + std::to_string(parts));
    }
    const CommandResult merge = dataprep("merge" + part_list + " -o " + shell_quote(out_ + "/merged-" + impl));
    ASSERT_EQ(merge.exit_code, 0) << merge.output;
    expect_same_shard(out_ + "/merged-" + impl, single, impl + " from " + std::to_string(parts) + " shards");
  }
  // The large file was cut: a middle part of 4 covers a byte range of it, not all of it.
  const std::string manifest = read_all(out_ + "/sharded-mmap.part-2-of-4.manifest");
  EXPECT_NE(manifest.find("\"path\":" + dufu::quote_json_string(in_ + "/d.jsonl") + ",\"whole\":false"),
            std::string::npos)
      << manifest;
  // Only finished outputs remain: no rank's part, temporary or lock.
  for (const std::string& name : listing(out_)) {
    EXPECT_TRUE(name.ends_with(".bin") || name.ends_with(".idx") || name.ends_with(".manifest") ||
                name.ends_with(".dufu.json"))
        << name;
  }
}

TEST_F(DistributedPreprocess, SeveralJsonKeysWriteOnePairPerKeyAsTheSingleProcessDoes) {
  // Two keys per record: the text and a line of its own, so the two outputs differ.
  std::filesystem::remove_all(in_);
  std::filesystem::create_directories(in_);
  const std::string text = lines_of("fortunes.jsonl", 0, 3000);
  std::string two_keys;
  std::size_t number = 0;
  for (std::size_t at = 0; at < text.size(); at = text.find('\n', at) + 1) {
    const std::string line = text.substr(at, text.find('\n', at) - at);
    two_keys += line.substr(0, line.rfind('}')) + ", \"title\": \"cookie " + std::to_string(++number) + "\"}\n";
  }
  write_all(in_ + "/two.jsonl", two_keys);
  const std::string keys = " --json-keys text title";
  ASSERT_EQ(dataprep(preprocess_flags(out_ + "/single", "mmap") + keys).exit_code, 0);
  const CommandResult run = mpirun(2, preprocess_flags(out_ + "/np2", "mmap") + keys);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int k = 0; k < 2; ++k) {
    const CommandResult part =
        dataprep(preprocess_flags(out_ + "/s", "mmap") + keys + " --shard " + std::to_string(k) + "/2");
    ASSERT_EQ(part.exit_code, 0) << part.output;
  }
  for (const std::string key : {"text", "title"}) {
    const std::string suffix = "_" + key + "_document";
    expect_same_shard(out_ + "/np2" + suffix, out_ + "/single" + suffix, key + " at 2 ranks");
    const CommandResult merge =
        dataprep("merge " + shell_quote(out_ + "/s" + suffix + ".part-1-of-2") + " " +
                 shell_quote(out_ + "/s" + suffix + ".part-0-of-2") + " -o " + shell_quote(out_ + "/merged" + suffix));
    ASSERT_EQ(merge.exit_code, 0) << merge.output;
    expect_same_shard(out_ + "/merged" + suffix, out_ + "/single" + suffix, key + " from 2 shards");
  }
  EXPECT_FALSE(read_all(out_ + "/single_text_document.bin") == read_all(out_ + "/single_title_document.bin"));
}

TEST_F(DistributedPreprocess, ABadRecordOnOneRankStopsEveryRankOrIsCountedWhenSkipping) {
  // Four inputs of about the same size, one per rank; rank 2's has a bad line 77.
  std::filesystem::remove_all(in_);
  std::filesystem::create_directories(in_);
  for (int i = 0; i < 4; ++i) {
    std::string text = lines_of("fortunes.jsonl", static_cast<std::size_t>(i) * 1500, 1500);
    if (i == 2) {
      std::size_t at = 0;
      for (int line = 1; line < 77; ++line) at = text.find('\n', at) + 1;
      text.replace(at, text.find('\n', at) - at, "{\"text\": 12}");
    }
    write_all(in_ + "/p" + std::to_string(i) + ".jsonl", text);
  }
  const std::string prefix = out_ + "/corpus";
  const CommandResult failed = mpirun(4, preprocess_flags(prefix, "mmap"));
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_NE(failed.output.find(in_ + "/p2.jsonl:77: key 'text' is not a string (it is a number)"), std::string::npos)
      << failed.output;
  EXPECT_NE(failed.output.find("rank 2 of 4; every rank stopped"), std::string::npos) << failed.output;
  EXPECT_TRUE(listing(out_).empty()) << "left behind: " << *listing(out_).begin();

  const CommandResult single = dataprep(preprocess_flags(out_ + "/single", "mmap") + " --on-error skip");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const CommandResult skipped = mpirun(4, preprocess_flags(prefix, "mmap") + " --on-error skip");
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("5999 written, 0 empty skipped, 1 bad skipped"), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find("skipped: " + in_ + "/p2.jsonl:77: key 'text'"), std::string::npos) << skipped.output;
  expect_same_shard(prefix, out_ + "/single", "skipping at 4 ranks");

  // In a file cut among the ranks, the message gives the line in the file.
  std::filesystem::remove_all(in_);
  std::filesystem::create_directories(in_);
  std::string text = lines_of("fortunes.jsonl", 0, 6000);
  std::size_t at = 0;
  for (int line = 1; line < 4321; ++line) at = text.find('\n', at) + 1;
  text.replace(at, text.find('\n', at) - at, "[\"not an object\"]");
  write_all(in_ + "/one.jsonl", text);
  const CommandResult cut = mpirun(4, preprocess_flags(out_ + "/cut", "mmap"));
  EXPECT_NE(cut.exit_code, 0);
  EXPECT_NE(cut.output.find(in_ + "/one.jsonl:4321: expected a JSON object (rank 2 of 4"), std::string::npos)
      << cut.output;
  EXPECT_FALSE(std::filesystem::exists(out_ + "/cut.bin"));
}

TEST_F(DistributedPreprocess, AKilledRankEndsTheJobAndLeavesNothingUnderTheFinalNames) {
  // Rank 2 is killed (SIGKILL, as the OOM killer would) at its first meeting with the
  // others, 200 ms into its part or when it finished it, whichever comes first.
  std::string line = lines_of("fortunes.jsonl", 0, 200);
  std::string text;
  while (text.size() < (std::size_t{8} << 20)) text += line;
  std::filesystem::remove_all(in_);
  std::filesystem::create_directories(in_);
  write_all(in_ + "/big.jsonl", text);
  const std::string killer = dir_.file("kill_rank_2.sh");
  write_all(killer,
            "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 2 ]; then export DUFU_CRASH_POINT=preprocess:heartbeat; fi\n"
            "exec \"$@\"\n");
  const auto start = std::chrono::steady_clock::now();
  const CommandResult killed = mpirun(4, preprocess_flags(out_ + "/corpus", "mmap"), "sh " + shell_quote(killer) + " ");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(killed.exit_code, 0);
  EXPECT_NE(killed.exit_code, 124) << "the job hung until timeout killed it";
  EXPECT_NE(killed.output.find("signal 9"), std::string::npos) << killed.output;
  EXPECT_LT(seconds, 60.0);
  std::printf("a killed rank ended the 4-rank job after %.1f s\n", seconds);
  // Nothing under the final names, and no rank's part: a part is an anonymous file,
  // which the kernel frees however its rank ends (the killed one, and the others that
  // mpirun stops with SIGTERM and SIGKILL a second later). Only rank 0's lock on the
  // output may stay, when that SIGKILL came before its handler ran; the next job on
  // the prefix removes it. (Where the file system has no anonymous files the parts
  // have hidden names, which the next job removes too.)
  const bool anonymous = anonymous_files_supported(out_);
  int left = 0;
  for (const std::string& name : listing(out_)) {
    if (name == ".corpus.lock") continue;
    ++left;
    if (anonymous) {
      ADD_FAILURE() << "left behind: " << name;
    } else {
      EXPECT_TRUE(name.starts_with(".corpus.rank-") || name.starts_with("..corpus.rank-")) << name;
    }
  }
  std::printf("files of rank parts left (%s parts): %d; rank 0's lock left: %s\n", anonymous ? "anonymous" : "named",
              left, listing(out_).contains(".corpus.lock") ? "yes" : "no");
  EXPECT_FALSE(std::filesystem::exists(out_ + "/corpus.bin"));
  EXPECT_FALSE(std::filesystem::exists(out_ + "/corpus.idx"));
  write_all(in_ + "/big.jsonl", line);
  const CommandResult again = mpirun(2, preprocess_flags(out_ + "/corpus", "mmap"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(listing(out_), (std::set<std::string>{"corpus.bin", "corpus.idx", "corpus.dufu.json"}));
}

TEST_F(DistributedPreprocess, WithoutAnonymousFilesTheRanksWriteHiddenNamedPartsAndSaySo) {
  // As on a file system that refuses O_TMPFILE (some NFS versions): the parts get
  // hidden names beside the output, the bytes stay those of the single process, each
  // rank warns once, and a finished job leaves only its output.
  ASSERT_EQ(dataprep(preprocess_flags(out_ + "/single", "mmap")).exit_code, 0);
  const CommandResult run = mpirun(3, preprocess_flags(out_ + "/named", "mmap"), "env DUFU_NO_ANONYMOUS_FILES=1 ");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expect_same_shard(out_ + "/named", out_ + "/single", "named parts at 3 ranks");
  const std::string warning = "cannot hold anonymous files (O_TMPFILE): ranks write their parts under hidden names";
  std::size_t warnings = 0;
  for (std::size_t at = run.output.find(warning); at != std::string::npos; at = run.output.find(warning, at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 3u) << run.output;
  EXPECT_EQ(listing(out_), (std::set<std::string>{"single.bin", "single.idx", "single.dufu.json", "named.bin",
                                                  "named.idx", "named.dufu.json"}));
}

TEST_F(DistributedPreprocess, AnOutputDirectoryOneRankDoesNotSeeIsRefusedAtStart) {
  if (run_command("unshare -m true 2>&1").exit_code != 0) {
    GTEST_SKIP() << "no mount namespaces here (unshare -m), so no rank can be given its own view of a directory";
  }
  // Rank 1 sees an empty file system of its own over the output directory, as a
  // node-local directory of the same name on another machine would look.
  const std::string wrapper = dir_.file("hide_output.sh");
  write_all(wrapper,
            "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then\n"
            "  exec unshare -m sh -c 'mount -t tmpfs tmpfs \"$0\" && exec \"$@\"' " +
                shell_quote(out_) + " \"$@\"\nfi\nexec \"$@\"\n");
  const CommandResult run = mpirun(2, preprocess_flags(out_ + "/corpus", "mmap"), "sh " + shell_quote(wrapper) + " ");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("rank 1 (on "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("the output directory must be on a file system that every rank shares"), std::string::npos)
      << run.output;
  EXPECT_TRUE(listing(out_).empty()) << "left behind: " << *listing(out_).begin();
}

TEST_F(DistributedPreprocess, MergeRefusesMissingRepeatedAndMismatchedParts) {
  const std::string sharded = out_ + "/s";
  auto part = [&](int k, int n) { return sharded + ".part-" + std::to_string(k) + "-of-" + std::to_string(n); };
  for (int k = 0; k < 3; ++k) {
    const CommandResult run = dataprep(preprocess_flags(sharded, "mmap") + " --shard " + std::to_string(k) + "/3");
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  const std::string merged = " -o " + shell_quote(out_ + "/merged");
  const CommandResult missing = dataprep("merge " + shell_quote(part(0, 3)) + " " + shell_quote(part(2, 3)) + merged);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("part 1 of 3 is missing"), std::string::npos) << missing.output;
  const CommandResult twice = dataprep("merge " + shell_quote(part(0, 3)) + " " + shell_quote(part(1, 3)) + " " +
                                       shell_quote(part(1, 3)) + " " + shell_quote(part(2, 3)) + merged);
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_NE(twice.output.find("part 1 of 3 is given twice: '" + part(1, 3) + "' and '" + part(1, 3) + "'"),
            std::string::npos)
      << twice.output;

  // Part 1 again with another tokenizer (trained on other text) into another prefix.
  const std::string other_model = dir_.file("other");
  write_all(dir_.file("other.txt"), lines_of("fortunes.txt", 3000, 3000));
  const CommandResult trained = dataprep("train-tokenizer -i " + shell_quote(dir_.file("other.txt")) +
                                         " --model-prefix " + shell_quote(other_model) + " --vocab-size 1000");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string other = out_ + "/other";
  std::string flags = preprocess_flags(other, "mmap") + " --shard 1/3";
  flags.replace(flags.find(model()), model().size(), shell_quote(other_model + ".model"));
  const CommandResult other_part = dataprep(flags);
  ASSERT_EQ(other_part.exit_code, 0) << other_part.output;
  const CommandResult mixed = dataprep("merge " + shell_quote(part(0, 3)) + " " + shell_quote(other + ".part-1-of-3") +
                                       " " + shell_quote(part(2, 3)) + merged);
  EXPECT_NE(mixed.exit_code, 0);
  EXPECT_NE(mixed.output.find("'" + other + ".part-1-of-3' and '" + part(0, 3) +
                              "' are not parts of one job: their tokenizers differ"),
            std::string::npos)
      << mixed.output;
  EXPECT_NE(mixed.output.find("other.model"), std::string::npos) << mixed.output;

  // A part whose files were replaced after its manifest was written.
  const std::string stale = part(1, 3);
  std::filesystem::copy_file(part(0, 3) + ".idx", stale + ".idx", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(part(0, 3) + ".bin", stale + ".bin", std::filesystem::copy_options::overwrite_existing);
  const CommandResult replaced =
      dataprep("merge " + shell_quote(part(0, 3)) + " " + shell_quote(stale) + " " + shell_quote(part(2, 3)) + merged);
  EXPECT_NE(replaced.exit_code, 0);
  EXPECT_NE(replaced.output.find("'" + stale + ".{bin,idx}' are not the files its manifest"), std::string::npos)
      << replaced.output;
  EXPECT_FALSE(std::filesystem::exists(out_ + "/merged.bin"));
  EXPECT_FALSE(std::filesystem::exists(out_ + "/merged.idx"));
}

// Issue 26: a manifest edited to claim fewer parts (part 0 of 3 said to be the only
// one) let merge publish a third of the job as the whole.
TEST_F(DistributedPreprocess, MergeRefusesAManifestEditedToClaimFewerParts) {
  const std::string sharded = out_ + "/s";
  const CommandResult run = dataprep(preprocess_flags(sharded, "mmap") + " --shard 0/3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string part = sharded + ".part-0-of-3";
  std::string manifest = read_all(part + ".manifest");
  const std::string claim = "\"parts\":3";
  ASSERT_NE(manifest.find(claim), std::string::npos) << manifest;
  manifest.replace(manifest.find(claim), claim.size(), "\"parts\":1");
  write_all(part + ".manifest", manifest);
  const std::string merged = " -o " + shell_quote(out_ + "/merged");
  const CommandResult edited = dataprep("merge " + shell_quote(part) + merged);
  EXPECT_EQ(edited.exit_code, 1);
  EXPECT_NE(edited.output.find(part + ".manifest: says part 0 of 1 but its name says '.part-0-of-3'"),
            std::string::npos)
      << edited.output;
  // Renamed to match what it claims.
  const std::string renamed = sharded + ".part-0-of-1";
  for (const char* extension : {".bin", ".idx", ".manifest"}) {
    std::filesystem::rename(part + extension, renamed + extension);
  }
  const CommandResult alone = dataprep("merge " + shell_quote(renamed) + merged);
  EXPECT_EQ(alone.exit_code, 1);
  EXPECT_NE(alone.output.find(renamed + ".manifest: its job_sha256 is not that of its inputs, options, tokenizer and "
                                        "part count (1), which were changed after it was written"),
            std::string::npos)
      << alone.output;
  EXPECT_FALSE(std::filesystem::exists(out_ + "/merged.bin"));
  EXPECT_FALSE(std::filesystem::exists(out_ + "/merged.idx"));
}

}  // namespace
