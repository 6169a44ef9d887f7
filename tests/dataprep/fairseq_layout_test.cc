// Tests of fairseq's index layouts: dufu's writer against hand-typed golden files of
// both, reading fairseq's MMIDIDX, the id + 1 convention of its TNTIDX and its limits,
// one document per sequence, merges between every pair of layouts, and indices of
// layouts dufu does not read refused by name. End to end, `dataprep preprocess` with
// every --impl and --layout is read by fairseq's and Megatron's own readers
// (tests/reference/index_readers_reference.py), every document equal to python
// sentencepiece's encoding.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "dufu/dataprep/dtype.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/merge.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;
using dufu::testing::read_all;
using dufu::testing::TempDir;
using dufu::testing::write_all;

using Documents = std::vector<std::vector<std::int32_t>>;

constexpr IndexImpl kImpls[] = {IndexImpl::kMmap, IndexImpl::kLazy, IndexImpl::kCached};
constexpr IndexLayout kAllLayouts[] = {IndexLayout::kMMIDIDX, IndexLayout::kTNTIDX, IndexLayout::kFairseqTNTIDX,
                                       IndexLayout::kFairseqMMIDIDX};

std::string golden(const std::string& name) { return std::string(DUFU_TEST_DATA_DIR) + "/golden/" + name; }

void write_documents(const std::string& prefix, IndexLayout layout, DType dtype, const Documents& documents) {
  IndexedDatasetWriter writer(prefix, layout, dtype);
  for (const auto& document : documents) writer.add_document(document);
  writer.commit();
}

Documents read_documents(const std::string& prefix, IndexImpl impl) {
  const auto dataset = IndexedDataset::open(prefix, impl);
  Documents documents;
  for (std::uint64_t k = 0; k < dataset->num_documents(); ++k) {
    const std::uint64_t first = dataset->index().document_index(k);
    EXPECT_EQ(dataset->index().document_index(k + 1), first + 1) << "document " << k << " of " << prefix;
    documents.push_back(dataset->sequence(first));
  }
  return documents;
}

TEST(FairseqLayoutTest, ImplAndFamilyChooseTheLayout) {
  EXPECT_EQ(layout_for_impl(IndexImpl::kMmap), IndexLayout::kMMIDIDX);
  EXPECT_EQ(layout_for_impl(IndexImpl::kLazy, LayoutFamily::kMegatron), IndexLayout::kTNTIDX);
  EXPECT_EQ(layout_for_impl(IndexImpl::kMmap, LayoutFamily::kFairseq), IndexLayout::kFairseqMMIDIDX);
  EXPECT_EQ(layout_for_impl(IndexImpl::kLazy, LayoutFamily::kFairseq), IndexLayout::kFairseqTNTIDX);
  EXPECT_EQ(layout_for_impl(IndexImpl::kCached, LayoutFamily::kFairseq), IndexLayout::kFairseqTNTIDX);
  for (const LayoutFamily family : {LayoutFamily::kMegatron, LayoutFamily::kFairseq}) {
    EXPECT_EQ(parse_layout_family(layout_family_name(family)), family);
  }
  expect_error([] { parse_layout_family("torchnet"); }, {"torchnet", "megatron", "fairseq"});
  EXPECT_EQ(layout_name(IndexLayout::kFairseqMMIDIDX), "MMIDIDX (fairseq)");
  EXPECT_TRUE(layout_has_document_index(IndexLayout::kMMIDIDX));
  EXPECT_TRUE(layout_has_document_index(IndexLayout::kTNTIDX));
  EXPECT_FALSE(layout_has_document_index(IndexLayout::kFairseqTNTIDX));
  EXPECT_FALSE(layout_has_document_index(IndexLayout::kFairseqMMIDIDX));
  EXPECT_EQ(stored_id_offset(IndexLayout::kFairseqTNTIDX), 1);
  EXPECT_EQ(stored_id_offset(IndexLayout::kFairseqMMIDIDX), 0);
  EXPECT_EQ(stored_id_offset(IndexLayout::kMMIDIDX), 0);
}

