// Tests for AtomicFile: the final name appears only on commit, with exactly the bytes
// written, and every other ending leaves the directory as it was.
#include "dufu/common/atomic_file.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/fork_child.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using dufu::testing::file_exists;
using dufu::testing::run_in_child;
using dufu::testing::TempDir;

// Bytes whose values depend on their position, so a dropped or repeated chunk shows.
std::string pattern(std::size_t size, std::uint32_t seed) {
  std::string bytes(size, '\0');
  std::uint32_t x = seed;
  for (auto& c : bytes) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return bytes;
}

TEST(AtomicFile, FinalNameAppearsOnlyOnCommit) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  AtomicFile file(path);
  file.write("hello ", 6);
  file.write_value<std::uint32_t>(0x01020304u);
  EXPECT_EQ(file.bytes_written(), 10u);

  EXPECT_FALSE(file_exists(path));
  EXPECT_TRUE(file_exists(file.temp_path()));
  EXPECT_EQ(dir.list(), (std::set<std::string>{
                            std::filesystem::path(file.temp_path()).filename().string()}));

  file.commit();
  EXPECT_EQ(dir.list(), (std::set<std::string>{"out.bin"}));
  const std::string expected = std::string("hello ") + std::string("\x04\x03\x02\x01", 4);
  EXPECT_EQ(testing::read_all(path), expected);
}

TEST(AtomicFile, TempNameFollowsPattern) {
  TempDir dir;
  AtomicFile file(dir.file("data.idx"));
  const std::string prefix = dir.path() + "/.data.idx.tmp." + std::to_string(::getpid()) + ".";
  EXPECT_EQ(file.temp_path().rfind(prefix, 0), 0u) << file.temp_path();
  EXPECT_EQ(file.final_path(), dir.file("data.idx"));

  AtomicFile second(dir.file("data.idx"));
  EXPECT_NE(second.temp_path(), file.temp_path());
}

TEST(AtomicFile, DestructorWithoutCommitLeavesNothing) {
  TempDir dir;
  {
    AtomicFile file(dir.file("out.bin"));
    file.write("partial", 7);
    const std::string big = pattern(3 << 20, 1);
    file.write(big.data(), big.size());
  }
  EXPECT_TRUE(dir.list().empty());
}

TEST(AtomicFile, DestructorDoesNotReplaceExistingFile) {
  TempDir dir;
  testing::write_all(dir.file("out.bin"), "old contents");
  {
    AtomicFile file(dir.file("out.bin"));
    file.write("new", 3);
  }
  EXPECT_EQ(dir.list(), (std::set<std::string>{"out.bin"}));
  EXPECT_EQ(testing::read_all(dir.file("out.bin")), "old contents");
}

TEST(AtomicFile, CommitReplacesExistingFile) {
  TempDir dir;
  testing::write_all(dir.file("out.bin"), "old contents that are longer");
  AtomicFile file(dir.file("out.bin"));
  file.write("new", 3);
  file.commit();
  EXPECT_EQ(testing::read_all(dir.file("out.bin")), "new");
  EXPECT_EQ(dir.list(), (std::set<std::string>{"out.bin"}));
}

TEST(AtomicFile, DiscardRemovesTemporaryAndForbidsWrites) {
  TempDir dir;
  AtomicFile file(dir.file("out.bin"));
  file.write("abc", 3);
  file.discard();
  EXPECT_TRUE(dir.list().empty());
  EXPECT_THROW(file.write("x", 1), InternalError);
  EXPECT_THROW(file.commit(), InternalError);
  file.discard();  // idempotent
  EXPECT_TRUE(dir.list().empty());
}

TEST(AtomicFile, LargeAndMixedWritesAreExact) {
  TempDir dir;
  const std::string path = dir.file("big.bin");
  // Sizes straddle the 1 MiB buffer: small appends, one exactly buffer-sized block,
  // one far larger, and small ones that force a flush before a direct write.
  const std::size_t sizes[] = {1, 1000, (1u << 20) - 1, 1u << 20, 5, (5u << 20) + 3, 7,
                               (1u << 20) + 1, 0, 12345};
  std::string expected;
  AtomicFile file(path);
  std::uint32_t seed = 0;
  for (const std::size_t size : sizes) {
    const std::string chunk = pattern(size, ++seed);
    file.write(chunk.data(), chunk.size());
    expected += chunk;
  }
  EXPECT_EQ(file.bytes_written(), expected.size());
  file.commit();
  const std::string actual = testing::read_all(path);
  ASSERT_EQ(actual.size(), expected.size());
  EXPECT_TRUE(actual == expected) << "contents differ";
}

