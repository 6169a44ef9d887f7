// ReadOnlyFile: exact reads at offsets, whole-file reads, and errors naming the path.
#include "dufu/common/read_only_file.h"

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using testing::TempDir;

std::string as_string(const std::vector<std::byte>& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

TEST(ReadOnlyFile, ReadsExactRangesAndTheWholeFile) {
  TempDir dir;
  testing::write_all(dir.file("f"), "0123456789");
  const auto file = ReadOnlyFile::open(dir.file("f"));
  EXPECT_EQ(file.size(), 10U);
  std::vector<std::byte> part(4);
  file.read_exact(3, 4, part.data());
  EXPECT_EQ(as_string(part), "3456");
  EXPECT_EQ(as_string(file.read_all()), "0123456789");
}

TEST(ReadOnlyFile, ReadingPastTheEndNamesTheFile) {
  TempDir dir;
  testing::write_all(dir.file("short"), "abc");
  const auto file = ReadOnlyFile::open(dir.file("short"));
  std::vector<std::byte> out(8);
  try {
    file.read_exact(1, 8, out.data());
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(dir.file("short")), std::string::npos) << error.what();
  }
}

TEST(ReadOnlyFile, MissingFileAndDirectoryAreRefused) {
  TempDir dir;
  EXPECT_THROW(ReadOnlyFile::open(dir.file("missing")), Error);
  try {
    ReadOnlyFile::open(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("Is a directory"), std::string::npos) << error.what();
  }
}

TEST(ReadOnlyFile, MovedFromFileIsInert) {
  TempDir dir;
  testing::write_all(dir.file("f"), "xyz");
  auto first = ReadOnlyFile::open(dir.file("f"));
  ReadOnlyFile second = std::move(first);
  EXPECT_EQ(first.descriptor(), -1);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(as_string(second.read_all()), "xyz");
}

}  // namespace
}  // namespace dufu