// The golden files were typed in by hand from docs/formats.md section 5 (see
// tests/data/golden/README.md), and fairseq's own readers read them as these two
// documents (checked once by hand; the end-to-end test below checks shards dufu writes).
TEST(FairseqLayoutTest, WriterMatchesTheHandTypedGoldenFiles) {
  TempDir dir;
  for (const auto& [layout, dtype, name] : std::vector<std::tuple<IndexLayout, DType, std::string>>{
           {IndexLayout::kFairseqTNTIDX, DType::kInt32, "fairseq_int32_example"},
           {IndexLayout::kFairseqMMIDIDX, DType::kUInt16, "fairseq_mmidx_example"}}) {
    SCOPED_TRACE(name);
    const std::string prefix = dir.file(name);
    write_documents(prefix, layout, dtype, {{10, 11, 12}, {13, 14}});
    for (const IndexImpl impl : kImpls) {
      EXPECT_EQ(read_documents(golden(name), impl), (Documents{{10, 11, 12}, {13, 14}})) << impl_name(impl);
    }
    EXPECT_EQ(read_all(idx_path(prefix)), read_all(idx_path(golden(name))));
    EXPECT_EQ(read_all(bin_path(prefix)), read_all(bin_path(golden(name))));
  }
}

TEST(FairseqLayoutTest, ReadsFairseqMMIDIDXWithIdsAsStored) {
  for (const IndexImpl impl : kImpls) {
    SCOPED_TRACE(std::string(impl_name(impl)));
    const auto dataset = IndexedDataset::open(golden("fairseq_mmidx_example"), impl);
    const Index& index = dataset->index();
    EXPECT_EQ(index.layout(), IndexLayout::kFairseqMMIDIDX);
    EXPECT_EQ(index.file_size(), 50u);
    EXPECT_EQ(index.dtype(), DType::kUInt16);
    EXPECT_EQ(index.num_sequences(), 2u);
    EXPECT_EQ(index.num_document_entries(), 3u);
    for (std::uint64_t k = 0; k < 3; ++k) EXPECT_EQ(index.document_index(k), k);
    EXPECT_EQ(index.sequence_offset(1), 3u);
    EXPECT_EQ(dataset->sequence(0), (std::vector<std::int32_t>{10, 11, 12}));
    EXPECT_EQ(dataset->sequence(1), (std::vector<std::int32_t>{13, 14}));
  }
}

// Tokens that encode their document and position, within what the dtype can store
// after the layout's id offset; lengths include 0 and one longer than the 32 KiB
// conversion chunk of read_tokens.
Documents position_documents(DType dtype, std::int32_t offset) {
  const std::int64_t top = dtype_size(dtype) == 1 ? 126 : dtype_size(dtype) == 2 ? 32000 : 2'000'000'000;
  Documents documents;
  for (const std::size_t length : {3, 0, 20000, 1, 7}) {
    std::vector<std::int32_t> tokens(length);
    for (std::size_t i = 0; i < length; ++i) {
      tokens[i] = static_cast<std::int32_t>((documents.size() * 7919 + i * 31) % (top - offset));
    }
    documents.push_back(std::move(tokens));
  }
  return documents;
}

TEST(FairseqLayoutTest, RoundTripsEveryIntegerDtypeThroughEveryImpl) {
  TempDir dir;
  for (const IndexLayout layout : {IndexLayout::kFairseqTNTIDX, IndexLayout::kFairseqMMIDIDX}) {
    for (const DType dtype : {DType::kUInt8, DType::kInt8, DType::kInt16, DType::kUInt16, DType::kInt32, DType::kUInt32,
                              DType::kInt64, DType::kUInt64}) {
      // fairseq's lazy/cached reader has no unsigned types wider than uint8 (below).
      const bool unsigned_wide = dtype == DType::kUInt16 || dtype == DType::kUInt32 || dtype == DType::kUInt64;
      if (layout == IndexLayout::kFairseqTNTIDX && unsigned_wide) continue;
      SCOPED_TRACE(std::string(layout_name(layout)) + " " + std::string(dtype_name(dtype)));
      const std::string prefix = dir.file(std::string(dtype_name(dtype)) + std::to_string(static_cast<int>(layout)));
      const Documents documents = position_documents(dtype, stored_id_offset(layout));
      write_documents(prefix, layout, dtype, documents);
      std::uint64_t tokens = 0;
      for (const auto& document : documents) tokens += document.size();
      const std::uint64_t n = documents.size();
      EXPECT_EQ(read_all(idx_path(prefix)).size(),
                layout == IndexLayout::kFairseqTNTIDX ? 48 + 16 * (n + 1) + 8 * n : 26 + 12 * n);
      EXPECT_EQ(read_all(bin_path(prefix)).size(), tokens * dtype_size(dtype));
      for (const IndexImpl impl : kImpls) {
        EXPECT_EQ(read_documents(prefix, impl), documents) << impl_name(impl);
        EXPECT_EQ(IndexedDataset::open(prefix, impl)->index().layout(), layout);
      }
    }
  }
}

