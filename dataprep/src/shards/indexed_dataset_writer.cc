// Writes indexed token shards: tokens stream into the .bin as they arrive, the small
// per-sequence index stays in memory until commit() writes the .idx (Megatron's MMIDIDX
// or TNTIDX, or fairseq's variants of both without a document index, docs/formats.md
// sections 3-5) and replaces both as a pair. In anonymous mode (a divided job's parts)
// the .bin has no name and the index is handed over in memory instead.
#include "dufu/dataprep/indexed_dataset_writer.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/dataprep/indexed_dataset.h"

static_assert(std::endian::native == std::endian::little,
              "dufu's on-disk formats are little-endian and written without byte swapping");

namespace dufu::dataprep {
namespace {

DType writable_dtype(DType dtype, IndexLayout layout) {
  if (!dtype_is_integer(dtype)) {
    DUFU_FAIL("cannot write tokens as ", dtype_name(dtype), ": token dtypes are integers");
  }
  // fairseq's IndexedDataset turns each item into a tensor with torch.from_numpy, which
  // refuses these (torch 1.13: "can't convert np.ndarray of type numpy.uint16"); its
  // mmap reader widens to int64 first and reads them all.
  if (layout == IndexLayout::kFairseqTNTIDX &&
      (dtype == DType::kUInt16 || dtype == DType::kUInt32 || dtype == DType::kUInt64)) {
    DUFU_FAIL("cannot write fairseq's TNTIDX as ", dtype_name(dtype),
              ": fairseq's lazy/cached reader converts items with torch.from_numpy, which has no ", dtype_name(dtype),
              "; use int32 (what fairseq's own builder writes) or int64");
  }
  return dtype;
}

// Streams `count` int64 values produced in order by value_at(i), in bounded chunks,
// so multi-GB index arrays never exist twice in memory.
template <typename ValueAt>
void write_int64s(AtomicFile& file, std::uint64_t count, ValueAt value_at) {
  constexpr std::uint64_t kChunk = 8192;
  std::array<std::int64_t, kChunk> chunk;
  for (std::uint64_t done = 0; done < count;) {
    const std::uint64_t n = std::min(kChunk, count - done);
    for (std::uint64_t j = 0; j < n; ++j) chunk[j] = value_at(done + j);
    file.write(chunk.data(), n * sizeof(std::int64_t));
    done += n;
  }
}

template <typename Vector>
void write_vector(AtomicFile& file, const Vector& values) {
  if (!values.empty()) file.write(values.data(), values.size() * sizeof(values[0]));
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, IndexLayout layout, DType dtype)
    : prefix_(std::move(prefix)),
      layout_(layout),
      dtype_(writable_dtype(dtype, layout)),
      lock_(std::make_unique<ShardOutputLock>(prefix_)),
      bin_(std::in_place_type<AtomicFile>, bin_path(prefix_)) {}

IndexedDatasetWriter::IndexedDatasetWriter(AnonymousFile bin, std::string description, IndexLayout layout, DType dtype)
    : prefix_(std::move(description)),
      layout_(layout),
      dtype_(writable_dtype(dtype, layout)),
      bin_(std::in_place_type<AnonymousFile>, std::move(bin)) {}

// AtomicFile's destructor removes the uncommitted .bin temporary; the .idx temporary
// only ever exists inside commit(). An anonymous .bin is freed when it is closed.
IndexedDatasetWriter::~IndexedDatasetWriter() = default;

std::uint64_t IndexedDatasetWriter::bin_bytes() const { return tokens_ * dtype_size(dtype_); }

void IndexedDatasetWriter::add_sequence(std::span<const std::int32_t> tokens) {
  if (committed_) DUFU_FAIL("cannot add to '", prefix_, "': it was already committed");
  const std::size_t n = tokens.size();
  if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    DUFU_FAIL("a sequence of ", n, " tokens is too long for '", prefix_,
              "': index lengths are int32; split it into several sequences");
  }
  encode(tokens);
  lengths_.push_back(static_cast<std::int32_t>(n));
  tokens_ += n;
}

// Validates the whole sequence before writing any byte, so a bad token leaves the
// writer consistent (the caller may skip the document and go on).
void IndexedDatasetWriter::encode(std::span<const std::int32_t> tokens) {
  const std::size_t n = tokens.size();
  const std::int64_t offset = stored_id_offset(layout_);
  auto encode_as = [&]<typename T>(T) {
    if constexpr (std::is_same_v<T, std::int32_t>) {
      if (offset == 0) {
        if (n > 0) write_bin(tokens.data(), n * sizeof(T));
        return;
      }
    }
    std::int64_t lo = 0, hi = 0;
    if (n > 0) lo = hi = tokens[0];
    for (const std::int32_t token : tokens) {
      lo = std::min<std::int64_t>(lo, token);
      hi = std::max<std::int64_t>(hi, token);
    }
    if (!std::in_range<T>(lo + offset) || !std::in_range<T>(hi + offset)) {
      const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                    [&](std::int32_t t) { return !std::in_range<T>(std::int64_t{t} + offset); });
      DUFU_FAIL("token ", *bad, " (position ", bad - tokens.begin(), " of its sequence) does not fit dtype ",
                dtype_name(dtype_), " of ", bin_name(),
                offset != 0 ? str_cat(" as id + ", offset, ", which fairseq's TNTIDX stores") : std::string(),
                dtype_ == DType::kUInt16 ? ". HINT: vocabularies of 65500 or more need int32" : "");
    }
    if (encode_buffer_.size() < n * sizeof(T)) encode_buffer_.resize(n * sizeof(T));
    std::byte* out = encode_buffer_.data();
    for (std::size_t i = 0; i < n; ++i) {
      const T value = static_cast<T>(std::int64_t{tokens[i]} + offset);
      std::memcpy(out + i * sizeof(T), &value, sizeof(T));
    }
    if (n > 0) write_bin(out, n * sizeof(T));
  };
  switch (dtype_) {
    case DType::kUInt8:
      return encode_as(std::uint8_t{});
    case DType::kInt8:
      return encode_as(std::int8_t{});
    case DType::kInt16:
      return encode_as(std::int16_t{});
    case DType::kUInt16:
      return encode_as(std::uint16_t{});
    case DType::kInt32:
      return encode_as(std::int32_t{});
    case DType::kUInt32:
      return encode_as(std::uint32_t{});
    case DType::kInt64:
      return encode_as(std::int64_t{});
    case DType::kUInt64:
      return encode_as(std::uint64_t{});
    case DType::kFloat32:
    case DType::kFloat64:
      break;
  }
  DUFU_FAIL("internal error: float dtype in writer");
}

