// Tests of merge_datasets and IndexedDatasetWriter::append: a merge must be
// byte-identical to writing the same documents through one writer, whatever the input
// layouts, and must keep (shift) every input's document boundaries.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "support/temp_dir.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/merge.h"

namespace dufu::dataprep {
namespace {

class MergeTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }
  std::set<std::string> entries() const { return dir_.list(); }

  dufu::testing::TempDir dir_;
};

std::string read_file(const std::string& path) { return dufu::testing::read_all(path); }

// A document is a list of sequences; token values encode (set, document, sequence,
// position) so that misplaced or duplicated content is visible.
using Document = std::vector<std::vector<std::int32_t>>;

std::vector<Document> make_documents(int set, int count, std::int32_t max_token) {
  std::vector<Document> docs;
  for (int d = 0; d < count; ++d) {
    Document doc;
    for (int s = 0; s <= d % 3; ++s) {
      std::vector<std::int32_t> seq(static_cast<std::size_t>((d * 7 + s * 3) % 11));
      for (std::size_t p = 0; p < seq.size(); ++p) {
        seq[p] = static_cast<std::int32_t>((set * 100003 + d * 1009 + s * 101 + p) % max_token);
      }
      doc.push_back(seq);
    }
    docs.push_back(doc);
  }
  return docs;
}

void add_documents(IndexedDatasetWriter& writer, const std::vector<Document>& docs) {
  for (const auto& doc : docs) {
    for (const auto& seq : doc) writer.add_sequence(seq);
    writer.end_document();
  }
}

void write_documents(const std::string& prefix, IndexLayout layout, DType dtype,
                     const std::vector<Document>& docs) {
  IndexedDatasetWriter writer(prefix, layout, dtype);
  add_documents(writer, docs);
  writer.commit();
}

constexpr IndexLayout kLayouts[] = {IndexLayout::kMMIDIDX, IndexLayout::kTNTIDX};

using MergeParam = std::tuple<IndexLayout, IndexLayout, IndexLayout, DType>;  // A, B, out
class MergeEqualsOneWriterTest : public MergeTest,
                                 public ::testing::WithParamInterface<MergeParam> {};

TEST_P(MergeEqualsOneWriterTest, ByteIdenticalToWritingAThenB) {
  const auto [layout_a, layout_b, layout_out, dtype] = GetParam();
  const std::int32_t max_token = dtype == DType::kUInt16 ? 65536 : 2000000000;
  const auto docs_a = make_documents(1, 10, max_token);
  const auto docs_b = make_documents(2, 7, max_token);
  write_documents(path("a"), layout_a, dtype, docs_a);
  write_documents(path("b"), layout_b, dtype, docs_b);

  const MergeStats stats = merge_datasets({path("a"), path("b")}, path("merged"), layout_out);

  IndexedDatasetWriter writer(path("expected"), layout_out, dtype);
  add_documents(writer, docs_a);
  add_documents(writer, docs_b);
  EXPECT_EQ(stats.sequences, writer.num_sequences());
  EXPECT_EQ(stats.documents, 17u);
  EXPECT_EQ(stats.tokens, writer.tokens());
  EXPECT_EQ(stats.output_bytes, writer.commit());

  EXPECT_EQ(read_file(bin_path(path("merged"))), read_file(bin_path(path("expected"))));
  EXPECT_EQ(read_file(idx_path(path("merged"))), read_file(idx_path(path("expected"))));
}

INSTANTIATE_TEST_SUITE_P(Layouts, MergeEqualsOneWriterTest,
                         ::testing::Combine(::testing::ValuesIn(kLayouts),
                                            ::testing::ValuesIn(kLayouts),
                                            ::testing::ValuesIn(kLayouts),
                                            ::testing::Values(DType::kUInt16, DType::kInt32)),
                         [](const auto& info) {
                           return std::string(layout_name(std::get<0>(info.param))) + "_" +
                                  std::string(layout_name(std::get<1>(info.param))) + "_to_" +
                                  std::string(layout_name(std::get<2>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<3>(info.param)));
                         });

TEST_F(MergeTest, DocumentIndicesAreShiftedBySequencesAlreadyPresent) {
  // A: documents of 2 and 1 sequences -> [0, 2, 3]; B: 1 and 3 -> [0, 1, 4];
  // empty E in between adds nothing.
  write_documents(path("a"), IndexLayout::kMMIDIDX, DType::kUInt16, {{{1, 2}, {3}}, {{4, 5, 6}}});
  write_documents(path("e"), IndexLayout::kTNTIDX, DType::kUInt16, {});
  write_documents(path("b"), IndexLayout::kTNTIDX, DType::kUInt16, {{{7}}, {{8}, {}, {9, 10}}});
  for (const IndexLayout layout : kLayouts) {
    merge_datasets({path("a"), path("e"), path("b")}, path("m"), layout);
    for (const IndexImpl impl : {IndexImpl::kMmap, IndexImpl::kLazy, IndexImpl::kCached}) {
      const auto merged = IndexedDataset::open(path("m"), impl);
      std::vector<std::uint64_t> doc_idx;
      for (std::uint64_t k = 0; k < merged->index().num_document_entries(); ++k) {
        doc_idx.push_back(merged->index().document_index(k));
      }
      EXPECT_EQ(doc_idx, (std::vector<std::uint64_t>{0, 2, 3, 4, 7}));
      ASSERT_EQ(merged->num_sequences(), 7u);
      EXPECT_EQ(merged->sequence(2), (std::vector<std::int32_t>{4, 5, 6}));
      EXPECT_EQ(merged->sequence(3), (std::vector<std::int32_t>{7}));
      EXPECT_EQ(merged->sequence(5), (std::vector<std::int32_t>{}));
      EXPECT_EQ(merged->sequence(6), (std::vector<std::int32_t>{9, 10}));
      EXPECT_EQ(merged->index().sequence_offset(6), 8u);
    }
  }
}

