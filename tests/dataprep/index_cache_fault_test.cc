// What `dataprep build-index` promises about the index caches it writes (issue 15),
// tested the way it breaks: a full disk (RLIMIT_FSIZE) at many sizes and SIGKILL at
// many moments while it builds the caches of a new blend next to those of an older
// one. Afterwards the older caches are byte-equal, the new blend's caches are either
// absent or complete and equal to an undisturbed build, and the next run finishes
// them and leaves nothing behind: no temporary directories, no lock files.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.h"
#include "support/tool_runner.h"
#include "tool_process.h"

namespace dufu::testing {
namespace {

namespace fs = std::filesystem;

// Relative path -> bytes of every file under `dir`.
using Snapshot = std::map<std::string, std::string>;

Snapshot snapshot(const std::string& dir) {
  Snapshot files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[fs::relative(entry.path(), dir).string()] = read_all(entry.path().string());
  }
  return files;
}

// The entries of the cache directory itself a finished run must not leave: the
// temporaries of a build (".tmp-KEY-XXXXXX") and the lock files of keys (KEY.lock).
std::vector<std::string> leftovers(const std::string& cache_dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(cache_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || entry.path().extension() == ".lock") found.push_back(name);
  }
  return found;
}

// `snapshot` without the files of `older` (which must be in it, byte-equal).
Snapshot without(const Snapshot& all, const Snapshot& older) {
  Snapshot rest = all;
  for (const auto& [path, bytes] : older) {
    const auto found = rest.find(path);
    EXPECT_TRUE(found != rest.end() && found->second == bytes) << "an older cache file changed: " << path;
    if (found != rest.end()) rest.erase(found);
  }
  return rest;
}

// The files of the complete key directories in `files`: a key directory counts once
// its "done" marker is there (the rename that publishes it carries the marker). A
// temporary directory (".tmp-<key>-XXXXXX") is not published even when it holds the
// marker: a kill between writing the marker and the rename leaves one so, and the
// next run removes it (expect_recovery checks for leftovers).
Snapshot complete_keys(const Snapshot& files) {
  Snapshot complete;
  for (const auto& [path, bytes] : files) {
    const std::string key = fs::path(path).begin()->string();
    if (key.starts_with(".tmp-")) continue;
    if (files.contains(key + "/done")) complete[path] = bytes;
  }
  return complete;
}

class IndexCacheFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two shards, so that the blend's own caches are built too.
    for (const char* name : {"a", "b"}) {
      const ToolResult made = run_tool({"preprocess", "-q", "-j", "1", "-i", fixture_path("fortunes.jsonl"), "-o",
                                        root_.file(name), "-m", fixture_path("fortunes.model")});
      ASSERT_EQ(made.exit_code, 0) << made.output;
    }
    ASSERT_EQ(build_index(cache_dir(), "1").exit_code, 0);
    older_ = snapshot(cache_dir());
    ASSERT_FALSE(older_.empty());
    // What the new blend's caches are when nothing disturbs their build.
    const auto start = std::chrono::steady_clock::now();
    const ToolResult reference = build_index(root_.file("reference-cache"), "2");
    reference_run_ = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    ASSERT_EQ(reference.exit_code, 0) << reference.output;
    expected_ = snapshot(root_.file("reference-cache"));
    // Caches both blends share (none today) are older caches, not new ones.
    for (const auto& [path, bytes] : older_) {
      if (expected_.contains(path) && expected_.at(path) == bytes) expected_.erase(path);
    }
    for (const auto& [path, bytes] : expected_) largest_ = std::max<rlim_t>(largest_, bytes.size());
  }

  std::string cache_dir() const { return root_.file("cache"); }

  ToolResult build_index(const std::string& cache, const std::string& seed, const ToolOptions& options = {}) {
    ToolProcess run(arguments(cache, seed), options);
    return run.wait();
  }

  std::vector<std::string> arguments(const std::string& cache, const std::string& seed) const {
    return {"build-index", "-d",          "0.6 " + root_.file("a") + " 0.4 " + root_.file("b"),
            "--seq-length", "16",         "--num-samples",
            "1000000",        "--seed",     seed,
            "--cache-dir",  cache};
  }

  // After any failure: the older caches are untouched and what the new blend left
  // complete is complete and right. Then the next run finishes the new caches equal
  // to the reference and leaves nothing behind.
  void expect_recovery(const std::string& what) {
    SCOPED_TRACE(what);
    const Snapshot after = without(snapshot(cache_dir()), older_);
    for (const auto& [path, bytes] : complete_keys(after)) {
      EXPECT_TRUE(expected_.contains(path) && expected_.at(path) == bytes) << "a published cache file is wrong: " << path;
    }
    const ToolResult next = build_index(cache_dir(), "2");
    ASSERT_EQ(next.exit_code, 0) << next.output;
    EXPECT_TRUE(without(snapshot(cache_dir()), older_) == expected_) << "the next run's caches differ";
    EXPECT_EQ(leftovers(cache_dir()), std::vector<std::string>{});
    // Back to only the older caches for the next case.
    for (const auto& entry : fs::directory_iterator(cache_dir())) {
      if (!older_.contains(entry.path().filename().string() + "/done")) fs::remove_all(entry.path());
    }
    ASSERT_TRUE(snapshot(cache_dir()) == older_);
  }

  TempDir root_;
  Snapshot older_, expected_;
  rlim_t largest_ = 0;
  std::chrono::milliseconds reference_run_{0};
};

TEST_F(IndexCacheFaults, AFailedWriteAtAnySizeKeepsTheOlderCachesAndLeavesNothing) {
  ASSERT_GT(largest_, 100000u) << "the blend no longer makes a large cache file";
  int failures = 0;
  for (const rlim_t limit : {rlim_t{0}, rlim_t{1}, rlim_t{80}, rlim_t{128}, rlim_t{4096}, largest_ / 3,
                             largest_ / 2, largest_ - 1, largest_, largest_ + 1}) {
    const ToolResult result = build_index(cache_dir(), "2", {.file_size_limit = limit});
    if (result.exit_code != 0) {
      ++failures;
      EXPECT_EQ(result.exit_code, 1) << result.output;
      EXPECT_NE(result.output.find("File too large"), std::string::npos) << result.output;
      // A failure removes its own temporaries and lock files before it exits.
      EXPECT_EQ(leftovers(cache_dir()), std::vector<std::string>{}) << result.output;
    }
    expect_recovery("file size limit " + std::to_string(limit));
  }
  EXPECT_GE(failures, 8);
}

// The kills are spread over the time an undisturbed build takes, so most of them land
// in the middle of one: between the caches of the blend, or inside one.
TEST_F(IndexCacheFaults, SigkillAtAnyMomentKeepsTheOlderCachesAndTheNextRunFinishes) {
  int unfinished = 0;
  for (int tenth = 0; tenth <= 10; ++tenth) {
    const auto delay = reference_run_ * tenth / 10;
    ToolProcess run(arguments(cache_dir(), "2"));
    std::this_thread::sleep_for(delay);
    run.signal(SIGKILL);
    run.wait();
    if (without(snapshot(cache_dir()), older_) != expected_) ++unfinished;
    expect_recovery("SIGKILL after " + std::to_string(delay.count()) + " ms");
  }
  EXPECT_GE(unfinished, 3) << "too few kills landed during a build";
}

}  // namespace
}  // namespace dufu::testing
