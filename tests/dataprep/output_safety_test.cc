// What `dataprep preprocess` and `merge` promise about their outputs, tested the way
// they break (issue 15): a full disk (RLIMIT_FSIZE) at every interesting size, SIGKILL
// at each step of the commit and at arbitrary moments, SIGINT/SIGTERM, two writers of
// one prefix, an output that is one of the inputs. Afterwards the previous pair is
// whole and byte-equal (or the new one is complete), a mix is refused when opened,
// and nothing is left behind: no temporaries, no lock files, no markers.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/shard_output.h"
#include "support/synthetic_shard.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"
#include "tool_process.h"

namespace dufu::testing {
namespace {

namespace fs = std::filesystem;

std::string model() { return fixture_path("fortunes.model"); }

void write_jsonl(const std::string& path, const std::vector<std::string>& texts) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& text : texts) out << "{\"text\": \"" << text << "\"}\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

// The first `count` fortunes, as jsonl.
void write_fortunes(const std::string& path, std::size_t count) {
  std::ifstream in(fixture_path("fortunes.jsonl"), std::ios::binary);
  std::ofstream out(path, std::ios::binary);
  std::string line;
  for (std::size_t i = 0; i < count && std::getline(in, line); ++i) out << line << '\n';
}

struct Pair {
  std::string bin, idx;
  bool operator==(const Pair&) const = default;
};

Pair read_pair(const std::string& prefix) {
  return {file_exists(prefix + ".bin") ? read_all(prefix + ".bin") : "<missing>",
          file_exists(prefix + ".idx") ? read_all(prefix + ".idx") : "<missing>"};
}

// Every name in `dir` that a run must not leave: hidden files (temporaries, lock
// files, markers) other than those listed in `allowed`.
std::vector<std::string> leftovers(const std::string& dir, const std::set<std::string>& allowed = {}) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name[0] == '.' && !allowed.contains(name)) found.push_back(name);
  }
  return found;
}

// True once a writer of DIR/corpus has made its .bin temporary (it holds the lock by then).
bool writing_corpus(const std::string& dir) {
  for (const auto& name : leftovers(dir)) {
    if (name.rfind(".corpus.bin.tmp.", 0) == 0) return true;
  }
  return false;
}

std::string opens_as(const std::string& prefix) {
  try {
    const auto dataset = dataprep::IndexedDataset::open(prefix, dataprep::IndexImpl::kMmap);
    return "ok";
  } catch (const Error& error) {
    return error.what();
  }
}

class OutputSafety : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(out_dir()); }

  std::string out_dir() const { return root_.file("out"); }
  std::string out(const std::string& name) const { return out_dir() + "/" + name; }

  ToolResult preprocess(const std::string& input, const std::string& prefix, const ToolOptions& options = {},
                        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> arguments{"preprocess", "-q", "-j", "2", "-i", input, "-o", prefix, "-m", model()};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    return run_tool(arguments, options);
  }

  TempDir root_;
};