TEST_F(MergeTest, MismatchedDTypesThrowAndWriteNothing) {
  write_documents(path("a"), IndexLayout::kMMIDIDX, DType::kUInt16, {{{1, 2}}});
  write_documents(path("b"), IndexLayout::kMMIDIDX, DType::kInt32, {{{3}}});
  try {
    merge_datasets({path("a"), path("b")}, path("m"), IndexLayout::kMMIDIDX);
    ADD_FAILURE() << "merge of uint16 and int32 did not throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path("b")), std::string::npos) << message;
    EXPECT_NE(message.find("int32"), std::string::npos) << message;
    EXPECT_NE(message.find("uint16"), std::string::npos) << message;
  }
  EXPECT_EQ(entries().size(), 4u);  // a.bin, a.idx, b.bin, b.idx, and no m.*

  IndexedDatasetWriter writer(path("w"), IndexLayout::kTNTIDX, DType::kInt32);
  const auto a = IndexedDataset::open(path("a"), IndexImpl::kLazy);
  EXPECT_THROW(writer.append(*a), Error);
  EXPECT_EQ(writer.num_sequences(), 0u);
}

TEST_F(MergeTest, NoInputsOrMissingInputThrow) {
  EXPECT_THROW(merge_datasets({}, path("m"), IndexLayout::kMMIDIDX), Error);
  try {
    merge_datasets({path("missing")}, path("m"), IndexLayout::kMMIDIDX);
    ADD_FAILURE() << "no error for a missing input";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path("missing")), std::string::npos) << e.what();
  }
  EXPECT_TRUE(entries().empty());
}

TEST_F(MergeTest, AppendIntoAWriterWithOwnContent) {
  write_documents(path("a"), IndexLayout::kTNTIDX, DType::kUInt16, {{{5, 6}}, {{7}, {8}}});
  IndexedDatasetWriter writer(path("w"), IndexLayout::kMMIDIDX, DType::kUInt16);
  writer.add_document(std::vector<std::int32_t>{1, 2, 3});
  const auto a = IndexedDataset::open(path("a"), IndexImpl::kCached);
  writer.add_sequence(std::vector<std::int32_t>{4});
  EXPECT_THROW(writer.append(*a), Error);  // a document is still open
  writer.end_document();
  writer.append(*a);
  writer.append(*a);
  writer.add_document(std::vector<std::int32_t>{9});
  writer.commit();
  const auto w = IndexedDataset::open(path("w"), IndexImpl::kMmap);
  ASSERT_EQ(w->num_sequences(), 9u);
  std::vector<std::uint64_t> doc_idx;
  for (std::uint64_t k = 0; k < w->index().num_document_entries(); ++k) {
    doc_idx.push_back(w->index().document_index(k));
  }
  EXPECT_EQ(doc_idx, (std::vector<std::uint64_t>{0, 1, 2, 3, 5, 6, 8, 9}));
  EXPECT_EQ(w->sequence(6), (std::vector<std::int32_t>{7}));
  EXPECT_EQ(w->sequence(8), (std::vector<std::int32_t>{9}));
}

TEST_F(MergeTest, FairseqInputIsDecodedNotCopied) {
  const std::string fairseq = std::string(DUFU_TEST_DATA_DIR) + "/golden/fairseq_example";
  const std::string mmidx = std::string(DUFU_TEST_DATA_DIR) + "/golden/mmidx_example";
  merge_datasets({fairseq, mmidx}, path("m"), IndexLayout::kMMIDIDX);
  const auto merged = IndexedDataset::open(path("m"), IndexImpl::kMmap);
  ASSERT_EQ(merged->num_documents(), 4u);
  EXPECT_EQ(merged->sequence(0), (std::vector<std::int32_t>{10, 11, 12}));
  EXPECT_EQ(merged->sequence(3), (std::vector<std::int32_t>{13, 14}));
  const std::string golden_bin = read_file(bin_path(mmidx));
  EXPECT_EQ(read_file(bin_path(path("m"))), golden_bin + golden_bin);
}

TEST_F(MergeTest, LargeInputsAreCopiedAcrossChunkBoundaries) {
  // 3.1 M uint16 tokens = 6.2 MB: more than one of append's 4 MiB chunks.
  std::vector<Document> big(1);
  for (int s = 0; s < 31; ++s) {
    std::vector<std::int32_t> seq(100000);
    for (std::size_t p = 0; p < seq.size(); ++p) {
      seq[p] = static_cast<std::int32_t>((s * 100000 + p) % 65521);
    }
    big[0].push_back(seq);
  }
  const auto small = make_documents(3, 5, 65536);
  write_documents(path("big"), IndexLayout::kMMIDIDX, DType::kUInt16, big);
  write_documents(path("small"), IndexLayout::kMMIDIDX, DType::kUInt16, small);
  merge_datasets({path("small"), path("big"), path("small")}, path("m"), IndexLayout::kMMIDIDX);
  const std::string small_bin = read_file(bin_path(path("small")));
  EXPECT_EQ(read_file(bin_path(path("m"))),
            small_bin + read_file(bin_path(path("big"))) + small_bin);
  const auto merged = IndexedDataset::open(path("m"), IndexImpl::kLazy);
  const std::uint64_t first_big =
      IndexedDataset::open(path("small"), IndexImpl::kMmap)->num_sequences();
  EXPECT_EQ(merged->sequence(first_big + 30), big[0][30]);
}

}  // namespace
}  // namespace dufu::dataprep
