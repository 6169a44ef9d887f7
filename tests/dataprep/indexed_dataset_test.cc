// Tests of the indexed-dataset readers and writer: byte-exact golden files for both
// layouts (written by hand from docs/formats.md, not by dufu), fairseq's variant,
// round trips through every impl, and a .bin that does not fit its index. The .idx
// alone (names, layouts, one test per kind of corrupt index): index_test.cc.
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "indexed_dataset_test_support.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/dtype.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;

namespace fs = std::filesystem;

using dufu::testing::TempDir;
using namespace indexed_dataset_testing;

constexpr IndexImpl kImpls[] = {IndexImpl::kMmap, IndexImpl::kLazy, IndexImpl::kCached};
constexpr IndexLayout kWritableLayouts[] = {IndexLayout::kMMIDIDX, IndexLayout::kTNTIDX};

// --- dtype names ------------------------------------------------------------------

TEST(DTypeTest, CodesSizesAndNamesFollowTheMegatronTable) {
  const std::vector<std::tuple<std::uint64_t, std::size_t, std::string>> table = {
      {1, 1, "uint8"},   {2, 1, "int8"},    {3, 2, "int16"},  {4, 4, "int32"},  {5, 8, "int64"},
      {6, 8, "float64"}, {7, 4, "float32"}, {8, 2, "uint16"}, {9, 4, "uint32"}, {10, 8, "uint64"}};
  for (const auto& [code, size, name] : table) {
    const DType dtype = dtype_from_code(code, "x.idx");
    EXPECT_EQ(static_cast<std::uint64_t>(dtype), code);
    EXPECT_EQ(dtype_size(dtype), size) << name;
    EXPECT_EQ(dtype_name(dtype), name);
    EXPECT_EQ(parse_dtype(name), dtype);
    EXPECT_EQ(dtype_is_integer(dtype), code != 6 && code != 7) << name;
  }
  expect_error([] { dtype_from_code(0, "some/file.idx"); }, {"some/file.idx", "0"});
  expect_error([] { dtype_from_code(11, "some/file.idx"); }, {"some/file.idx", "11"});
  expect_error([] { parse_dtype("int12"); }, {"int12"});
}

TEST(DTypeTest, VocabularyRuleIsMegatronsStrict65500) {
  EXPECT_EQ(token_dtype_for_vocab(32000), DType::kUInt16);
  EXPECT_EQ(token_dtype_for_vocab(65499), DType::kUInt16);
  EXPECT_EQ(token_dtype_for_vocab(65500), DType::kInt32);
  EXPECT_EQ(token_dtype_for_vocab(65536), DType::kInt32);
  EXPECT_EQ(token_dtype_for_vocab(256000), DType::kInt32);
  EXPECT_THROW(token_dtype_for_vocab(0), Error);
}

// --- golden files ---------------------------------------------------------------

struct GoldenCase {
  IndexLayout layout;
  std::string name;
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, WriterReproducesTheHandWrittenBytes) {
  TempDir dir;
  const std::string prefix = dir.file("out");
  IndexedDatasetWriter writer(prefix, GetParam().layout, DType::kUInt16);
  writer.add_document(std::vector<std::int32_t>{10, 11, 12});
  writer.add_document(std::vector<std::int32_t>{13, 14});
  const std::uint64_t bytes = writer.commit();

  const std::string expected_idx = read_file(idx_path(golden(GetParam().name)));
  const std::string expected_bin = read_file(bin_path(golden(GetParam().name)));
  ASSERT_EQ(expected_bin.size(), 10u);
  EXPECT_EQ(read_file(idx_path(prefix)), expected_idx);
  EXPECT_EQ(read_file(bin_path(prefix)), expected_bin);
  EXPECT_EQ(bytes, expected_idx.size() + expected_bin.size());
  EXPECT_EQ(dir.list().size(), 2u) << "temporaries left behind";
}

