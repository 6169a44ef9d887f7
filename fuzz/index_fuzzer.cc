// The .idx readers (dataprep's shards): Megatron-core's MMIDIDX, Megatron-legacy's
// TNTIDX and fairseq's TNTIDX without doc_idx, told apart by magic and file size.
// An index that opens must be what its accessors promise (sequences back to back,
// document entries from 0 up to the sequence count, out-of-range requests refused),
// the same whether mapped or read into memory; and, beside a .bin of the size it
// needs (or one item short, which must be refused), every token must read back.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dufu/dataprep/indexed_dataset.h"
#include "fuzz_input.h"

namespace {

using dufu::fuzz::fuzz_require;
using dufu::fuzz::refused_cleanly_or_parsed;
using namespace dufu::dataprep;

// The largest .bin written for an index that opens.
constexpr std::uint64_t kMaxBinBytes = std::uint64_t{1} << 20;

void check_index(const Index& index) {
  std::uint64_t next_offset = 0;
  for (std::uint64_t i = 0; i < index.num_sequences(); ++i) {
    fuzz_require(index.sequence_offset(i) == next_offset, "sequences are not back to back");
    next_offset += index.sequence_length(i);
  }
  fuzz_require(next_offset == index.total_tokens(), "the lengths do not add up to total_tokens");
  fuzz_require(index.num_document_entries() >= 1, "no document entries");
  std::uint64_t previous = 0;
  for (std::uint64_t k = 0; k < index.num_document_entries(); ++k) {
    const std::uint64_t entry = index.document_index(k);
    fuzz_require(k > 0 || entry == 0, "the first document entry is not 0");
    fuzz_require(entry >= previous, "document entries decrease");
    previous = entry;
  }
  fuzz_require(previous == index.num_sequences(), "the last document entry is not the sequence count");
  const std::uint64_t sequences = index.num_sequences(), entries = index.num_document_entries();
  const bool refused = !refused_cleanly_or_parsed([&] { (void)index.sequence_length(sequences); }) &&
                       !refused_cleanly_or_parsed([&] { (void)index.sequence_offset(sequences); }) &&
                       !refused_cleanly_or_parsed([&] { (void)index.document_index(entries); });
  fuzz_require(refused, "an out-of-range request was not refused");
}

bool same_index(const Index& a, const Index& b) {
  if (a.layout() != b.layout() || a.dtype() != b.dtype() || a.version() != b.version() ||
      a.num_sequences() != b.num_sequences() || a.num_document_entries() != b.num_document_entries() ||
      a.total_tokens() != b.total_tokens() || a.file_size() != b.file_size()) {
    return false;
  }
  for (std::uint64_t i = 0; i < a.num_sequences(); ++i) {
    if (a.sequence_length(i) != b.sequence_length(i) || a.sequence_offset(i) != b.sequence_offset(i)) return false;
  }
  for (std::uint64_t k = 0; k < a.num_document_entries(); ++k) {
    if (a.document_index(k) != b.document_index(k)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  const std::string idx = write_input("shard.idx", data, size);
  const std::string prefix = idx.substr(0, idx.size() - 4);

  std::vector<Index> opened;
  for (const bool map : {true, false}) {
    refused_cleanly_or_parsed([&] { opened.push_back(Index::open(idx, map)); });
  }
  if (opened.empty()) return 0;
  fuzz_require(opened.size() == 2, "an index opens mapped but not read, or the other way round");
  check_index(opened[0]);
  fuzz_require(same_index(opened[0], opened[1]), "the mapped and the read index differ");

  const Index& index = opened[0];
  const std::uint64_t item = dtype_size(index.dtype());
  if (index.total_tokens() > kMaxBinBytes / item) return 0;
  const bool short_bin = (size & 1) != 0 && index.total_tokens() > 0;
  // Token values 1..127 (from the input's bytes) fit every integer dtype and int32,
  // also after fairseq's id+1 is undone.
  std::vector<std::int32_t> values(index.total_tokens() - (short_bin ? 1 : 0));
  std::vector<std::uint8_t> bin(values.size() * item);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = 1 + data[i % size] % 127;
    bin[i * item] = static_cast<std::uint8_t>(values[i]);
  }
  write_input("shard.bin", bin.data(), bin.size());

  const IndexImpl impl = (size & 2) != 0 ? IndexImpl::kLazy : IndexImpl::kMmap;
  std::unique_ptr<IndexedDataset> dataset;
  refused_cleanly_or_parsed([&] { dataset = IndexedDataset::open(prefix, impl); });
  if (short_bin) {
    fuzz_require(dataset == nullptr, "a .bin one item short was accepted");
    return 0;
  }
  fuzz_require(dataset != nullptr, "an index that opens alone does not open beside a .bin of its size");
  const std::int32_t bias = stored_id_offset(index.layout());
  for (std::uint64_t i = 0; i < dataset->num_sequences(); ++i) {
    // Floating-point dtypes are refused as tokens (but no tokens read as none); every
    // integer dtype must read.
    std::vector<std::int32_t> tokens;
    const bool read = refused_cleanly_or_parsed([&] { tokens = dataset->sequence(i); });
    const bool readable = dtype_is_integer(dataset->dtype()) || dataset->sequence_length(i) == 0;
    fuzz_require(read == readable, "a sequence of an open shard does not read, or one of floats does");
    if (!read) continue;
    fuzz_require(tokens.size() == dataset->sequence_length(i), "a sequence reads with the wrong length");
    const std::uint64_t first = index.sequence_offset(i);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      fuzz_require(tokens[t] == values[first + t] - bias, "a token reads back as another value");
    }
  }
  return 0;
}