void IndexedDatasetWriter::end_document() {
  if (committed_) DUFU_FAIL("cannot add to '", prefix_, "': it was already committed");
  const auto sequences = static_cast<std::int64_t>(lengths_.size());
  if (!layout_has_document_index(layout_) && sequences - document_indices_.back() != 1) {
    DUFU_FAIL("cannot end a document of ", sequences - document_indices_.back(), " sequences in '", prefix_,
              "': fairseq's layout ", layout_name(layout_),
              " has no document index, so each document must be exactly one sequence");
  }
  document_indices_.push_back(sequences);
}

void IndexedDatasetWriter::append(const IndexedDataset& other) {
  if (committed_) DUFU_FAIL("cannot add to '", prefix_, "': it was already committed");
  if (other.dtype() != dtype_) {
    DUFU_FAIL("cannot append '", other.prefix(), "' (", dtype_name(other.dtype()), ") to '",
              prefix_, "' (", dtype_name(dtype_), "): dtypes differ");
  }
  const auto base = static_cast<std::int64_t>(lengths_.size());
  if (document_indices_.back() != base) {
    DUFU_FAIL("cannot append '", other.prefix(), "' to '", prefix_,
              "' while a document is open; call end_document() first");
  }
  const Index& index = other.index();
  if (!layout_has_document_index(layout_)) {
    for (std::uint64_t k = 0; k + 1 < index.num_document_entries(); ++k) {
      const std::uint64_t sequences = index.document_index(k + 1) - index.document_index(k);
      if (sequences != 1) {
        DUFU_FAIL("cannot append '", other.prefix(), "' to '", prefix_, "': its document ", k, " has ", sequences,
                  " sequences, and fairseq's layout ", layout_name(layout_),
                  " has no document index to keep them together");
      }
    }
  }
  if (stored_id_offset(index.layout()) != stored_id_offset(layout_)) {
    // One side stores id + 1 and the other not, so the bytes cannot be copied as they
    // are: go through tokens. (A token that does not fit leaves the writer partly
    // appended; merge then discards it.)
    for (std::uint64_t k = 0; k + 1 < index.num_document_entries(); ++k) {
      for (std::uint64_t i = index.document_index(k); i < index.document_index(k + 1); ++i) {
        add_sequence(other.sequence(i));
      }
      end_document();
    }
    return;
  }

  // Lengths first, undone on failure, so a rejected input leaves the writer unchanged.
  lengths_.reserve(lengths_.size() + index.num_sequences());
  for (std::uint64_t i = 0; i < index.num_sequences(); ++i) {
    const std::uint64_t length = index.sequence_length(i);
    if (length > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
      lengths_.resize(static_cast<std::size_t>(base));
      DUFU_FAIL("sequence ", i, " of '", other.prefix(), "' has ", length,
                " tokens, more than the int32 lengths of '", prefix_, "' can hold");
    }
    lengths_.push_back(static_cast<std::int32_t>(length));
  }
  // The index guarantees contiguous sequences, so the .bin copies over unchanged.
  constexpr std::uint64_t kChunkBytes = 4 << 20;
  std::vector<std::byte> chunk(static_cast<std::size_t>(std::min(kChunkBytes, other.bin_size())));
  for (std::uint64_t done = 0; done < other.bin_size();) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), other.bin_size() - done);
    other.read_bytes(done, n, chunk.data());
    write_bin(chunk.data(), n);
    done += n;
  }
  for (std::uint64_t k = 1; k < index.num_document_entries(); ++k) {
    document_indices_.push_back(base + static_cast<std::int64_t>(index.document_index(k)));
  }
  tokens_ += index.total_tokens();
}

