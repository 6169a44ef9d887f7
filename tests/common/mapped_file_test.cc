// Tests for MappedFile: exact contents, empty files, moves and error messages.
#include "dufu/common/mapped_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using dufu::testing::TempDir;

std::string as_string(const MappedFile& file) {
  return std::string(reinterpret_cast<const char*>(file.data()), file.size());
}

std::string error_of(const std::string& path) {
  try {
    MappedFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(MappedFile, MapsExactContents) {
  TempDir dir;
  std::string bytes;
  // Every byte value, and more than one page, so an off-by-one or short map shows.
  for (int i = 0; i < 3 * 4096 + 17; ++i) bytes.push_back(static_cast<char>(i * 7 % 256));
  testing::write_all(dir.file("a.bin"), bytes);

  const MappedFile file = MappedFile::open(dir.file("a.bin"));
  EXPECT_EQ(file.path(), dir.file("a.bin"));
  ASSERT_EQ(file.size(), bytes.size());
  ASSERT_NE(file.data(), nullptr);
  EXPECT_EQ(as_string(file), bytes);
  EXPECT_EQ(file.bytes().size(), bytes.size());
  EXPECT_EQ(file.bytes().data(), file.data());
}

TEST(MappedFile, EmptyFileIsEmptySpan) {
  TempDir dir;
  testing::write_all(dir.file("empty.bin"), "");
  const MappedFile file = MappedFile::open(dir.file("empty.bin"));
  EXPECT_EQ(file.data(), nullptr);
  EXPECT_EQ(file.size(), 0u);
  EXPECT_TRUE(file.bytes().empty());
}

TEST(MappedFile, MissingFileErrorNamesPathAndReason) {
  TempDir dir;
  const std::string path = dir.file("x.bin");
  EXPECT_EQ(error_of(path), "cannot open '" + path + "': No such file or directory");
}

TEST(MappedFile, DirectoryIsRejected) {
  TempDir dir;
  const std::string what = error_of(dir.path());
  EXPECT_NE(what.find("'" + dir.path() + "'"), std::string::npos) << what;
  EXPECT_NE(what.find("Is a directory"), std::string::npos) << what;
}

TEST(MappedFile, UnreadableFileErrorNamesPath) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of permissions";
  TempDir dir;
  const std::string path = dir.file("secret.bin");
  testing::write_all(path, "abc");
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  const std::string what = error_of(path);
  EXPECT_NE(what.find("'" + path + "'"), std::string::npos) << what;
  EXPECT_NE(what.find("Permission denied"), std::string::npos) << what;
}

TEST(MappedFile, MoveTransfersMappingAndEmptiesSource) {
  TempDir dir;
  testing::write_all(dir.file("m.bin"), "hello mapping");
  MappedFile a = MappedFile::open(dir.file("m.bin"));
  const std::byte* data = a.data();

  MappedFile b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(as_string(b), "hello mapping");
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(a.size(), 0u);

  testing::write_all(dir.file("n.bin"), "other");
  MappedFile c = MappedFile::open(dir.file("n.bin"));
  c = std::move(b);
  EXPECT_EQ(as_string(c), "hello mapping");
  EXPECT_EQ(c.path(), dir.file("m.bin"));
  EXPECT_EQ(b.size(), 0u);  // NOLINT(bugprone-use-after-move)
}

TEST(MappedFile, MappingOutlivesUnlink) {
  TempDir dir;
  testing::write_all(dir.file("gone.bin"), "still here");
  const MappedFile file = MappedFile::open(dir.file("gone.bin"));
  ASSERT_EQ(::unlink(dir.file("gone.bin").c_str()), 0);
  EXPECT_EQ(as_string(file), "still here");
}

}  // namespace
}  // namespace dufu
