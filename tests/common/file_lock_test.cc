// Tests for FileLock. fcntl locks belong to a process, so exclusion can only be seen
// from another process: each test forks a child that reports through its exit code.
#include "dufu/common/file_lock.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using dufu::testing::TempDir;

using dufu::testing::file_exists;

// Runs body in a child process and returns its exit code (or -1 if it crashed).
int in_child(const std::function<int()>& body) {
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// 0 = lock was busy, 1 = lock acquired.
int child_try_lock(const std::string& path) {
  return in_child([&] { return FileLock::try_lock(path) == nullptr ? 0 : 1; });
}

TEST(FileLock, CreatesMissingLockFile) {
  TempDir dir;
  const std::string path = dir.file("cache.lock");
  ASSERT_FALSE(file_exists(path));
  FileLock lock(path);
  EXPECT_TRUE(file_exists(path));
}

TEST(FileLock, TryLockSucceedsWhenFree) {
  TempDir dir;
  auto lock = FileLock::try_lock(dir.file("cache.lock"));
  EXPECT_NE(lock, nullptr);
  EXPECT_TRUE(file_exists(dir.file("cache.lock")));
}

TEST(FileLock, OtherProcessCannotTakeHeldLock) {
  TempDir dir;
  const std::string path = dir.file("cache.lock");
  {
    FileLock lock(path);
    EXPECT_EQ(child_try_lock(path), 0);
  }
  // Released by the destructor: now the child gets it.
  EXPECT_EQ(child_try_lock(path), 1);
}

TEST(FileLock, TryLockHolderAlsoExcludesOthers) {
  TempDir dir;
  const std::string path = dir.file("cache.lock");
  auto lock = FileLock::try_lock(path);
  ASSERT_NE(lock, nullptr);
  EXPECT_EQ(child_try_lock(path), 0);
  lock.reset();
  EXPECT_EQ(child_try_lock(path), 1);
}

TEST(FileLock, ChildHoldingLockExcludesParent) {
  TempDir dir;
  const std::string path = dir.file("cache.lock");
  int ready[2];
  int done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileLock lock(path);
    char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    if (::read(done[0], &c, 1) != 1) ::_exit(3);
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(FileLock::try_lock(path), nullptr);
  ASSERT_EQ(::write(done[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // The child's exit released it.
  EXPECT_NE(FileLock::try_lock(path), nullptr);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
}

TEST(FileLock, BlockingLockWaitsForRelease) {
  TempDir dir;
  const std::string path = dir.file("cache.lock");
  const std::string marker = dir.file("released");
  auto lock = std::make_unique<FileLock>(path);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileLock waiting(path);
    // The parent creates the marker before it releases, so it must exist by now.
    ::_exit(file_exists(marker) ? 0 : 1);
  }
  // Give the child time to reach the blocking lock call.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  testing::write_all(marker, "");
  lock.reset();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child got the lock before the parent released it";
}

TEST(FileLock, MissingDirectoryThrowsWithPath) {
  TempDir dir;
  const std::string path = dir.file("missing/cache.lock");
  for (int blocking = 0; blocking < 2; ++blocking) {
    try {
      if (blocking) {
        FileLock lock(path);
      } else {
        FileLock::try_lock(path);
      }
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + path + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace dufu