void IndexedDatasetWriter::write_bin(const void* data, std::size_t size) {
  std::visit([&](auto& file) { file.write(data, size); }, bin_);
}

std::string IndexedDatasetWriter::bin_name() const {
  if (const AnonymousFile* file = std::get_if<AnonymousFile>(&bin_)) return file->description();
  return str_cat("'", bin_path(prefix_), "'");
}

AtomicFile& IndexedDatasetWriter::named_bin() {
  if (AtomicFile* file = std::get_if<AtomicFile>(&bin_)) return *file;
  DUFU_FAIL("'", prefix_, "' has no name to commit to: it was written anonymously (use finish_anonymous())");
}

void IndexedDatasetWriter::check_documents_closed() const {
  if (committed_) DUFU_FAIL("'", prefix_, "' was already committed");
  const auto sequences = static_cast<std::int64_t>(lengths_.size());
  if (document_indices_.back() != sequences) {
    DUFU_FAIL("cannot commit '", prefix_, "': its last ", sequences - document_indices_.back(),
              " sequence(s) are not closed by end_document()");
  }
}

AtomicFile IndexedDatasetWriter::finish_index() const {
  check_documents_closed();
  AtomicFile idx(idx_path(prefix_));
  if (layout_ == IndexLayout::kMMIDIDX || layout_ == IndexLayout::kFairseqMMIDIDX) {
    write_mmidx(idx);
  } else {
    write_tntidx(idx);
  }
  return idx;
}

