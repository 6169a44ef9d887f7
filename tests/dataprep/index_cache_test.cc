// Tests of IndexCache on its own: one build per description, the stored description
// and format version checked on every hit, failed or interrupted builds leaving
// nothing a later run would trust, and one build when threads or processes race.
#include "dufu/dataprep/index_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/expect_error.h"
#include "support/fork_child.h"
#include "support/temp_dir.h"
#include "dufu/common/error.h"
#include "dufu/common/file_lock.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;

namespace fs = std::filesystem;

using dufu::testing::TempDir;


// A build that writes one file and counts how often it ran.
std::function<void(const std::string&)> counting_build(std::atomic<int>& builds, const std::string& content = "x") {
  return [&builds, content](const std::string& temp_dir) {
    ++builds;
    dufu::testing::write_all(temp_dir + "/data.bin", content);
  };
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

TEST(IndexCacheTest, BuildsOnceAndThenFindsTheCache) {
  TempDir dir;
  const IndexCache cache(dir.file("cache"));
  std::atomic<int> builds{0};
  EXPECT_EQ(cache.find("inputs A\n"), "");
  const std::string path = cache.get_or_build("inputs A\n", counting_build(builds));
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(path.rfind(cache.directory() + "/", 0), 0u) << path;
  EXPECT_EQ(fs::path(path).filename().string().size(), 32u);  // 128 bits of SHA-256, hex
  EXPECT_EQ(dufu::testing::read_all(path + "/description.txt"), "inputs A\n");
  EXPECT_EQ(dufu::testing::read_all(path + "/data.bin"), "x");
  EXPECT_TRUE(dufu::testing::file_exists(path + "/done"));

  EXPECT_EQ(cache.get_or_build("inputs A\n", counting_build(builds)), path);
  EXPECT_EQ(cache.find("inputs A\n"), path);
  EXPECT_EQ(IndexCache(dir.file("cache")).get_or_build("inputs A\n", counting_build(builds)), path);
  EXPECT_EQ(builds, 1);

  const std::string other = cache.get_or_build("inputs B\n", counting_build(builds));
  EXPECT_NE(other, path);
  EXPECT_EQ(builds, 2);
}

TEST(IndexCacheTest, CreatesItsDirectoryAndRefusesAFileInItsPlace) {
  TempDir dir;
  const IndexCache nested(dir.file("a/b/c"));
  EXPECT_TRUE(fs::is_directory(dir.file("a/b/c")));
  dufu::testing::write_all(dir.file("plain"), "");
  expect_error([&] { IndexCache{dir.file("plain")}; }, {dir.file("plain")});
}

TEST(IndexCacheTest, AMismatchedDescriptionIsACollisionOrCorruption) {
  TempDir dir;
  const IndexCache cache(dir.file("cache"));
  std::atomic<int> builds{0};
  const std::string path = cache.get_or_build("inputs A\n", counting_build(builds));
  dufu::testing::write_all(path + "/description.txt", "something else\n");
  expect_error([&] { cache.get_or_build("inputs A\n", counting_build(builds)); },
               {"cache collision or corruption in", path});
  expect_error([&] { cache.find("inputs A\n"); }, {"cache collision or corruption in", path});
  EXPECT_EQ(builds, 1);
}

TEST(IndexCacheTest, AnotherFormatVersionIsAClearError) {
  TempDir dir;
  const IndexCache cache(dir.file("cache"));
  std::atomic<int> builds{0};
  const std::string path = cache.get_or_build("inputs A\n", counting_build(builds));
  const std::string marker = dufu::testing::read_all(path + "/done");
  EXPECT_EQ(marker, "dufu index cache format v" + std::to_string(kIndexCacheFormatVersion) + "\n");
  dufu::testing::write_all(path + "/done", "dufu index cache format v" +
                                               std::to_string(kIndexCacheFormatVersion + 1) + "\n");
  expect_error([&] { cache.get_or_build("inputs A\n", counting_build(builds)); },
               {path, "another cache format", "v" + std::to_string(kIndexCacheFormatVersion + 1),
                "reads v" + std::to_string(kIndexCacheFormatVersion), "delete"});
  EXPECT_EQ(builds, 1);
}

TEST(IndexCacheTest, AFailedBuildLeavesNothingBehind) {
  TempDir dir;
  const IndexCache cache(dir.file("cache"));
  expect_error(
      [&] {
        cache.get_or_build("inputs A\n", [](const std::string& temp_dir) {
          dufu::testing::write_all(temp_dir + "/half", "written");
          DUFU_FAIL("disk full");
        });
      },
      {"disk full"});
  // Not even the key's lock file: lock files do not pile up.
  for (const auto& name : entries(cache.directory())) ADD_FAILURE() << "leftover " << name;
  std::atomic<int> builds{0};
  const std::string path = cache.get_or_build("inputs A\n", counting_build(builds));
  EXPECT_EQ(builds, 1);
  EXPECT_FALSE(dufu::testing::file_exists(path + "/half"));
}

TEST(IndexCacheTest, LeftoversOfAnInterruptedBuildAreRebuilt) {
  TempDir dir;
  const IndexCache cache(dir.file("cache"));
  std::atomic<int> builds{0};
  const std::string path = cache.get_or_build("inputs A\n", counting_build(builds));
  // A key directory without its marker, and a temporary of the same key: what a
  // build killed mid-way (or a careless manual copy) leaves.
  fs::remove(path + "/done");
  const std::string key = fs::path(path).filename().string();
  fs::create_directory(cache.directory() + "/.tmp-" + key + "-abcdef");
  EXPECT_EQ(cache.find("inputs A\n"), "");
  EXPECT_EQ(cache.get_or_build("inputs A\n", counting_build(builds, "y")), path);
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(dufu::testing::read_all(path + "/data.bin"), "y");
  EXPECT_FALSE(dufu::testing::file_exists(cache.directory() + "/.tmp-" + key + "-abcdef"));
}

// A build killed between publishing its key and unlinking the key's lock file leaves
// the file; the key's next user removes it (unless another process holds it), else
// later runs, which take the lock-free fast path, would never.
TEST(IndexCacheTest, AStaleLockFileOfAPublishedKeyGoesAndAHeldOneStays) {
  TempDir dir;
  const IndexCache cache(dir.file("cache"));
  std::atomic<int> builds{0};
  const std::string path = cache.get_or_build("inputs A\n", counting_build(builds));
  const std::string lock_path = path + ".lock";
  dufu::testing::write_all(lock_path, "");
  dufu::testing::SignalPipe ready, done;
  const pid_t holder = dufu::testing::start_child([&] {
    FileLock lock(lock_path);
    if (!ready.send()) return 2;
    return done.receive() ? 0 : 3;
  });
  ASSERT_GE(holder, 0);
  ASSERT_TRUE(ready.receive());
  EXPECT_EQ(cache.get_or_build("inputs A\n", counting_build(builds)), path);
  EXPECT_TRUE(dufu::testing::file_exists(lock_path)) << "a lock file another process holds was removed";
  ASSERT_TRUE(done.send());
  EXPECT_EQ(dufu::testing::wait_child(holder), 0);
  // The holder died without unlinking it: stale now.
  EXPECT_EQ(cache.get_or_build("inputs A\n", counting_build(builds)), path);
  EXPECT_FALSE(dufu::testing::file_exists(lock_path)) << "the stale lock file stayed";
  EXPECT_EQ(builds, 1);
}

TEST(IndexCacheTest, ThreadsOfOneProcessBuildOnce) {
  TempDir dir;
  std::atomic<int> builds{0};
  std::vector<std::string> paths(6);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < paths.size(); ++t) {
    threads.emplace_back([&, t] {
      const IndexCache cache(dir.file("cache"));
      paths[t] = cache.get_or_build("inputs A\n", [&](const std::string& temp_dir) {
        ++builds;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        dufu::testing::write_all(temp_dir + "/data.bin", "x");
      });
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(builds, 1);
  for (const auto& path : paths) EXPECT_EQ(path, paths[0]);
}

TEST(IndexCacheTest, ProcessesRacingOnOneKeyBuildOnce) {
  TempDir dir;
  const std::string cache_dir = dir.file("cache");
  const std::string log = dir.file("builds.log");
  const std::vector<int> exit_codes = dufu::testing::race_children(3, [&](int) {
    const IndexCache cache(cache_dir);
    const std::string path = cache.get_or_build("inputs A\n", [&](const std::string& temp_dir) {
      // O_APPEND: each build adds one line however the processes interleave.
      const int fd = ::open(log.c_str(), O_CREAT | O_WRONLY | O_APPEND, 0644);
      if (fd < 0 || ::write(fd, "built\n", 6) != 6) throw std::runtime_error("log");
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      dufu::testing::write_all(temp_dir + "/data.bin", "x");
    });
    return dufu::testing::read_all(path + "/data.bin") == "x" ? 0 : 4;
  });
  for (const int code : exit_codes) EXPECT_EQ(code, 0) << "child exit code";
  EXPECT_EQ(dufu::testing::read_all(log), "built\n");
  int key_dirs = 0;
  for (const auto& name : entries(cache_dir)) {
    EXPECT_NE(name.rfind(".tmp", 0), 0u) << "leftover temporary " << name;
    EXPECT_EQ(name.find(".lock"), std::string::npos) << "leftover lock file " << name;
    key_dirs += fs::is_directory(cache_dir + "/" + name) ? 1 : 0;
  }
  EXPECT_EQ(key_dirs, 1);
}

TEST(IndexCacheTest, FileIdentityNamesPathSizeAndModificationTime) {
  TempDir dir;
  const std::string file = dir.file("data.bin");
  dufu::testing::write_all(file, "12345");
  const std::string identity = file_identity(file);
  EXPECT_NE(identity.find(fs::absolute(file).lexically_normal().string()), std::string::npos) << identity;
  EXPECT_NE(identity.find("size=5"), std::string::npos) << identity;
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(1));
  EXPECT_NE(file_identity(file), identity);
  expect_error([&] { file_identity(dir.file("missing")); }, {dir.file("missing")});
}

// Sets an environment variable for one scope and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(IndexCacheTest, DefaultDirectoryFollowsTheEnvironment) {
  {
    ScopedEnv cache("DUFU_CACHE_DIR", "/some/cache");
    EXPECT_EQ(default_index_cache_dir(), "/some/cache");
  }
  ScopedEnv cache("DUFU_CACHE_DIR", nullptr);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(default_index_cache_dir(), "/xdg/dufu");
  }
  ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
  ScopedEnv home("HOME", "/home/someone");
  EXPECT_EQ(default_index_cache_dir(), "/home/someone/.cache/dufu");
}

}  // namespace
}  // namespace dufu::dataprep