TEST(AtomicFile, EmptyCommitCreatesEmptyFile) {
  TempDir dir;
  AtomicFile file(dir.file("empty.bin"));
  file.commit();
  EXPECT_EQ(dir.list(), (std::set<std::string>{"empty.bin"}));
  EXPECT_EQ(testing::read_all(dir.file("empty.bin")), "");
}

TEST(AtomicFile, WriteAfterCommitIsAnError) {
  TempDir dir;
  AtomicFile file(dir.file("out.bin"));
  file.write("a", 1);
  file.commit();
  EXPECT_THROW(file.write("b", 1), InternalError);
  EXPECT_THROW(file.commit(), InternalError);
  EXPECT_EQ(testing::read_all(dir.file("out.bin")), "a");
}

TEST(AtomicFile, CommittedFileSurvivesDestructorAndDiscard) {
  TempDir dir;
  {
    AtomicFile file(dir.file("out.bin"));
    file.write("keep", 4);
    file.commit();
    file.discard();
  }
  EXPECT_EQ(testing::read_all(dir.file("out.bin")), "keep");
}

TEST(AtomicFile, MoveLeavesSourceInert) {
  TempDir dir;
  AtomicFile source(dir.file("out.bin"));
  source.write("moved ", 6);
  const std::string temp = source.temp_path();
  {
    AtomicFile target(std::move(source));
    // Destroying or discarding the source must not touch the target's temporary.
    source.discard();  // NOLINT(bugprone-use-after-move): checking the moved-from state
    EXPECT_TRUE(file_exists(temp));
    EXPECT_THROW(source.write("x", 1), InternalError);
    target.write("bytes", 5);
    EXPECT_EQ(target.temp_path(), temp);
    EXPECT_EQ(target.bytes_written(), 11u);
    target.commit();
  }
  EXPECT_EQ(testing::read_all(dir.file("out.bin")), "moved bytes");
  EXPECT_EQ(dir.list(), (std::set<std::string>{"out.bin"}));
}

TEST(AtomicFile, MissingDirectoryThrowsWithPath) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/out.bin");
  try {
    AtomicFile file(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + path + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
}

TEST(AtomicFile, CommitIntoRemovedDirectoryThrowsWithPath) {
  TempDir dir;
  const std::string sub = dir.file("sub");
  ASSERT_TRUE(std::filesystem::create_directory(sub));
  const std::string path = sub + "/out.bin";
  AtomicFile file(path);
  file.write("data", 4);
  std::filesystem::remove_all(sub);
  try {
    file.commit();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + path + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  EXPECT_FALSE(file_exists(path));
}

TEST(AtomicFile, BareFileNameUsesCurrentDirectory) {
  TempDir dir;
  const auto old_cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  {
    AtomicFile file("plain.txt");
    EXPECT_EQ(file.temp_path().rfind(".plain.txt.tmp.", 0), 0u) << file.temp_path();
    file.write("x", 1);
    file.commit();
  }
  std::filesystem::current_path(old_cwd);
  EXPECT_EQ(testing::read_all(dir.file("plain.txt")), "x");
}

TEST(AtomicFile, ReadOnlyDirectoryErrorNamesPath) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  const std::string sub = dir.file("ro");
  ASSERT_TRUE(std::filesystem::create_directory(sub));
  ASSERT_EQ(::chmod(sub.c_str(), 0555), 0);
  try {
    AtomicFile file(sub + "/out.bin");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + sub + "/out.bin'"), std::string::npos) << what;
    EXPECT_NE(what.find("Permission denied"), std::string::npos) << what;
  }
  ::chmod(sub.c_str(), 0755);
}

// A write that fails part-way (here: the file-size limit, standing in for a full
// disk) must throw naming the final path and leave no file behind. Runs in a child
// because the limit applies to the whole process.
TEST(AtomicFile, FailedWriteThrowsAndLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  const int exit_code = run_in_child([&] {
    int code = 0;
    ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
    const rlimit limit{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
    try {
      AtomicFile file(path);
      const std::string big = pattern(3 << 20, 9);
      file.write(big.data(), big.size());
      file.commit();
      code = 11;  // no error at all
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("'" + path + "'") == std::string::npos) code = 12;
      else if (what.find("File too large") == std::string::npos) code = 13;
    }
    return code;
  });
  ASSERT_TRUE(exit_code >= 0 && exit_code < 128) << "the child did not exit: " << exit_code;
  EXPECT_EQ(exit_code, 0) << "10: setrlimit, 11: no error, 12: no path, 13: no reason";
  EXPECT_TRUE(dir.list().empty());
}

