// Tests of the .idx alone (index.h): the impl and layout names, and one test per kind
// of corrupt index, each refused by Index::open, mapped or read, naming the file.
#include "dufu/dataprep/index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "indexed_dataset_test_support.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;
using dufu::testing::TempDir;
using namespace indexed_dataset_testing;

constexpr IndexImpl kImpls[] = {IndexImpl::kMmap, IndexImpl::kLazy, IndexImpl::kCached};

// --- impl and layout names ----------------------------------------------------------

TEST(IndexImplTest, NamesParseAndMapToLayouts) {
  for (const IndexImpl impl : kImpls) EXPECT_EQ(parse_impl(impl_name(impl)), impl);
  expect_error([] { parse_impl("mmapp"); }, {"mmapp"});
  EXPECT_EQ(layout_for_impl(IndexImpl::kMmap), IndexLayout::kMMIDIDX);
  EXPECT_EQ(layout_for_impl(IndexImpl::kLazy), IndexLayout::kTNTIDX);
  EXPECT_EQ(layout_for_impl(IndexImpl::kCached), IndexLayout::kTNTIDX);
  EXPECT_EQ(bin_path("a/b"), "a/b.bin");
  EXPECT_EQ(idx_path("a/b"), "a/b.idx");
  EXPECT_EQ(layout_name(IndexLayout::kMMIDIDX), "MMIDIDX");
  EXPECT_EQ(layout_name(IndexLayout::kTNTIDX), "TNTIDX");
}

// --- corrupt input ----------------------------------------------------------------

class CorruptIndexTest : public ::testing::TestWithParam<bool> {
 protected:
  // Copies golden `name`, applies `damage` to its .idx bytes and expects Index::open
  // (mapped or read, per the parameter) to fail with a message naming the file.
  std::string expect_corrupt(const std::string& name,
                             const std::function<void(std::string&)>& damage,
                             std::vector<std::string> needles) {
    const std::string prefix = copy_golden(dir_, name);
    std::string bytes = read_file(idx_path(prefix));
    damage(bytes);
    write_file(idx_path(prefix), bytes);
    needles.push_back(idx_path(prefix));
    return expect_error([&] { Index::open(idx_path(prefix), GetParam()); }, needles);
  }
  TempDir dir_;
};

TEST_P(CorruptIndexTest, TruncatedIndex) {
  const std::string message = expect_corrupt("mmidx_example", [](std::string& b) { b.pop_back(); },
                                             {"81 bytes", "S=2, D=3", "82"});
  EXPECT_NE(message.find("corrupt index"), std::string::npos) << message;
  expect_corrupt("tntidx_example", [](std::string& b) { b.resize(143); }, {"143 bytes", "144"});
  expect_corrupt("fairseq_example", [](std::string& b) { b.resize(104); }, {"104 bytes", "112"});
  expect_corrupt("mmidx_example", [](std::string& b) { b.resize(20); }, {"20 bytes", "34"});
  expect_corrupt("tntidx_example", [](std::string& b) { b.resize(40); }, {"40 bytes", "48"});
  expect_corrupt("mmidx_example", [](std::string& b) { b.resize(5); }, {"5 bytes"});
  expect_corrupt("mmidx_example", [](std::string& b) { b.clear(); }, {"0 bytes"});
}

TEST_P(CorruptIndexTest, TrailingBytes) {
  expect_corrupt("mmidx_example", [](std::string& b) { b.push_back('\0'); }, {"83 bytes"});
  expect_corrupt("tntidx_example", [](std::string& b) { b += std::string(16, '\0'); },
                 {"160 bytes"});
}

TEST_P(CorruptIndexTest, WrongMagic) {
  expect_corrupt("mmidx_example", [](std::string& b) { b[0] = 'X'; }, {"magic"});
  expect_corrupt("tntidx_example", [](std::string& b) { b[6] = 'Y'; }, {"magic"});
}

TEST_P(CorruptIndexTest, WrongVersion) {
  expect_corrupt("mmidx_example", [](std::string& b) { patch<std::uint64_t>(b, 9, 2); },
                 {"version 2"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::uint64_t>(b, 8, 3); },
                 {"version 3"});
}

TEST_P(CorruptIndexTest, UnknownDType) {
  expect_corrupt("mmidx_example", [](std::string& b) { patch<std::uint8_t>(b, 17, 11); },
                 {"dtype code 11"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::uint64_t>(b, 16, 0); },
                 {"dtype code 0"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::uint64_t>(b, 24, 4); },
                 {"element size 4", "uint16"});
}

TEST_P(CorruptIndexTest, DocumentIndicesNotClosed) {
  // The last doc_idx entry is the final 8 bytes in both layouts.
  expect_corrupt("mmidx_example", [](std::string& b) { patch<std::int64_t>(b, 74, 1); },
                 {"not closed"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::int64_t>(b, 136, 1); },
                 {"not closed"});
  expect_corrupt("mmidx_example", [](std::string& b) { patch<std::int64_t>(b, 58, 1); },
                 {"document_indices[0] is 1"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::int64_t>(b, 128, 5); },
                 {"document_indices[2] = 2", "smaller"});
}

TEST_P(CorruptIndexTest, HugeCountsDoNotWrapAroundIntoAValidSize) {
  // S = 2^62 + 2 makes 4S and 8S wrap to exactly the real 8 and 16 bytes: with 64-bit
  // wrapping arithmetic the header would "need" 82 bytes, the true size.
  expect_corrupt("mmidx_example",
                 [](std::string& b) { patch<std::uint64_t>(b, 18, (std::uint64_t{1} << 62) + 2); },
                 {"more than 2^64"});
  // D = 2^61 + 3: 8D wraps to 24.
  expect_corrupt("mmidx_example",
                 [](std::string& b) { patch<std::uint64_t>(b, 26, (std::uint64_t{1} << 61) + 3); },
                 {"more than 2^64"});
  // N = 2^60 + 2: 16(N+1) wraps to 48.
  expect_corrupt("tntidx_example",
                 [](std::string& b) { patch<std::uint64_t>(b, 32, (std::uint64_t{1} << 60) + 2); },
                 {"more than 2^64"});
  expect_corrupt("tntidx_example",
                 [](std::string& b) {
                   patch<std::uint64_t>(b, 32, std::numeric_limits<std::uint64_t>::max());
                 },
                 {"more than 2^64"});
}

TEST_P(CorruptIndexTest, InconsistentArrays) {
  expect_corrupt("mmidx_example", [](std::string& b) { patch<std::int64_t>(b, 50, 8); },
                 {"sequence 1 starts at byte 8", "end at byte 6"});
  expect_corrupt("mmidx_example", [](std::string& b) { patch<std::int32_t>(b, 34, -1); },
                 {"negative length"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::int64_t>(b, 64, 5); },
                 {"dim_offsets[1]"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::int64_t>(b, 88, 4); },
                 {"sequence 1 starts at element 4"});
  expect_corrupt("tntidx_example", [](std::string& b) { patch<std::int64_t>(b, 96, 6); },
                 {"data_offsets ends at element 6"});
  // s = 3 sizes for N = 2 items: a 2-D dataset, with the file grown to fit.
  expect_corrupt("tntidx_example",
                 [](std::string& b) {
                   patch<std::uint64_t>(b, 40, 3);
                   b += std::string(8, '\0');
                 },
                 {"only 1-D"});
}

INSTANTIATE_TEST_SUITE_P(MappedAndRead, CorruptIndexTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "mapped" : "read"; });

}  // namespace
}  // namespace dufu::dataprep