TEST(FairseqLayoutTest, TNTIDXStoresIdPlusOneAndRefusesIdsThatThenDoNotFit) {
  TempDir dir;
  IndexedDatasetWriter writer(dir.file("t"), IndexLayout::kFairseqTNTIDX, DType::kInt16);
  writer.add_document(std::vector<std::int32_t>{0, 32766});
  expect_error(
      [&] {
        writer.add_document(std::vector<std::int32_t>{5, 32767});
      },
      {"token 32767", "position 1", "int16", "id + 1", dir.file("t.bin")});
  // The refused document left nothing behind: the writer goes on.
  writer.add_document(std::vector<std::int32_t>{-1});
  writer.commit();
  const std::string bin = read_all(bin_path(dir.file("t")));
  ASSERT_EQ(bin.size(), 6u);
  std::int16_t stored[3];
  std::memcpy(stored, bin.data(), sizeof(stored));
  EXPECT_EQ(stored[0], 1);
  EXPECT_EQ(stored[1], 32767);
  EXPECT_EQ(stored[2], 0);
  EXPECT_EQ(read_documents(dir.file("t"), IndexImpl::kLazy), (Documents{{0, 32766}, {-1}}));

  IndexedDatasetWriter int32(dir.file("i"), IndexLayout::kFairseqTNTIDX, DType::kInt32);
  expect_error([&] { int32.add_document(std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::max()}); },
               {"2147483647", "id + 1"});
  // fairseq's MMIDIDX stores ids as they are: the dtype's whole range.
  write_documents(dir.file("m"), IndexLayout::kFairseqMMIDIDX, DType::kUInt16, {{65535, 0}});
  EXPECT_EQ(read_documents(dir.file("m"), IndexImpl::kMmap), (Documents{{65535, 0}}));
}

TEST(FairseqLayoutTest, TNTIDXRefusesDtypesFairseqsReaderCannotTurnIntoTensors) {
  TempDir dir;
  for (const DType dtype : {DType::kUInt16, DType::kUInt32, DType::kUInt64}) {
    expect_error([&] { IndexedDatasetWriter(dir.file("x"), IndexLayout::kFairseqTNTIDX, dtype); },
                 {std::string(dtype_name(dtype)), "torch.from_numpy", "int32"});
  }
  EXPECT_TRUE(dir.list().empty());
}

TEST(FairseqLayoutTest, EachDocumentMustBeOneSequence) {
  TempDir dir;
  for (const IndexLayout layout : {IndexLayout::kFairseqTNTIDX, IndexLayout::kFairseqMMIDIDX}) {
    IndexedDatasetWriter writer(dir.file("d"), layout, DType::kInt32);
    writer.add_sequence(std::vector<std::int32_t>{1});
    writer.add_sequence(std::vector<std::int32_t>{2});
    expect_error([&] { writer.end_document(); }, {"2 sequences", "no document index", dir.file("d")});
    IndexedDatasetWriter empty(dir.file("e"), layout, DType::kInt32);
    expect_error([&] { empty.end_document(); }, {"0 sequences", "exactly one sequence"});
  }
}