// 1. A write that fails at any size (a full disk) leaves the old pair byte-equal.
// The new corpus has many one-token documents, so its .idx (20 bytes a document) is
// ten times its .bin: limits between the two sizes fail the .idx after the .bin was
// written completely, which is where the old code had already removed the old .idx
// and renamed the new .bin into place.
TEST_F(OutputSafety, AFailedWriteAtAnySizeLeavesTheOldPairWhole) {
  write_fortunes(root_.file("old.jsonl"), 300);
  write_jsonl(root_.file("new.jsonl"), std::vector<std::string>(20000, "a"));
  ASSERT_EQ(preprocess(root_.file("new.jsonl"), out("expected")).exit_code, 0);
  const Pair expected = read_pair(out("expected"));
  fs::remove(out("expected.bin"));
  fs::remove(out("expected.idx"));
  ASSERT_GT(expected.idx.size(), expected.bin.size() * 5) << "the corpus no longer makes a large .idx";

  ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
  const Pair old = read_pair(out("corpus"));
  const rlim_t bin = expected.bin.size(), idx = expected.idx.size();
  int failures = 0;
  for (const rlim_t limit : {rlim_t{0}, rlim_t{1}, rlim_t{100}, rlim_t{4096}, bin / 2, bin - 1, bin, bin + 1,
                             bin + 100, rlim_t{65536}, idx / 4, idx / 2, idx - 4097, idx - 1, idx, idx + 1}) {
    SCOPED_TRACE("file size limit " + std::to_string(limit));
    const ToolResult result = preprocess(root_.file("new.jsonl"), out("corpus"), {.file_size_limit = limit});
    if (result.exit_code == 0) {
      EXPECT_GE(limit, idx);
      EXPECT_TRUE(read_pair(out("corpus")) == expected) << "the new pair is not complete";
      // Put the old pair back for the next size.
      ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
    } else {
      ++failures;
      EXPECT_EQ(result.exit_code, 1) << result.output;
      EXPECT_NE(result.output.find("File too large"), std::string::npos) << result.output;
      EXPECT_TRUE(read_pair(out("corpus")) == old) << "the old pair was damaged: " << result.output;
    }
    EXPECT_EQ(opens_as(out("corpus")), "ok");
    EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
  }
  EXPECT_GE(failures, 13);
}

// Issue 26: under `ulimit -f` with SIGXFSZ as a shell leaves it (its default ends
// the process), a write past the limit killed the tool without a word (exit status
// 153) before it could clean up; it must fail as on a full disk.
TEST_F(OutputSafety, AFileSizeLimitFromTheShellIsReportedLikeAFullDisk) {
  write_fortunes(root_.file("old.jsonl"), 50);
  write_fortunes(root_.file("new.jsonl"), 3000);
  ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
  const Pair old = read_pair(out("corpus"));
  const ToolResult limited = preprocess(root_.file("new.jsonl"), out("corpus"),
                                        {.file_size_limit = 65536, .file_size_signal_as_shell_leaves_it = true});
  EXPECT_EQ(limited.exit_code, 1) << limited.output;
  EXPECT_NE(limited.output.find("dataprep: error: "), std::string::npos) << limited.output;
  EXPECT_NE(limited.output.find("File too large"), std::string::npos) << limited.output;
  EXPECT_TRUE(read_pair(out("corpus")) == old) << "the old pair was damaged";
  EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
}

// The marker is written after both files: a limit between the sizes of the new files
// and the marker's fails on the marker alone.
TEST_F(OutputSafety, AFailedMarkerWriteLeavesTheOldPairWhole) {
  write_fortunes(root_.file("old.jsonl"), 50);
  write_jsonl(root_.file("new.jsonl"), {"a"});
  ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
  const Pair old = read_pair(out("corpus"));
  // The new .idx has 62 bytes, the marker over 100.
  for (const rlim_t limit : {rlim_t{64}, rlim_t{80}, rlim_t{96}}) {
    const ToolResult result = preprocess(root_.file("new.jsonl"), out("corpus"), {.file_size_limit = limit});
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(".corpus.replacing"), std::string::npos) << result.output;
    EXPECT_TRUE(read_pair(out("corpus")) == old);
    EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
  }
}

// The same for merge, whose output is written by the same writer.
TEST_F(OutputSafety, AFailedMergeWriteLeavesTheOldPairWhole) {
  write_synthetic_shard(out("a"), std::vector<std::uint64_t>(3000, 1), dataprep::IndexLayout::kMMIDIDX,
                        dataprep::DType::kUInt16);
  write_synthetic_shard(out("b"), std::vector<std::uint64_t>(2000, 2), dataprep::IndexLayout::kMMIDIDX,
                        dataprep::DType::kUInt16);
  write_synthetic_shard(out("merged"), {5, 6, 7}, dataprep::IndexLayout::kMMIDIDX, dataprep::DType::kUInt16);
  const Pair old = read_pair(out("merged"));
  // New .bin: 14000 bytes; new .idx: 34 + 5000 * 20 = 100034 bytes.
  for (const rlim_t limit : {rlim_t{0}, rlim_t{13999}, rlim_t{14000}, rlim_t{50000}, rlim_t{100033}}) {
    SCOPED_TRACE("file size limit " + std::to_string(limit));
    const ToolResult result =
        run_tool({"merge", out("a"), out("b"), "-o", out("merged")}, {.file_size_limit = limit});
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_TRUE(read_pair(out("merged")) == old);
    EXPECT_EQ(opens_as(out("merged")), "ok");
    EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
  }
  ASSERT_EQ(run_tool({"merge", out("a"), out("b"), "-o", out("merged")}).exit_code, 0);
  EXPECT_EQ(read_pair(out("merged")).bin.size(), 14000U);
}