TEST_P(GoldenTest, EveryImplReadsTheHandWrittenFile) {
  for (const IndexImpl impl : kImpls) {
    SCOPED_TRACE(std::string(impl_name(impl)));
    const auto dataset = IndexedDataset::open(golden(GetParam().name), impl);
    const Index& index = dataset->index();
    EXPECT_EQ(dataset->impl(), impl);
    EXPECT_EQ(index.layout(), GetParam().layout);
    EXPECT_EQ(index.dtype(), DType::kUInt16);
    EXPECT_EQ(index.version(), 1u);
    EXPECT_EQ(index.num_sequences(), 2u);
    EXPECT_EQ(index.num_document_entries(), 3u);
    EXPECT_EQ(dataset->num_documents(), 2u);
    EXPECT_EQ(index.total_tokens(), 5u);
    EXPECT_EQ(index.sequence_length(0), 3u);
    EXPECT_EQ(index.sequence_length(1), 2u);
    EXPECT_EQ(index.sequence_offset(0), 0u);
    EXPECT_EQ(index.sequence_offset(1), 3u);
    EXPECT_EQ(index.document_index(0), 0u);
    EXPECT_EQ(index.document_index(1), 1u);
    EXPECT_EQ(index.document_index(2), 2u);
    EXPECT_EQ(index.file_size(), GetParam().layout == IndexLayout::kMMIDIDX ? 82u : 144u);
    EXPECT_EQ(dataset->bin_size(), 10u);
    EXPECT_EQ(dataset->sequence(0), (std::vector<std::int32_t>{10, 11, 12}));
    EXPECT_EQ(dataset->sequence(1), (std::vector<std::int32_t>{13, 14}));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GoldenTest,
                         ::testing::Values(GoldenCase{IndexLayout::kMMIDIDX, "mmidx_example"},
                                           GoldenCase{IndexLayout::kTNTIDX, "tntidx_example"}),
                         [](const auto& info) { return info.param.name; });

TEST(FairseqTest, ReadsTokensMinusOneAndOneDocumentPerSequence) {
  for (const IndexImpl impl : kImpls) {
    SCOPED_TRACE(std::string(impl_name(impl)));
    const auto dataset = IndexedDataset::open(golden("fairseq_example"), impl);
    const Index& index = dataset->index();
    EXPECT_EQ(index.layout(), IndexLayout::kFairseqTNTIDX);
    EXPECT_EQ(index.file_size(), 112u);
    EXPECT_EQ(index.num_sequences(), 2u);
    EXPECT_EQ(index.num_document_entries(), 3u);
    for (std::uint64_t k = 0; k < 3; ++k) EXPECT_EQ(index.document_index(k), k);
    EXPECT_EQ(index.sequence_offset(1), 3u);
    EXPECT_EQ(dataset->sequence(0), (std::vector<std::int32_t>{10, 11, 12}));
    EXPECT_EQ(dataset->sequence(1), (std::vector<std::int32_t>{13, 14}));
    std::int32_t middle[2] = {};
    dataset->read_tokens(0, 1, 2, middle);
    EXPECT_EQ(middle[0], 11);
    EXPECT_EQ(middle[1], 12);
    // Raw bytes are what is on disk: the +1 is only undone for tokens.
    std::byte raw[2];
    dataset->read_bytes(0, 2, raw);
    EXPECT_EQ(static_cast<int>(raw[0]), 11);
  }
}

// Writing fairseq's layouts: tests/dataprep/fairseq_layout_test.cc.

// --- round trips ----------------------------------------------------------------

// Tokens encode their position so that any misplaced read shows up.
std::int32_t token_at(DType dtype, std::uint64_t seq, std::uint64_t pos) {
  if (dtype == DType::kUInt16) return static_cast<std::int32_t>((seq * 7919 + pos) % 65536);
  const auto value = static_cast<std::int32_t>(seq * 1000003 + pos);
  return seq % 5 == 4 ? -value : value;
}

// Documents of 1-3 sequences; lengths include 0 and one longer than the 32 KiB
// conversion chunk of read_tokens.
std::vector<std::vector<std::uint64_t>> document_shapes() {
  return {{3}, {5, 0, 2}, {1, 20000}, {7}, {0}, {4, 4}, {1, 2, 3}};
}

std::uint64_t write_shapes(const std::string& prefix, IndexLayout layout, DType dtype) {
  IndexedDatasetWriter writer(prefix, layout, dtype);
  std::uint64_t seq = 0;
  for (const auto& doc : document_shapes()) {
    for (const std::uint64_t length : doc) {
      std::vector<std::int32_t> tokens(length);
      for (std::uint64_t pos = 0; pos < length; ++pos) tokens[pos] = token_at(dtype, seq, pos);
      writer.add_sequence(tokens);
      ++seq;
    }
    writer.end_document();
  }
  EXPECT_EQ(writer.num_sequences(), seq);
  EXPECT_EQ(writer.num_documents(), document_shapes().size());
  EXPECT_EQ(writer.bin_bytes(), writer.tokens() * dtype_size(dtype));
  return writer.commit();
}

using RoundTripParam = std::tuple<IndexLayout, IndexImpl, DType>;
class RoundTripTest : public ::testing::TestWithParam<RoundTripParam> {};

TEST_P(RoundTripTest, EverySequenceDocumentAndSubRangeReadsBack) {
  const auto [layout, impl, dtype] = GetParam();
  TempDir dir;
  const std::string prefix = dir.file("shard");
  const std::uint64_t written = write_shapes(prefix, layout, dtype);
  const auto dataset = IndexedDataset::open(prefix, impl);
  const Index& index = dataset->index();
  EXPECT_EQ(index.layout(), layout);
  EXPECT_EQ(dataset->dtype(), dtype);
  EXPECT_EQ(written, fs::file_size(idx_path(prefix)) + fs::file_size(bin_path(prefix)));

  std::uint64_t seq = 0, offset = 0;
  const auto shapes = document_shapes();
  ASSERT_EQ(dataset->num_documents(), shapes.size());
  for (std::uint64_t doc = 0; doc < shapes.size(); ++doc) {
    EXPECT_EQ(index.document_index(doc), seq);
    for (const std::uint64_t length : shapes[doc]) {
      ASSERT_EQ(dataset->sequence_length(seq), length);
      EXPECT_EQ(index.sequence_offset(seq), offset);
      std::vector<std::int32_t> expected(length);
      for (std::uint64_t pos = 0; pos < length; ++pos) expected[pos] = token_at(dtype, seq, pos);
      EXPECT_EQ(dataset->sequence(seq), expected) << "sequence " << seq;
      if (length >= 3) {
        // Sub-range [1, length - 1).
        std::vector<std::int32_t> middle(length - 2, -7);
        dataset->read_tokens(seq, 1, length - 2, middle.data());
        EXPECT_EQ(middle, std::vector<std::int32_t>(expected.begin() + 1, expected.end() - 1));
      }
      offset += length;
      ++seq;
    }
  }
  EXPECT_EQ(index.document_index(shapes.size()), seq);
  EXPECT_EQ(dataset->num_sequences(), seq);
  EXPECT_EQ(index.total_tokens(), offset);
  EXPECT_EQ(dataset->bin_size(), offset * dtype_size(dtype));
  const std::uint64_t docs = shapes.size() + 1;
  EXPECT_EQ(index.file_size(), layout == IndexLayout::kMMIDIDX
                                   ? 34 + 12 * seq + 8 * docs
                                   : 56 + 16 * (seq + 1) + 8 * seq + 8 * docs);

  // Out-of-range requests name the dataset.
  std::int32_t sink[4];
  expect_error([&] { dataset->read_tokens(seq, 0, 1, sink); }, {prefix});
  expect_error([&] { dataset->read_tokens(0, 2, 2, sink); }, {prefix, "3 tokens"});
  expect_error([&] { dataset->read_tokens(0, 4, 0, sink); }, {prefix});
  expect_error([&] { dataset->read_tokens(0, 1, std::numeric_limits<std::uint64_t>::max(), sink); },
               {prefix});
  expect_error([&] { index.document_index(docs); }, {prefix});
  std::byte byte_sink[2];
  expect_error([&] { dataset->read_bytes(dataset->bin_size() - 1, 2, byte_sink); }, {prefix});
}

INSTANTIATE_TEST_SUITE_P(AllCombinations, RoundTripTest,
                         ::testing::Combine(::testing::ValuesIn(kWritableLayouts),
                                            ::testing::ValuesIn(kImpls),
                                            ::testing::Values(DType::kUInt16, DType::kInt32)),
                         [](const auto& info) {
                           return std::string(layout_name(std::get<0>(info.param))) + "_" +
                                  std::string(impl_name(std::get<1>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<2>(info.param)));
                         });

using LayoutImpl = std::tuple<IndexLayout, IndexImpl>;
class EmptyDatasetTest : public ::testing::TestWithParam<LayoutImpl> {};

TEST_P(EmptyDatasetTest, ZeroSequencesRoundTrip) {
  const auto [layout, impl] = GetParam();
  TempDir dir;
  const std::string prefix = dir.file("empty");
  IndexedDatasetWriter(prefix, layout, DType::kUInt16).commit();
  EXPECT_EQ(fs::file_size(bin_path(prefix)), 0u);
  EXPECT_EQ(fs::file_size(idx_path(prefix)), layout == IndexLayout::kMMIDIDX ? 42u : 80u);
  const auto dataset = IndexedDataset::open(prefix, impl);
  EXPECT_EQ(dataset->num_sequences(), 0u);
  EXPECT_EQ(dataset->num_documents(), 0u);
  EXPECT_EQ(dataset->index().total_tokens(), 0u);
  EXPECT_EQ(dataset->bin_size(), 0u);
  dataset->read_bytes(0, 0, nullptr);
  expect_error([&] { dataset->sequence(0); }, {prefix});
}

INSTANTIATE_TEST_SUITE_P(AllCombinations, EmptyDatasetTest,
                         ::testing::Combine(::testing::ValuesIn(kWritableLayouts),
                                            ::testing::ValuesIn(kImpls)),
                         [](const auto& info) {
                           return std::string(layout_name(std::get<0>(info.param))) + "_" +
                                  std::string(impl_name(std::get<1>(info.param)));
                         });

TEST(RoundTripTest, EveryIntegerDTypeKeepsItsExtremes) {
  const std::vector<std::pair<DType, std::vector<std::int32_t>>> cases = {
      {DType::kUInt8, {0, 1, 255}},
      {DType::kInt8, {-128, 0, 127}},
      {DType::kInt16, {-32768, 7, 32767}},
      {DType::kUInt16, {0, 65499, 65535}},
      {DType::kInt32,
       {std::numeric_limits<std::int32_t>::min(), 0, std::numeric_limits<std::int32_t>::max()}},
      {DType::kUInt32, {0, 70000, std::numeric_limits<std::int32_t>::max()}},
      {DType::kInt64,
       {std::numeric_limits<std::int32_t>::min(), -1, std::numeric_limits<std::int32_t>::max()}},
      {DType::kUInt64, {0, 1, std::numeric_limits<std::int32_t>::max()}},
  };
  TempDir dir;
  for (const auto& [dtype, tokens] : cases) {
    for (const IndexLayout layout : kWritableLayouts) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::string(layout_name(layout)));
      const std::string prefix = dir.file(std::string(dtype_name(dtype)));
      IndexedDatasetWriter writer(prefix, layout, dtype);
      writer.add_document(tokens);
      writer.add_document(std::vector<std::int32_t>(tokens.rbegin(), tokens.rend()));
      writer.commit();
      EXPECT_EQ(fs::file_size(bin_path(prefix)), 6 * dtype_size(dtype));
      for (const IndexImpl impl : kImpls) {
        const auto dataset = IndexedDataset::open(prefix, impl);
        EXPECT_EQ(dataset->sequence(0), tokens);
        EXPECT_EQ(dataset->sequence(1), std::vector<std::int32_t>(tokens.rbegin(), tokens.rend()));
      }
    }
  }
}