// Every pair of layouts, three inputs (one of each kind of id storage) into each
// output: the merged shard serves the inputs' documents in order, and the bytes of a
// fairseq TNTIDX output hold id + 1 whatever its inputs held.
TEST(FairseqLayoutTest, MergesBetweenEveryPairOfLayouts) {
  TempDir dir;
  const Documents a = {{1, 2, 3}, {4}}, b = {{5, 6}}, c = {{7}, {}, {8, 9}};
  for (const IndexLayout input : kAllLayouts) {
    for (const IndexLayout output : kAllLayouts) {
      SCOPED_TRACE(std::string(layout_name(input)) + " -> " + std::string(layout_name(output)));
      write_documents(dir.file("a"), input, DType::kInt32, a);
      write_documents(dir.file("b"), IndexLayout::kFairseqTNTIDX, DType::kInt32, b);
      write_documents(dir.file("c"), IndexLayout::kFairseqMMIDIDX, DType::kInt32, c);
      const MergeStats stats = merge_datasets({dir.file("a"), dir.file("b"), dir.file("c")}, dir.file("m"), output);
      EXPECT_EQ(stats.documents, 6u);
      EXPECT_EQ(stats.tokens, 9u);
      EXPECT_EQ(read_documents(dir.file("m"), IndexImpl::kLazy), (Documents{{1, 2, 3}, {4}, {5, 6}, {7}, {}, {8, 9}}));
      const std::string bin = read_all(bin_path(dir.file("m")));
      std::vector<std::int32_t> stored(bin.size() / 4);
      std::memcpy(stored.data(), bin.data(), bin.size());
      const std::int32_t offset = stored_id_offset(output);
      EXPECT_EQ(stored, (std::vector<std::int32_t>{1 + offset, 2 + offset, 3 + offset, 4 + offset, 5 + offset,
                                                   6 + offset, 7 + offset, 8 + offset, 9 + offset}));
    }
  }
}

TEST(FairseqLayoutTest, MergingADocumentOfSeveralSequencesIntoFairseqIsRefused) {
  TempDir dir;
  {
    IndexedDatasetWriter writer(dir.file("multi"), IndexLayout::kMMIDIDX, DType::kInt32);
    writer.add_document(std::vector<std::int32_t>{1});
    writer.add_sequence(std::vector<std::int32_t>{2});
    writer.add_sequence(std::vector<std::int32_t>{3});
    writer.end_document();
    writer.commit();
  }
  for (const IndexLayout output : {IndexLayout::kFairseqTNTIDX, IndexLayout::kFairseqMMIDIDX}) {
    expect_error([&] { merge_datasets({dir.file("multi")}, dir.file("out"), output); },
                 {dir.file("multi"), "document 1 has 2 sequences", "no document index"});
    EXPECT_FALSE(dufu::testing::file_exists(idx_path(dir.file("out"))));
  }
}

class UnknownLayoutTest : public ::testing::TestWithParam<bool> {
 protected:
  std::string open_error(const std::string& bytes) {
    write_all(dir_.file("x.idx"), bytes);
    return expect_error([&] { Index::open(dir_.file("x.idx"), GetParam()); }, {dir_.file("x.idx")});
  }
  TempDir dir_;
};

TEST_P(UnknownLayoutTest, LayoutsDufuDoesNotReadAreNamed) {
  std::string huffman = "HUFFIDX";
  huffman.append(60, '\0');
  std::string message = open_error(huffman);
  EXPECT_NE(message.find("unknown index layout"), std::string::npos) << message;
  EXPECT_NE(message.find("HUFFIDX"), std::string::npos) << message;

  message = open_error(std::string("NUMPYIDX") + std::string(40, '\1'));
  EXPECT_NE(message.find("unknown index layout"), std::string::npos) << message;
  EXPECT_NE(message.find("\"NUMPYIDX.\""), std::string::npos) << message;
  EXPECT_NE(message.find("MMIDIDX"), std::string::npos) << message;
  EXPECT_NE(message.find("TNTIDX"), std::string::npos) << message;

  // Megatron-core's multimodal index: one mode byte per sequence after the document index.
  message = open_error(read_all(idx_path(golden("mmidx_example"))) + std::string(2, '\0'));
  EXPECT_NE(message.find("multimodal"), std::string::npos) << message;
}