std::uint64_t IndexedDatasetWriter::commit() {
  AtomicFile& bin = named_bin();
  AtomicFile idx = finish_index();
  const std::uint64_t bytes = bin.bytes_written() + idx.bytes_written();
  commit_shard_pair(bin, idx, prefix_);
  committed_ = true;
  lock_.reset();
  return bytes;
}

std::uint64_t IndexedDatasetWriter::commit_scratch() {
  AtomicFile& bin = named_bin();
  AtomicFile idx = finish_index();
  const std::uint64_t bytes = bin.bytes_written() + idx.bytes_written();
  bin.commit();
  idx.commit();
  committed_ = true;
  lock_.reset();
  return bytes;
}

AnonymousShard IndexedDatasetWriter::finish_anonymous() {
  AnonymousFile* bin = std::get_if<AnonymousFile>(&bin_);
  if (bin == nullptr) DUFU_FAIL("'", prefix_, "' is written under its name: commit it instead");
  check_documents_closed();
  bin->flush();
  committed_ = true;
  AnonymousShard shard{.bin = std::move(*bin),
                       .lengths = std::exchange(lengths_, {}),
                       .document_indices = std::exchange(document_indices_, {0}),
                       .tokens = std::exchange(tokens_, 0)};
  return shard;
}

// MMIDIDX, and fairseq's MMIDIDX without D and without the document index.
void IndexedDatasetWriter::write_mmidx(AtomicFile& idx) const {
  const bool documents = layout_has_document_index(layout_);
  idx.write(kMMIDIDXMagic, sizeof(kMMIDIDXMagic));
  idx.write_value(kIndexVersion);
  idx.write_value(static_cast<std::uint8_t>(dtype_));
  idx.write_value(static_cast<std::uint64_t>(lengths_.size()));
  if (documents) idx.write_value(static_cast<std::uint64_t>(document_indices_.size()));
  write_vector(idx, lengths_);
  // Byte offsets accumulate in 64 bits: an int32 sum wraps once the .bin passes 2 GiB.
  const std::uint64_t item = dtype_size(dtype_);
  std::uint64_t pointer = 0;
  write_int64s(idx, lengths_.size(), [&](std::uint64_t i) {
    const auto at = static_cast<std::int64_t>(pointer);
    pointer += static_cast<std::uint64_t>(lengths_[i]) * item;
    return at;
  });
  if (documents) write_vector(idx, document_indices_);
}

// Megatron-legacy's TNTIDX, and fairseq's without doc_count and doc_idx.
void IndexedDatasetWriter::write_tntidx(AtomicFile& idx) const {
  const bool documents = layout_has_document_index(layout_);
  const std::uint64_t n = lengths_.size();
  idx.write(kTNTIDXMagic, sizeof(kTNTIDXMagic));
  idx.write_value(kIndexVersion);
  idx.write_value(static_cast<std::uint64_t>(dtype_));
  idx.write_value(static_cast<std::uint64_t>(dtype_size(dtype_)));
  idx.write_value(n);                                                     // N items
  idx.write_value(n);                                                     // s: one size per item
  if (documents) idx.write_value(static_cast<std::uint64_t>(document_indices_.size()));  // doc_count
  write_int64s(idx, n + 1, [](std::uint64_t i) { return static_cast<std::int64_t>(i); });
  std::int64_t elements = 0;  // data_offsets count elements, not bytes
  write_int64s(idx, n + 1, [&](std::uint64_t i) {
    const std::int64_t at = elements;
    if (i < n) elements += lengths_[i];
    return at;
  });
  write_int64s(idx, n, [&](std::uint64_t i) { return static_cast<std::int64_t>(lengths_[i]); });
  if (documents) write_vector(idx, document_indices_);
}

}  // namespace dufu::dataprep