TEST(RoundTripTest, StoredValueBeyondInt32IsAnErrorNotAWrap) {
  TempDir dir;
  const std::string prefix = dir.file("wide");
  IndexedDatasetWriter writer(prefix, IndexLayout::kMMIDIDX, DType::kUInt32);
  writer.add_document(std::vector<std::int32_t>{1, 2, 3});
  writer.commit();
  std::string bin = read_file(bin_path(prefix));
  patch<std::uint32_t>(bin, 4, 0xFFFFFFFFu);
  write_file(bin_path(prefix), bin);
  for (const IndexImpl impl : kImpls) {
    const auto dataset = IndexedDataset::open(prefix, impl);
    expect_error([&] { dataset->sequence(0); }, {bin_path(prefix), "4294967295", "int32"});
    std::int32_t first = 0;
    dataset->read_tokens(0, 0, 1, &first);  // the values before it are fine
    EXPECT_EQ(first, 1);
  }
}

TEST(RoundTripTest, LayoutComesFromTheMagicWhateverTheImpl) {
  TempDir dir;
  for (const IndexLayout layout : kWritableLayouts) {
    const std::string prefix = dir.file(std::string(layout_name(layout)));
    write_shapes(prefix, layout, DType::kUInt16);
    for (const IndexImpl impl : kImpls) {
      EXPECT_EQ(IndexedDataset::open(prefix, impl)->index().layout(), layout);
    }
  }
}

