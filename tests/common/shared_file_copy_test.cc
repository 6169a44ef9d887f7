// SharedFileCopy: one node-wide copy per file, visible to other processes, removed
// with its last user, and not kept alive by users that crashed.
#include "dufu/common/shared_file_copy.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "dufu/common/error.h"
#include "support/fork_child.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using testing::SignalPipe;
using testing::start_child;
using testing::TempDir;
using testing::wait_child;

bool segment_exists(const std::string& name) { return std::filesystem::exists("/dev/shm/" + name); }
bool lock_file_exists(const std::string& name) { return std::filesystem::exists("/dev/shm/" + name + ".lock"); }

std::string contents(const SharedFileCopy& copy) {
  return {reinterpret_cast<const char*>(copy.data()), static_cast<std::size_t>(copy.size())};
}

TEST(SharedFileCopy, HoldsTheFileAndIsRemovedWithItsLastUser) {
  TempDir dir;
  testing::write_all(dir.file("shard.bin"), "0123456789abcdef");
  std::string name;
  {
    auto first = SharedFileCopy::open(dir.file("shard.bin"));
    name = first.segment_name();
    EXPECT_EQ(contents(first), "0123456789abcdef");
    EXPECT_TRUE(segment_exists(name));
    {
      const auto second = SharedFileCopy::open(dir.file("shard.bin"));
      EXPECT_EQ(second.segment_name(), name);
      EXPECT_EQ(second.users(), 2U);
      // One copy: both attachments see the same bytes, not two loads.
      EXPECT_EQ(contents(second), contents(first));
    }
    EXPECT_TRUE(segment_exists(name));
    EXPECT_EQ(first.users(), 1U);
  }
  EXPECT_FALSE(segment_exists(name));
  EXPECT_FALSE(lock_file_exists(name)) << "lock files pile up in /dev/shm";
}

TEST(SharedFileCopy, OtherProcessesShareItAndCrashedUsersStopCounting) {
  TempDir dir;
  testing::write_all(dir.file("shard.bin"), std::string(100000, 'x') + "end");
  auto copy = SharedFileCopy::open(dir.file("shard.bin"));
  SignalPipe ready;
  SignalPipe release;
  const pid_t child = start_child([&] {
    int status = 3;
    try {
      // Deliberately never destroyed: the child "crashes" while attached.
      auto* leaked = new SharedFileCopy(SharedFileCopy::open(dir.file("shard.bin")));
      status = (leaked->segment_name() == copy.segment_name() && contents(*leaked) == contents(copy)) ? 0 : 2;
    } catch (...) {
    }
    ready.send(static_cast<char>(status));
    release.receive();
    return status;
  });
  ASSERT_GE(child, 0);
  ready.close_write();  // a child that dies early then reads as end of file
  char byte = 0;
  ASSERT_TRUE(ready.receive(byte));
  EXPECT_EQ(byte, 0) << "the child did not see the same copy";
  EXPECT_EQ(copy.users(), 2U);
  ASSERT_TRUE(release.send());
  ASSERT_GE(wait_child(child), 0);
  EXPECT_EQ(copy.users(), 1U);
  const std::string name = copy.segment_name();
  copy = SharedFileCopy::open(dir.file("shard.bin"));  // re-attach, then the old one detaches
  EXPECT_EQ(copy.users(), 1U);
  { SharedFileCopy gone = std::move(copy); }
  EXPECT_FALSE(segment_exists(name));
}

TEST(SharedFileCopy, AChangedFileGetsANewCopy) {
  TempDir dir;
  testing::write_all(dir.file("shard.bin"), "version one");
  const auto first = SharedFileCopy::open(dir.file("shard.bin"));
  testing::write_all(dir.file("shard.bin"), "version two, longer");
  const auto second = SharedFileCopy::open(dir.file("shard.bin"));
  EXPECT_NE(first.segment_name(), second.segment_name());
  EXPECT_EQ(contents(first), "version one");
  EXPECT_EQ(contents(second), "version two, longer");
}

TEST(SharedFileCopy, EmptyFileAndMissingFile) {
  TempDir dir;
  testing::write_all(dir.file("empty.bin"), "");
  const auto empty = SharedFileCopy::open(dir.file("empty.bin"));
  EXPECT_EQ(empty.size(), 0U);
  try {
    SharedFileCopy::open(dir.file("missing.bin"));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("missing.bin"), std::string::npos) << error.what();
  }
}

// A copy whose every user was killed (nobody left to detach) is removed, with its lock
// file, by the next process that opens any shared copy.
TEST(SharedFileCopy, CopiesOfKilledUsersAreReclaimed) {
  TempDir dir;
  testing::write_all(dir.file("killed.bin"), std::string(50000, 'k'));
  testing::write_all(dir.file("other.bin"), "other");
  SignalPipe named;
  const pid_t child = start_child([&] {
    const auto* copy = new SharedFileCopy(SharedFileCopy::open(dir.file("killed.bin")));
    const std::string& name = copy->segment_name();
    for (const char c : name) named.send(c);
    named.send('\n');
    ::raise(SIGKILL);  // killed while attached
    return 2;
  });
  named.close_write();
  std::string name;
  for (char c = 0; named.receive(c) && c != '\n';) name += c;
  EXPECT_EQ(wait_child(child), 128 + SIGKILL);
  ASSERT_FALSE(name.empty());
  ASSERT_TRUE(segment_exists(name)) << "the killed user did not leave its copy";

  const auto other = SharedFileCopy::open(dir.file("other.bin"));
  EXPECT_FALSE(segment_exists(name)) << "the killed user's copy outlives it";
  EXPECT_FALSE(lock_file_exists(name));
  EXPECT_TRUE(segment_exists(other.segment_name()));
}

}  // namespace
}  // namespace dufu