TEST_P(UnknownLayoutTest, ABrokenMMIDIDXGivesTheSizesOfBothLayouts) {
  std::string bytes = read_all(idx_path(golden("fairseq_mmidx_example")));
  bytes.resize(46);
  const std::string message = open_error(bytes);
  EXPECT_NE(message.find("corrupt index"), std::string::npos) << message;
  // S = 2: fairseq's layout needs 26 + 24 = 50 bytes.
  EXPECT_NE(message.find("50 (fairseq layout, no document index)"), std::string::npos) << message;
  EXPECT_NE(message.find("Megatron-core layout"), std::string::npos) << message;
  bytes.resize(20);
  EXPECT_NE(open_error(bytes).find("20 bytes"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(MappedOrRead, UnknownLayoutTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "mapped" : "read"; });

// --- the readers of Megatron and fairseq on what `dataprep preprocess` writes --------

std::string shell_quote(const std::string& text) { return dufu::testing::shell_quote(text); }

// The Python of the readers' environment (scripts/setup_reference_venv.sh --readers).
std::string readers_python() {
  static const std::string python = [] {
    const auto result =
        dufu::testing::run_command(std::string(DUFU_SOURCE_DIR) + "/scripts/setup_reference_venv.sh --readers");
    if (result.exit_code != 0) return std::string();
    std::string output = result.output;
    while (!output.empty() && output.back() == '\n') output.pop_back();
    return output.substr(output.rfind('\n') + 1);
  }();
  return python;
}

TEST(FairseqLayoutTest, MegatronAndFairseqReadersReadEveryLayoutPreprocessWrites) {
  const std::string python = readers_python();
  ASSERT_FALSE(python.empty()) << "scripts/setup_reference_venv.sh --readers failed";
  TempDir dir;
  const std::string model = dufu::testing::fixture_path("fortunes.model");
  // The first 4000 fortunes (about 0.8 MB) keep the eight runs short.
  const std::string corpus = dir.file("fortunes.jsonl");
  {
    const std::string all = read_all(dufu::testing::fixture_path("fortunes.jsonl"));
    std::size_t end = 0;  // just past the 4000th newline
    for (int line = 0; line < 4000; ++line) {
      end = all.find('\n', end);
      ASSERT_NE(end, std::string::npos) << "the fortunes corpus has fewer than 4000 lines";
      ++end;
    }
    write_all(corpus, all.substr(0, end));
  }
  struct Case {
    std::string impl, layout, dtype, reader;
  };
  // lazy and cached write the same files (the impl only chooses the reader's), so
  // each layout is written once per dtype; int64 covers the widest type.
  const std::vector<Case> cases = {
      {"mmap", "megatron", "uint16", "megatron-core"},   {"mmap", "megatron", "int32", "megatron-core"},
      {"lazy", "megatron", "uint16", "megatron-legacy"}, {"cached", "megatron", "int32", "megatron-legacy"},
      {"mmap", "fairseq", "uint16", "fairseq-mmap"},     {"mmap", "fairseq", "int32", "fairseq-mmap"},
      {"lazy", "fairseq", "", "fairseq-tntidx"},         {"cached", "fairseq", "int64", "fairseq-tntidx"},
  };
  std::string checks;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string prefix = dir.file("shard" + std::to_string(i));
    const auto result = dufu::testing::run_command(
        dufu::testing::dataprep_tool() + " preprocess -q -i " + shell_quote(corpus) + " -o " + shell_quote(prefix) +
        " -m " + shell_quote(model) + " --append-eod --workers 2 --impl " + c.impl + " --layout " + c.layout +
        (c.dtype.empty() ? std::string() : " --dtype " + c.dtype));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    // Without --dtype, fairseq's lazy/cached layout is int32 (its builder's choice).
    const std::string dtype = c.dtype.empty() ? "int32" : c.dtype;
    EXPECT_NE(result.output.find("dtype " + dtype), std::string::npos) << result.output;
    checks += " --shard " + c.reader + " " + dtype + " " + shell_quote(prefix);
  }
  // Each reader on a layout written for another must not read it right: the check can
  // fail, and these are the misreadings of the issue (fairseq on Megatron's layouts).
  checks += " --mismatch fairseq-tntidx int32 " + shell_quote(dir.file("shard3"));
  checks += " --mismatch fairseq-mmap int32 " + shell_quote(dir.file("shard1"));
  checks += " --mismatch megatron-core int32 " + shell_quote(dir.file("shard5"));
  checks += " --mismatch megatron-legacy int32 " + shell_quote(dir.file("shard6"));
  const auto result = dufu::testing::run_command(python + " " + std::string(DUFU_SOURCE_DIR) +
                                                 "/tests/reference/index_readers_reference.py " + shell_quote(model) +
                                                 " " + shell_quote(corpus) + " --append-eod" + checks);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::size_t ok_lines = 0;
  for (std::size_t at = 0; (at = result.output.find("ok: ", at)) != std::string::npos; ++at) {
    if (at == 0 || result.output[at - 1] == '\n') ++ok_lines;
  }
  EXPECT_EQ(ok_lines, cases.size() + 4) << result.output;
}

}  // namespace
}  // namespace dufu::dataprep