// prepare() does every write that can fail; the temporary then waits for commit()
// (or for the caller, after release()).
TEST(AtomicFile, PrepareWritesEverythingAndCommitOnlyRenames) {
  TempDir dir;
  AtomicFile file(dir.file("out.bin"));
  const std::string bytes = pattern(3 << 20, 5);
  file.write(bytes.data(), 100);
  file.write(bytes.data() + 100, bytes.size() - 100);
  file.prepare();
  EXPECT_THROW(file.write("x", 1), InternalError);
  EXPECT_FALSE(file_exists(dir.file("out.bin")));
  EXPECT_EQ(testing::read_all(file.temp_path()), bytes);
  file.commit();
  EXPECT_EQ(testing::read_all(dir.file("out.bin")), bytes);
  EXPECT_EQ(dir.list(), (std::set<std::string>{"out.bin"}));
}

TEST(AtomicFile, ReleaseHandsTheTemporaryOver) {
  TempDir dir;
  std::string temp;
  {
    AtomicFile file(dir.file("out.bin"));
    file.write("mine", 4);
    file.prepare();
    temp = file.temp_path();
    file.release();
  }
  EXPECT_EQ(testing::read_all(temp), "mine");
  EXPECT_FALSE(file_exists(dir.file("out.bin")));
}

TEST(AtomicFile, TemporaryOwnerPidIsReadFromTheName) {
  EXPECT_EQ(temporary_owner_pid(".corpus.bin.tmp.1234.0", "corpus.bin"), 1234);
  EXPECT_EQ(temporary_owner_pid(".corpus.bin.tmp.7.12", "corpus.bin"), 7);
  EXPECT_EQ(temporary_owner_pid(".corpus.bin.tmp.1234.0", "corpus.idx"), 0);
  EXPECT_EQ(temporary_owner_pid(".corpus.bin.tmp.1234", "corpus.bin"), 0);
  EXPECT_EQ(temporary_owner_pid(".corpus.bin.tmp.x.0", "corpus.bin"), 0);
  EXPECT_EQ(temporary_owner_pid(".corpus.bin.tmp.12.0x", "corpus.bin"), 0);
  EXPECT_EQ(temporary_owner_pid("corpus.bin", "corpus.bin"), 0);
  EXPECT_TRUE(process_exists(static_cast<int>(::getpid())));
  const pid_t gone = testing::start_child([] { return 0; });
  testing::wait_child(gone);
  EXPECT_FALSE(process_exists(static_cast<int>(gone)));
}

// A tool that installed the handlers loses its temporaries (and other registered
// paths) to SIGTERM, and still dies of the signal.
TEST(AtomicFile, SigtermRemovesTemporaries) {
  TempDir dir;
  testing::SignalPipe ready;
  const pid_t child = testing::start_child([&] {
    install_cleanup_signal_handlers();
    AtomicFile file(dir.file("out.bin"));
    file.write("partial", 7);
    testing::write_all(dir.file("registered"), "x");
    register_cleanup_path(dir.file("registered"));
    ready.send();
    for (;;) ::pause();
    return 0;
  });
  ready.close_write();
  ASSERT_TRUE(ready.receive());
  EXPECT_EQ(dir.list().size(), 2U);
  ::kill(child, SIGTERM);
  EXPECT_EQ(testing::wait_child(child), 128 + SIGTERM);
  EXPECT_TRUE(dir.list().empty());
}

// Inside DeferCleanupSignals a signal waits; it takes effect at the end.
TEST(AtomicFile, DeferredSignalsTakeEffectAfterwards) {
  TempDir dir;
  const int code = testing::run_in_child([&] {
    install_cleanup_signal_handlers();
    AtomicFile file(dir.file("out.bin"));
    {
      const DeferCleanupSignals defer;
      ::raise(SIGTERM);
      testing::write_all(dir.file("survived"), "x");
    }
    return 3;  // not reached
  });
  EXPECT_EQ(code, 128 + SIGTERM);
  EXPECT_EQ(dir.list(), (std::set<std::string>{"survived"}));
}

TEST(AtomicFile, CrashPointKillsOnlyWhenNamed) {
  EXPECT_EQ(testing::run_in_child([] {
              ::setenv("DUFU_CRASH_POINT", "somewhere", 1);
              crash_point("elsewhere");
              crash_point("somewhere");
              return 0;
            }),
            128 + SIGKILL);
  EXPECT_EQ(testing::run_in_child([] {
              ::unsetenv("DUFU_CRASH_POINT");
              crash_point("somewhere");
              return 0;
            }),
            0);
}

}  // namespace
}  // namespace dufu