// --- corrupt input ----------------------------------------------------------------

// A corrupt .idx alone: index_test.cc.

TEST(CorruptDatasetTest, BinOfTheWrongSizeIsRejectedByEveryImpl) {
  TempDir dir;
  for (const std::string name : {"mmidx_example", "tntidx_example", "fairseq_example"}) {
    const std::string prefix = copy_golden(dir, name);
    const std::string bin = read_file(bin_path(prefix));
    for (const std::string& damaged : {bin + '\0', bin.substr(0, 9), std::string()}) {
      write_file(bin_path(prefix), damaged);
      for (const IndexImpl impl : kImpls) {
        SCOPED_TRACE(name + " " + std::string(impl_name(impl)));
        expect_error([&] { IndexedDataset::open(prefix, impl); },
                     {bin_path(prefix), std::to_string(damaged.size()) + " bytes", "5 tokens"});
      }
    }
  }
}

TEST(CorruptDatasetTest, MissingFilesAreNamed) {
  TempDir dir;
  const std::string prefix = copy_golden(dir, "mmidx_example");
  fs::remove(bin_path(prefix));
  for (const IndexImpl impl : kImpls) {
    expect_error([&] { IndexedDataset::open(prefix, impl); }, {bin_path(prefix)});
    expect_error([&] { IndexedDataset::open(dir.file("nothing"), impl); }, {dir.file("nothing.idx")});
  }
}