// SIGKILL at each step of the commit (DUFU_CRASH_POINT). Between the two renames the
// .bin is new and the .idx old, with the same sizes here, so only the marker tells:
// opening refuses the mix, and the next writer of the prefix, even one that fails,
// completes the pair first.
TEST_F(OutputSafety, SigkillAtEachStepOfTheCommit) {
  write_jsonl(root_.file("old.jsonl"), std::vector<std::string>(500, "a"));
  write_jsonl(root_.file("new.jsonl"), std::vector<std::string>(500, "b"));
  write_jsonl(root_.file("bad.jsonl"), {"a", "b"});
  std::ofstream(root_.file("bad.jsonl"), std::ios::app) << "{not json\n";
  ASSERT_EQ(preprocess(root_.file("new.jsonl"), out("expected")).exit_code, 0);
  const Pair expected = read_pair(out("expected"));
  fs::remove(out("expected.bin"));
  fs::remove(out("expected.idx"));

  for (const std::string point : {"shard-pair:marked", "shard-pair:between-renames", "shard-pair:renamed"}) {
    SCOPED_TRACE(point);
    ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
    const Pair old = read_pair(out("corpus"));
    ASSERT_EQ(old.bin.size(), expected.bin.size());
    ASSERT_NE(old.bin, expected.bin);

    const ToolResult killed =
        preprocess(root_.file("new.jsonl"), out("corpus"), {.environment = {"DUFU_CRASH_POINT=" + point}});
    EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
    const std::string opened = opens_as(out("corpus"));
    if (point == "shard-pair:marked") {
      EXPECT_EQ(opened, "ok");
      EXPECT_TRUE(read_pair(out("corpus")) == old);
    } else if (point == "shard-pair:renamed") {
      EXPECT_EQ(opened, "ok");
      EXPECT_TRUE(read_pair(out("corpus")) == expected);
    } else {
      EXPECT_NE(opened.find("was stopped between renaming the two"), std::string::npos) << opened;
      EXPECT_NE(opened.find(out("corpus")), std::string::npos) << opened;
    }

    // The next writer fails on its input, but first repairs the prefix and clears up.
    const ToolResult failed = preprocess(root_.file("bad.jsonl"), out("corpus"));
    EXPECT_EQ(failed.exit_code, 1) << failed.output;
    EXPECT_EQ(opens_as(out("corpus")), "ok");
    EXPECT_TRUE(read_pair(out("corpus")) == (point == "shard-pair:marked" ? old : expected));
    EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
  }
}

// The same for merge: killed at each step of its commit, the prefix opens as the old
// or the new pair or is refused, and the next merge completes or replaces it.
TEST_F(OutputSafety, MergeKilledAtEachStepOfTheCommit) {
  using dataprep::DType;
  using dataprep::IndexLayout;
  write_synthetic_shard(out("a"), std::vector<std::uint64_t>(400, 3), IndexLayout::kMMIDIDX, DType::kUInt16);
  write_synthetic_shard(out("b"), std::vector<std::uint64_t>(300, 4), IndexLayout::kMMIDIDX, DType::kUInt16);
  ASSERT_EQ(run_tool({"merge", out("a"), out("b"), "-o", out("expected")}).exit_code, 0);
  const Pair expected = read_pair(out("expected"));
  for (const std::string point : {"shard-pair:marked", "shard-pair:between-renames", "shard-pair:renamed"}) {
    SCOPED_TRACE(point);
    write_synthetic_shard(out("merged"), {1, 2, 3}, IndexLayout::kMMIDIDX, DType::kUInt16);
    const Pair old = read_pair(out("merged"));
    const ToolResult killed =
        run_tool({"merge", out("a"), out("b"), "-o", out("merged")}, {.environment = {"DUFU_CRASH_POINT=" + point}});
    EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
    const std::string opened = opens_as(out("merged"));
    if (point == "shard-pair:between-renames") {
      EXPECT_NE(opened.find("was stopped between renaming the two"), std::string::npos) << opened;
    } else {
      EXPECT_EQ(opened, "ok");
      EXPECT_TRUE(read_pair(out("merged")) == (point == "shard-pair:marked" ? old : expected));
    }
    ASSERT_EQ(run_tool({"merge", out("a"), out("b"), "-o", out("merged")}).exit_code, 0);
    EXPECT_TRUE(read_pair(out("merged")) == expected);
    EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
  }
}

