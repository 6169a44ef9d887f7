// Tests for FileLock. fcntl locks belong to a process, so exclusion can only be seen
// from another process: each test forks a child that reports through its exit code.
#include "dufu/common/file_lock.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/fork_child.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using dufu::testing::file_exists;
using dufu::testing::run_in_child;
using dufu::testing::SignalPipe;
using dufu::testing::start_child;
using dufu::testing::TempDir;
using dufu::testing::wait_child;

// 0 = lock was busy, 1 = lock acquired.
int child_try_lock(const std::string& path) {
  return run_in_child([&] { return FileLock::try_lock(path) == nullptr ? 0 : 1; });
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
  SignalPipe ready;
  SignalPipe done;
  const pid_t child = start_child([&] {
    FileLock lock(path);
    if (!ready.send()) return 2;
    if (!done.receive()) return 3;
    return 0;
  });
  ASSERT_GE(child, 0);
  ASSERT_TRUE(ready.receive());
  EXPECT_EQ(FileLock::try_lock(path), nullptr);
  ASSERT_TRUE(done.send());
  EXPECT_EQ(wait_child(child), 0);
  // The child's exit released it.
  EXPECT_NE(FileLock::try_lock(path), nullptr);
}

TEST(FileLock, BlockingLockWaitsForRelease) {
  TempDir dir;
  const std::string path = dir.file("cache.lock");
  const std::string marker = dir.file("released");
  auto lock = std::make_unique<FileLock>(path);
  const pid_t child = start_child([&] {
    FileLock waiting(path);
    // The parent creates the marker before it releases, so it must exist by now.
    return file_exists(marker) ? 0 : 1;
  });
  ASSERT_GE(child, 0);
  // Give the child time to reach the blocking lock call.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  testing::write_all(marker, "");
  lock.reset();
  EXPECT_EQ(wait_child(child), 0) << "child got the lock before the parent released it";
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

// remove_file_on_unlock: the file goes with the lock, and a process that was waiting
// on the removed file starts over on a new one, so the lock still excludes.
TEST(FileLock, RemovedLockFilesDoNotPileUpAndStillExclude) {
  TempDir dir;
  const std::string path = dir.file("out.lock");
  auto lock = std::make_unique<FileLock>(path);
  lock->remove_file_on_unlock();
  SignalPipe holding;
  SignalPipe done;
  const pid_t child = start_child([&] {
    FileLock waiting(path);  // opens the file that is about to be removed, and blocks
    if (!holding.send()) return 2;
    return done.receive() ? 0 : 3;
  });
  ASSERT_GE(child, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  lock.reset();
  ASSERT_TRUE(holding.receive());
  // The child must hold the lock on what `path` names now, not on the removed file.
  EXPECT_EQ(FileLock::try_lock(path), nullptr);
  EXPECT_EQ(FileLock::holder_pid(path), child);
  ASSERT_TRUE(done.send());
  EXPECT_EQ(wait_child(child), 0);
  EXPECT_EQ(FileLock::holder_pid(path), 0);

  {
    auto again = FileLock::try_lock(path);
    ASSERT_NE(again, nullptr);
    again->remove_file_on_unlock();
    EXPECT_TRUE(file_exists(path));
  }
  EXPECT_FALSE(file_exists(path));
  EXPECT_TRUE(dir.list().empty());
}

// holder_pid names the holder; asking about a lock this process holds must not drop
// it (closing any descriptor of the file would).
TEST(FileLock, HolderPidNamesTheHolderAndKeepsOwnLocks) {
  TempDir dir;
  EXPECT_EQ(FileLock::holder_pid(dir.file("missing.lock")), 0);
  const FileLock mine(dir.file("mine.lock"));
  EXPECT_EQ(FileLock::holder_pid(dir.file("mine.lock")), ::getpid());
  EXPECT_EQ(child_try_lock(dir.file("mine.lock")), 0) << "holder_pid dropped this process's lock";
  EXPECT_EQ(run_in_child([&] { return FileLock::holder_pid(dir.file("mine.lock")) == ::getppid() ? 0 : 1; }), 0);
}

}  // namespace
}  // namespace dufu