// --- writer ---------------------------------------------------------------------

TEST(WriterTest, DestroyedWithoutCommitLeavesNoFile) {
  TempDir dir;
  for (const IndexLayout layout : kWritableLayouts) {
    {
      IndexedDatasetWriter writer(dir.file("abandoned"), layout, DType::kUInt16);
      writer.add_document(std::vector<std::int32_t>(100000, 7));
      writer.add_document(std::vector<std::int32_t>{1, 2});
      EXPECT_FALSE(dir.list().empty());  // the .bin temporary exists meanwhile
    }
    EXPECT_TRUE(dir.list().empty());
    try {
      IndexedDatasetWriter writer(dir.file("failed"), layout, DType::kUInt16);
      writer.add_document(std::vector<std::int32_t>{1, 2});
      writer.add_document(std::vector<std::int32_t>{70000});
    } catch (const Error&) {
    }
    EXPECT_TRUE(dir.list().empty());
  }
}

TEST(WriterTest, TokenThatDoesNotFitTheDTypeThrows) {
  TempDir dir;
  struct Case {
    DType dtype;
    std::int32_t token;
  };
  for (const auto& [dtype, token] : std::vector<Case>{{DType::kUInt16, 70000},
                                                      {DType::kUInt16, 65536},
                                                      {DType::kUInt16, -1},
                                                      {DType::kUInt8, 256},
                                                      {DType::kInt8, -129},
                                                      {DType::kInt16, 40000},
                                                      {DType::kUInt32, -5},
                                                      {DType::kUInt64, -1}}) {
    IndexedDatasetWriter writer(dir.file("w"), IndexLayout::kMMIDIDX, dtype);
    const std::vector<std::int32_t> tokens{0, 1, token, 2};
    expect_error([&] { writer.add_sequence(tokens); },
                 {std::to_string(token), std::string(dtype_name(dtype)), "position 2"});
    EXPECT_EQ(writer.num_sequences(), 0u);
    EXPECT_EQ(writer.tokens(), 0u);
  }
}