// SIGKILL at arbitrary moments of a run: whatever the moment, the prefix opens as the
// old pair or the new one, never anything else, and the next run leaves nothing.
TEST_F(OutputSafety, SigkillAtAnyMomentLeavesTheOldPairOrTheNew) {
  write_fortunes(root_.file("old.jsonl"), 100);
  ASSERT_EQ(preprocess(fixture_path("fortunes.jsonl"), out("expected")).exit_code, 0);
  const Pair expected = read_pair(out("expected"));
  fs::remove(out("expected.bin"));
  fs::remove(out("expected.idx"));
  ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
  const Pair old = read_pair(out("corpus"));

  int old_seen = 0, new_seen = 0;
  for (const int delay_ms : {0, 20, 50, 100, 200, 300, 500, 800, 1200, 2000}) {
    SCOPED_TRACE("SIGKILL after " + std::to_string(delay_ms) + " ms");
    ToolProcess run({"preprocess", "-q", "-i", fixture_path("fortunes.jsonl"), "-o", out("corpus"), "-m", model()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    run.signal(SIGKILL);
    run.wait();
    const std::string opened = opens_as(out("corpus"));
    if (opened == "ok") {
      const Pair now = read_pair(out("corpus"));
      EXPECT_TRUE(now == old || now == expected) << "neither the old pair nor the new one";
      (now == old ? old_seen : new_seen) += 1;
    } else {
      // Only a kill between the two renames, a few microseconds wide.
      EXPECT_NE(opened.find("was stopped between renaming the two"), std::string::npos) << opened;
    }
    // Put the old pair back; this run also removes what the killed one left.
    ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
    EXPECT_TRUE(read_pair(out("corpus")) == old);
    EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
  }
  EXPECT_GT(old_seen, 0);
}

// 2. Two writers of one prefix: the second is refused, naming the prefix and the
// first writer's pid, and the first one's output is what remains.
TEST_F(OutputSafety, ASecondWriterOfThePrefixIsRefused) {
  write_fortunes(root_.file("first.jsonl"), 200);
  write_fortunes(root_.file("second.jsonl"), 20);
  ASSERT_EQ(preprocess(root_.file("first.jsonl"), out("expected")).exit_code, 0);
  const Pair expected = read_pair(out("expected"));

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ToolProcess first({"preprocess", "-q", "-i", "-", "-o", out("corpus"), "-m", model()},
                    {.stdin_fd = pipe_fds[0]});
  ::close(pipe_fds[0]);
  // The first writer is under way once its .bin temporary exists.
  ASSERT_TRUE(eventually([&] { return writing_corpus(out_dir()); }));

  const ToolResult second = preprocess(root_.file("second.jsonl"), out("corpus"));
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find("cannot write '" + out("corpus") + "'"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("(pid " + std::to_string(first.pid()) + ")"), std::string::npos) << second.output;
  const ToolResult merge = run_tool({"merge", out("expected"), "-o", out("corpus")});
  EXPECT_EQ(merge.exit_code, 1) << merge.output;

  const std::string input = read_all(root_.file("first.jsonl"));
  ASSERT_EQ(::write(pipe_fds[1], input.data(), input.size()), static_cast<ssize_t>(input.size()));
  ::close(pipe_fds[1]);
  const ToolResult finished = first.wait();
  EXPECT_EQ(finished.exit_code, 0) << finished.output;
  EXPECT_TRUE(read_pair(out("corpus")) == expected);
  EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
}

// In one process too (fcntl locks do not see that): a second writer is refused.
TEST_F(OutputSafety, ASecondWriterInTheSameProcessIsRefused) {
  dataprep::IndexedDatasetWriter first(out("corpus"), dataprep::IndexLayout::kMMIDIDX, dataprep::DType::kUInt16);
  try {
    dataprep::IndexedDatasetWriter second(out("corpus"), dataprep::IndexLayout::kMMIDIDX, dataprep::DType::kUInt16);
    ADD_FAILURE() << "a second writer of the prefix was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("already writing"), std::string::npos) << error.what();
  }
  first.add_document(std::vector<std::int32_t>{1, 2, 3});
  first.commit();
  EXPECT_EQ(opens_as(out("corpus")), "ok");
}

// 4. An output that is also an input is refused, however it is named, and the input
// is left as it was.
TEST_F(OutputSafety, AnOutputThatIsAnInputIsRefused) {
  write_fortunes(root_.file("corpus.jsonl"), 50);
  ASSERT_EQ(preprocess(root_.file("corpus.jsonl"), out("corpus")).exit_code, 0);
  const Pair before = read_pair(out("corpus"));
  fs::create_hard_link(out("corpus.bin"), root_.file("linked.txt"));
  const std::vector<std::pair<std::string, std::string>> cases{
      {out("corpus.bin"), out("corpus")},   // the reported case: -i X.bin -o X
      {out("corpus.idx"), out("corpus")},
      {root_.file("linked.txt"), out("corpus")},  // a hard link: same inode
      {out("../out/corpus.bin"), out("corpus")},
  };
  for (const auto& [input, prefix] : cases) {
    SCOPED_TRACE(input);
    const ToolResult result = preprocess(input, prefix, {}, {"--stdin-format", "txt"});
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("is the output '" + out("corpus.")), std::string::npos) << result.output;
  }
  const ToolResult from_stdin = preprocess("-", out("corpus"), {.stdin_path = out("corpus.bin")}, {"--stdin-format", "txt"});
  EXPECT_EQ(from_stdin.exit_code, 1) << from_stdin.output;
  EXPECT_NE(from_stdin.output.find("standard input"), std::string::npos) << from_stdin.output;
  const ToolResult merge = run_tool({"merge", out("corpus"), "-o", out("corpus")});
  EXPECT_EQ(merge.exit_code, 1) << merge.output;
  EXPECT_NE(merge.output.find("is the output"), std::string::npos) << merge.output;
  EXPECT_TRUE(read_pair(out("corpus")) == before);
  EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
}

// 9. SIGINT and SIGTERM remove the temporaries and the lock file, and the old pair
// stays; the process still ends by the signal.
TEST_F(OutputSafety, SigintAndSigtermLeaveNothingBehind) {
  write_fortunes(root_.file("old.jsonl"), 30);
  ASSERT_EQ(preprocess(root_.file("old.jsonl"), out("corpus")).exit_code, 0);
  const Pair old = read_pair(out("corpus"));
  for (const int signal_number : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(signal_number);
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    ToolProcess run({"preprocess", "-q", "-i", "-", "-o", out("corpus"), "-m", model()},
                    {.stdin_fd = pipe_fds[0]});
    ::close(pipe_fds[0]);
    ASSERT_TRUE(eventually([&] { return writing_corpus(out_dir()); })) << "the run never started writing";
    run.signal(signal_number);
    const ToolResult result = run.wait();
    ::close(pipe_fds[1]);
    EXPECT_EQ(result.exit_code, 128 + signal_number) << result.output;
    EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
    EXPECT_TRUE(read_pair(out("corpus")) == old);
  }
}

// 9. What SIGKILL leaves (temporaries named after a dead pid, the lock file) is removed
// by the next run of the same prefix; temporaries of live processes are not touched.
TEST_F(OutputSafety, TheNextRunRemovesWhatKilledRunsLeft) {
  write_fortunes(root_.file("corpus.jsonl"), 30);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ToolProcess killed({"preprocess", "-q", "-i", "-", "-o", out("corpus"), "-m", model()},
                     {.stdin_fd = pipe_fds[0]});
  ::close(pipe_fds[0]);
  ASSERT_TRUE(eventually([&] { return writing_corpus(out_dir()); }));
  killed.signal(SIGKILL);
  killed.wait();
  ::close(pipe_fds[1]);
  ASSERT_FALSE(leftovers(out_dir()).empty()) << "SIGKILL cannot be caught: something must be left";

  // A leftover of an earlier process (pid 1 never writes here, but is alive: keep),
  // and idx/marker temporaries of the killed one. The marker is itself hidden
  // (.corpus.replacing), so its temporary starts with two dots; SIGKILL while it was
  // written left one that no later run removed.
  const std::string live = ".corpus.bin.tmp.1.0";
  write_all(out(live), "live");
  write_all(out(".corpus.idx.tmp." + std::to_string(killed.pid()) + ".3"), "dead");
  write_all(out("..corpus.replacing.tmp." + std::to_string(killed.pid()) + ".4"), "dead");
  write_all(out(".other.bin.tmp." + std::to_string(killed.pid()) + ".5"), "another prefix");

  const ToolResult next = preprocess(root_.file("corpus.jsonl"), out("corpus"));
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_EQ(opens_as(out("corpus")), "ok");
  std::vector<std::string> expected_left{".other.bin.tmp." + std::to_string(killed.pid()) + ".5", live};
  std::vector<std::string> left = leftovers(out_dir());
  std::sort(left.begin(), left.end());
  std::sort(expected_left.begin(), expected_left.end());
  EXPECT_EQ(left, expected_left);
}

// train-tokenizer's temporaries (sentencepiece writes .NAME.tmp.PID.model/.vocab)
// left by a killed run are removed by the next run; a live process's are kept.
TEST_F(OutputSafety, TrainTokenizerRemovesTemporariesOfDeadRuns) {
  write_fortunes(root_.file("corpus.jsonl"), 300);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  write_all(out(".tok.tmp." + std::to_string(dead) + ".model"), "dead");
  write_all(out(".tok.tmp." + std::to_string(dead) + ".vocab"), "dead");
  write_all(out(".tok.tmp.1.model"), "live");
  const ToolResult trained = run_tool({"train-tokenizer", "-i", root_.file("corpus.jsonl"), "-o", out("tok"),
                                       "--vocab-size", "200", "--model-type", "bpe"});
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_TRUE(file_exists(out("tok.model")));
  EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{".tok.tmp.1.model"});
}