TEST(WriterTest, RejectedSequenceLeavesTheWriterConsistent) {
  TempDir dir;
  const std::string prefix = dir.file("w");
  IndexedDatasetWriter writer(prefix, IndexLayout::kMMIDIDX, DType::kUInt16);
  writer.add_document(std::vector<std::int32_t>{1, 2, 3});
  EXPECT_THROW(writer.add_sequence(std::vector<std::int32_t>{4, 70000}), Error);
  writer.add_document(std::vector<std::int32_t>{5});
  writer.commit();
  const auto dataset = IndexedDataset::open(prefix, IndexImpl::kMmap);
  ASSERT_EQ(dataset->num_sequences(), 2u);
  EXPECT_EQ(dataset->sequence(1), (std::vector<std::int32_t>{5}));
}

TEST(WriterTest, MisuseIsReported) {
  TempDir dir;
  expect_error([&] { IndexedDatasetWriter(dir.file("f"), IndexLayout::kMMIDIDX, DType::kFloat32); },
               {"float32"});
  {
    IndexedDatasetWriter writer(dir.file("open"), IndexLayout::kTNTIDX, DType::kUInt16);
    writer.add_sequence(std::vector<std::int32_t>{1});
    expect_error([&] { writer.commit(); }, {dir.file("open"), "end_document"});
  }
  EXPECT_TRUE(dir.list().empty());
  IndexedDatasetWriter writer(dir.file("twice"), IndexLayout::kMMIDIDX, DType::kUInt16);
  writer.add_document(std::vector<std::int32_t>{1});
  writer.commit();
  expect_error([&] { writer.commit(); }, {"already committed"});
  expect_error([&] { writer.add_document(std::vector<std::int32_t>{2}); }, {"already committed"});
}

TEST(WriterTest, MultiSequenceDocumentsGetTheirIndices) {
  TempDir dir;
  const std::string prefix = dir.file("docs");
  IndexedDatasetWriter writer(prefix, IndexLayout::kMMIDIDX, DType::kUInt16);
  writer.add_sequence(std::vector<std::int32_t>{1});
  writer.add_sequence(std::vector<std::int32_t>{2, 3});
  writer.end_document();
  writer.end_document();  // an empty document is legal in both formats
  writer.add_document(std::vector<std::int32_t>{4});
  writer.commit();
  for (const IndexImpl impl : kImpls) {
    const auto dataset = IndexedDataset::open(prefix, impl);
    ASSERT_EQ(dataset->index().num_document_entries(), 4u);
    EXPECT_EQ(dataset->index().document_index(1), 2u);
    EXPECT_EQ(dataset->index().document_index(2), 2u);
    EXPECT_EQ(dataset->index().document_index(3), 3u);
  }
}

TEST(WriterTest, CommitReplacesAnEarlierShardAtomically) {
  TempDir dir;
  const std::string prefix = dir.file("again");
  write_shapes(prefix, IndexLayout::kMMIDIDX, DType::kUInt16);
  IndexedDatasetWriter writer(prefix, IndexLayout::kTNTIDX, DType::kInt32);
  writer.add_document(std::vector<std::int32_t>{100000});
  writer.commit();
  const auto dataset = IndexedDataset::open(prefix, IndexImpl::kLazy);
  EXPECT_EQ(dataset->index().layout(), IndexLayout::kTNTIDX);
  EXPECT_EQ(dataset->sequence(0), (std::vector<std::int32_t>{100000}));
  EXPECT_EQ(dir.list().size(), 2u);
}

}  // namespace
}  // namespace dufu::dataprep