// Output prefixes that name no file are refused before anything is written.
TEST_F(OutputSafety, AnOutputPrefixWithoutAFileNameIsRefused) {
  write_fortunes(root_.file("corpus.jsonl"), 5);
  for (const std::string& prefix : {out_dir() + "/", out_dir() + "/.", out_dir() + "/.."}) {
    SCOPED_TRACE(prefix);
    const ToolResult result = preprocess(root_.file("corpus.jsonl"), prefix);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("does not end in a file name"), std::string::npos) << result.output;
    EXPECT_TRUE(fs::is_empty(out_dir()));
  }
  const ToolResult merge = run_tool({"merge", out("x"), "-o", out_dir() + "/"});
  EXPECT_EQ(merge.exit_code, 1) << merge.output;
  // Nor is a prefix whose .bin is a directory (an exchange would only set it aside).
  fs::create_directories(out("corpus.bin"));
  const ToolResult directory = preprocess(root_.file("corpus.jsonl"), out("corpus"));
  EXPECT_EQ(directory.exit_code, 1) << directory.output;
  EXPECT_NE(directory.output.find(out("corpus.bin") + "': it is a directory"), std::string::npos) << directory.output;
  EXPECT_TRUE(fs::is_directory(out("corpus.bin")));
  EXPECT_EQ(leftovers(out_dir()), std::vector<std::string>{});
}

}  // namespace
}  // namespace dufu::testing
