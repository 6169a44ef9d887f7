// Opens and validates .idx files: MMIDIDX (Megatron-core), TNTIDX (Megatron-legacy /
// OSLO) and fairseq's variants of both without a document index; a file in any other
// layout is refused by name. Everything a reader later trusts (array bounds,
// contiguous sequences, closed documents) is checked here, once, so that the accessors
// can stay cheap.
// The names of the impls and layouts, and of a shard's two files, are here too: the
// reader, the writer and the shard output all use them.
#include "dufu/dataprep/index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>

#include "dufu/common/error.h"
#include "dufu/common/mapped_file.h"
#include "dufu/common/read_only_file.h"

// The arrays are copied straight from file bytes into host integers.
static_assert(std::endian::native == std::endian::little,
              "dufu's on-disk formats are little-endian and read without byte swapping");

namespace dufu::dataprep {

IndexImpl parse_impl(std::string_view name) {
  if (name == "mmap") return IndexImpl::kMmap;
  if (name == "lazy") return IndexImpl::kLazy;
  if (name == "cached") return IndexImpl::kCached;
  DUFU_FAIL("unknown dataset impl '", name, "' (expected mmap, lazy or cached)");
}

std::string_view impl_name(IndexImpl impl) {
  switch (impl) {
    case IndexImpl::kMmap:
      return "mmap";
    case IndexImpl::kLazy:
      return "lazy";
    case IndexImpl::kCached:
      return "cached";
  }
  DUFU_FAIL("internal error: unknown dataset impl ", static_cast<int>(impl));
}

std::string_view layout_name(IndexLayout layout) {
  switch (layout) {
    case IndexLayout::kMMIDIDX:
      return "MMIDIDX";
    case IndexLayout::kTNTIDX:
      return "TNTIDX";
    case IndexLayout::kFairseqTNTIDX:
      return "TNTIDX (fairseq)";
    case IndexLayout::kFairseqMMIDIDX:
      return "MMIDIDX (fairseq)";
  }
  DUFU_FAIL("internal error: unknown index layout ", static_cast<int>(layout));
}

LayoutFamily parse_layout_family(std::string_view name) {
  if (name == "megatron") return LayoutFamily::kMegatron;
  if (name == "fairseq") return LayoutFamily::kFairseq;
  DUFU_FAIL("unknown index layout family '", name, "' (expected megatron or fairseq)");
}

std::string_view layout_family_name(LayoutFamily family) {
  return family == LayoutFamily::kFairseq ? "fairseq" : "megatron";
}

IndexLayout layout_for_impl(IndexImpl impl, LayoutFamily family) {
  if (family == LayoutFamily::kFairseq) {
    return impl == IndexImpl::kMmap ? IndexLayout::kFairseqMMIDIDX : IndexLayout::kFairseqTNTIDX;
  }
  return impl == IndexImpl::kMmap ? IndexLayout::kMMIDIDX : IndexLayout::kTNTIDX;
}

bool layout_has_document_index(IndexLayout layout) {
  return layout == IndexLayout::kMMIDIDX || layout == IndexLayout::kTNTIDX;
}

std::int32_t stored_id_offset(IndexLayout layout) { return layout == IndexLayout::kFairseqTNTIDX ? 1 : 0; }

std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }
std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string sidecar_path(const std::string& prefix) { return prefix + ".dufu.json"; }

struct Index::Storage {
  std::optional<MappedFile> mapped;
  std::vector<std::byte> owned;
  const std::byte* data = nullptr;
  std::uint64_t size = 0;
};

namespace {

// fairseq's Huffman-coded layout (fairseq/data/huffman), which dufu does not read.
constexpr char kHuffmanMagic[] = {'H', 'U', 'F', 'F', 'I', 'D', 'X', '\0', '\0'};

template <typename T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

// Sums of header-derived sizes. A corrupt header can hold counts near 2^64, and a
// wrapped sum could then equal the real file size; once overflowed, it never matches.
class CheckedSize {
 public:
  explicit CheckedSize(std::uint64_t start) : value_(start) {}
  CheckedSize& add(std::uint64_t count, std::uint64_t width) {
    std::uint64_t bytes = 0;
    overflow_ = overflow_ || __builtin_mul_overflow(count, width, &bytes) ||
                __builtin_add_overflow(value_, bytes, &value_);
    return *this;
  }
  bool equals(std::uint64_t size) const { return !overflow_ && value_ == size; }
  std::string str() const { return overflow_ ? "more than 2^64" : std::to_string(value_); }

 private:
  std::uint64_t value_;
  bool overflow_ = false;
};

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  DUFU_FAIL("corrupt index '", path, "': ", what);
}

[[noreturn]] void unknown_layout(const std::string& path, const std::string& what) {
  DUFU_FAIL("unknown index layout '", path, "': ", what);
}

// The first bytes as hex and, where printable, as text: "54455354 ("TEST")".
std::string describe_prefix(const std::byte* data, std::uint64_t size) {
  std::ostringstream hex;
  std::string text;
  for (std::uint64_t i = 0; i < std::min<std::uint64_t>(size, 9); ++i) {
    constexpr char kDigits[] = "0123456789abcdef";
    const auto byte = static_cast<unsigned>(data[i]);
    hex << kDigits[byte >> 4] << kDigits[byte & 15];
    text += byte >= 0x20 && byte < 0x7f ? static_cast<char>(byte) : '.';
  }
  return str_cat(hex.str(), " (\"", text, "\")");
}

bool starts_with(const std::byte* data, std::uint64_t size, const char* magic, std::size_t magic_size) {
  return size >= magic_size && std::memcmp(data, magic, magic_size) == 0;
}

// What the header says; Index::open copies it into the Index once it is validated.
struct Header {
  IndexLayout layout = IndexLayout::kMMIDIDX;
  DType dtype = DType::kUInt16;
  std::uint64_t version = 0;
  std::uint64_t sequences = 0;
  std::uint64_t document_entries = 0;
  std::uint64_t lengths_at = 0, pointers_at = 0, documents_at = 0;
  std::uint64_t dim_offsets_at = 0;  // TNTIDX only
};

void check_version(const std::string& path, std::uint64_t version) {
  if (version != kIndexVersion) {
    corrupt(path, str_cat("unsupported version ", version, " (only version 1 exists)"));
  }
}

// Megatron-core's MMIDIDX has D after S and the document index after the pointers;
// fairseq's has neither. The file size tells them apart: both cannot match, since
// Megatron's is 8(D + 1) bytes longer for the same S.
Header parse_mmidx(const std::string& path, const std::byte* data, std::uint64_t size) {
  if (size < kFairseqMMIDIDXHeaderBytes) {
    corrupt(path, str_cat("file is ", size, " bytes, shorter than the ", kFairseqMMIDIDXHeaderBytes,
                          "-byte header of fairseq's MMIDIDX (Megatron-core's is ", kMMIDIDXHeaderBytes, ")"));
  }
  Header h;
  h.version = load<std::uint64_t>(data + 9);
  check_version(path, h.version);
  h.dtype = dtype_from_code(load<std::uint8_t>(data + 17), path);
  h.sequences = load<std::uint64_t>(data + 18);
  CheckedSize fairseq_size(kFairseqMMIDIDXHeaderBytes);
  fairseq_size.add(h.sequences, 12);
  std::optional<std::uint64_t> document_entries;
  CheckedSize megatron_size(kMMIDIDXHeaderBytes);
  CheckedSize multimodal_size(kMMIDIDXHeaderBytes);
  if (size >= kMMIDIDXHeaderBytes) {
    document_entries = load<std::uint64_t>(data + 26);
    megatron_size.add(h.sequences, 12).add(*document_entries, 8);
    multimodal_size.add(h.sequences, 13).add(*document_entries, 8);
  }
  if (document_entries && megatron_size.equals(size)) {
    h.layout = IndexLayout::kMMIDIDX;
    h.document_entries = *document_entries;
    h.lengths_at = kMMIDIDXHeaderBytes;
  } else if (fairseq_size.equals(size)) {
    h.layout = IndexLayout::kFairseqMMIDIDX;
    h.document_entries = h.sequences + 1;
    h.lengths_at = kFairseqMMIDIDXHeaderBytes;
  } else if (document_entries && h.sequences > 0 && multimodal_size.equals(size)) {
    unknown_layout(path, str_cat("its size (", size,
                                 " bytes) is that of Megatron-core's multimodal MMIDIDX "
                                 "(one sequence mode byte per sequence after the document index), "
                                 "which dufu does not read"));
  } else {
    corrupt(path, str_cat("file is ", size, " bytes but its header (S=", h.sequences,
                          document_entries ? str_cat(", D=", *document_entries) : std::string(), ") needs ",
                          document_entries ? megatron_size.str() : str_cat("at least ", kMMIDIDXHeaderBytes),
                          " (Megatron-core layout) or ", fairseq_size.str(), " (fairseq layout, no document index)"));
  }
  h.pointers_at = h.lengths_at + 4 * h.sequences;
  h.documents_at = h.pointers_at + 8 * h.sequences;
  return h;
}

Header parse_tntidx(const std::string& path, const std::byte* data, std::uint64_t size) {
  if (size < kFairseqTNTIDXHeaderBytes) {
    corrupt(path, str_cat("file is ", size, " bytes, shorter than the ", kFairseqTNTIDXHeaderBytes,
                          "-byte TNTIDX header"));
  }
  Header h;
  h.version = load<std::uint64_t>(data + 8);
  check_version(path, h.version);
  h.dtype = dtype_from_code(load<std::uint64_t>(data + 16), path);
  const auto element_size = load<std::uint64_t>(data + 24);
  if (element_size != dtype_size(h.dtype)) {
    corrupt(path, str_cat("element size ", element_size, " does not match dtype ",
                          dtype_name(h.dtype), " (", dtype_size(h.dtype), " bytes)"));
  }
  h.sequences = load<std::uint64_t>(data + 32);
  const auto sizes_count = load<std::uint64_t>(data + 40);

  // fairseq omits doc_count and doc_idx; the file size says which layout this is.
  // (The two cannot both fit: in a fairseq file the would-be doc_count is
  // dim_offsets[0] = 0, and then the legacy layout is 8 bytes longer.)
  // dim_offsets and data_offsets hold N+1 entries each: 16(N+1) = 16N + 16.
  CheckedSize fairseq_size(kFairseqTNTIDXHeaderBytes);
  fairseq_size.add(h.sequences, 16).add(1, 16).add(sizes_count, 8);
  std::optional<std::uint64_t> doc_count;
  CheckedSize legacy_size(kTNTIDXHeaderBytes);
  if (size >= kTNTIDXHeaderBytes) {
    doc_count = load<std::uint64_t>(data + 48);
    legacy_size.add(h.sequences, 16).add(1, 16).add(sizes_count, 8).add(*doc_count, 8);
  }

  std::uint64_t arrays_at = 0;
  if (doc_count && legacy_size.equals(size)) {
    h.layout = IndexLayout::kTNTIDX;
    h.document_entries = *doc_count;
    arrays_at = kTNTIDXHeaderBytes;
  } else if (fairseq_size.equals(size)) {
    h.layout = IndexLayout::kFairseqTNTIDX;
    h.document_entries = h.sequences + 1;
    arrays_at = kFairseqTNTIDXHeaderBytes;
  } else {
    corrupt(path,
            str_cat("file is ", size, " bytes but its header (N=", h.sequences, ", s=", sizes_count,
                    doc_count ? str_cat(", doc_count=", *doc_count) : std::string(), ") needs ",
                    doc_count ? legacy_size.str() : str_cat("at least ", kTNTIDXHeaderBytes),
                    " (Megatron-legacy layout) or ", fairseq_size.str(),
                    " (fairseq layout, no doc_idx)"));
  }
  if (sizes_count != h.sequences) {
    DUFU_FAIL("unsupported index '", path, "': ", sizes_count, " sizes for ", h.sequences,
              " items; only 1-D token sequences (s == N) are supported");
  }
  h.dim_offsets_at = arrays_at;
  h.pointers_at = h.dim_offsets_at + 8 * (h.sequences + 1);
  h.lengths_at = h.pointers_at + 8 * (h.sequences + 1);
  h.documents_at = h.lengths_at + 8 * h.sequences;
  return h;
}

// Walks the per-sequence arrays once. Requiring each sequence to start where the
// previous one ends (as every writer does) bounds every later read by the .bin size
// check, and is what lets merge copy .bin bytes wholesale. Returns the total tokens.
template <typename Length>
std::uint64_t check_sequences(const std::string& path, const std::byte* data, const Header& h,
                              std::uint64_t pointer_unit, std::string_view unit_name) {
  std::uint64_t total = 0;
  for (std::uint64_t i = 0; i < h.sequences; ++i) {
    const auto length = load<Length>(data + h.lengths_at + sizeof(Length) * i);
    if (length < 0) corrupt(path, str_cat("sequence ", i, " has negative length ", length));
    const auto pointer = load<std::int64_t>(data + h.pointers_at + 8 * i);
    std::uint64_t expected = 0;
    if (__builtin_mul_overflow(total, pointer_unit, &expected) ||
        static_cast<std::uint64_t>(pointer) != expected || pointer < 0) {
      corrupt(path, str_cat("sequence ", i, " starts at ", unit_name, " ", pointer,
                            " but the sequences before it end at ", unit_name, " ", expected,
                            " (sequences must be stored contiguously)"));
    }
    if (__builtin_add_overflow(total, static_cast<std::uint64_t>(length), &total)) {
      corrupt(path, "the sequence lengths add up to more than 2^64 tokens");
    }
  }
  return total;
}

void check_tntidx_offsets(const std::string& path, const std::byte* data, const Header& h,
                          std::uint64_t total_tokens) {
  for (std::uint64_t i = 0; i <= h.sequences; ++i) {
    const auto dim = load<std::int64_t>(data + h.dim_offsets_at + 8 * i);
    if (dim < 0 || static_cast<std::uint64_t>(dim) != i) {
      corrupt(path, str_cat("dim_offsets[", i, "] is ", dim, ", expected ", i,
                            " for 1-D token sequences"));
    }
  }
  const auto end = load<std::int64_t>(data + h.pointers_at + 8 * h.sequences);
  if (end < 0 || static_cast<std::uint64_t>(end) != total_tokens) {
    corrupt(path, str_cat("data_offsets ends at element ", end, " but the sizes add up to ",
                          total_tokens));
  }
}

void check_documents(const std::string& path, const std::byte* data, const Header& h) {
  if (h.document_entries == 0) {
    corrupt(path, "document_indices is empty; it must at least hold the leading 0");
  }
  std::int64_t previous = 0;
  for (std::uint64_t k = 0; k < h.document_entries; ++k) {
    const auto entry = load<std::int64_t>(data + h.documents_at + 8 * k);
    if (k == 0 && entry != 0) {
      corrupt(path, str_cat("document_indices[0] is ", entry, ", expected 0"));
    }
    if (entry < previous) {
      corrupt(path, str_cat("document_indices[", k, "] = ", entry, " is smaller than entry ", k - 1,
                            " = ", previous));
    }
    previous = entry;
  }
  if (static_cast<std::uint64_t>(previous) != h.sequences) {
    corrupt(path, str_cat("document_indices ends at ", previous, " but there are ", h.sequences,
                          " sequences (the last document is not closed)"));
  }
}

}  // namespace

Index::Index() = default;
Index::Index(Index&&) noexcept = default;
Index& Index::operator=(Index&&) noexcept = default;
Index::~Index() = default;

Index Index::open(const std::string& path, bool map) {
  Index index;
  index.path_ = path;
  index.storage_ = std::make_unique<Storage>();
  Storage& storage = *index.storage_;
  if (map) {
    storage.mapped.emplace(MappedFile::open(path));
    storage.data = storage.mapped->data();
    storage.size = storage.mapped->size();
  } else {
    storage.owned = ReadOnlyFile::open(path).read_all();
    storage.data = storage.owned.data();
    storage.size = storage.owned.size();
  }
  const std::byte* data = storage.data;
  const std::uint64_t size = storage.size;

  Header h;
  if (starts_with(data, size, kMMIDIDXMagic, sizeof(kMMIDIDXMagic))) {
    h = parse_mmidx(path, data, size);
  } else if (starts_with(data, size, kTNTIDXMagic, sizeof(kTNTIDXMagic))) {
    h = parse_tntidx(path, data, size);
  } else if (starts_with(data, size, kHuffmanMagic, sizeof(kHuffmanMagic))) {
    unknown_layout(path, "its magic \"HUFFIDX\" is fairseq's Huffman-coded layout, which dufu does not read");
  } else if (size < kFairseqMMIDIDXHeaderBytes) {
    corrupt(path, str_cat("file is ", size, " bytes, too short for any index header (", kFairseqMMIDIDXHeaderBytes,
                          " bytes at least)"));
  } else {
    unknown_layout(path, str_cat("its magic ", describe_prefix(data, size),
                                 ", which is neither \"MMIDIDX\\0\\0\" (Megatron-core; fairseq mmap) nor "
                                 "\"TNTIDX\\0\\0\" (Megatron-legacy; fairseq lazy/cached)"));
  }

  if (h.layout == IndexLayout::kMMIDIDX || h.layout == IndexLayout::kFairseqMMIDIDX) {
    index.total_tokens_ = check_sequences<std::int32_t>(path, data, h, dtype_size(h.dtype), "byte");
  } else {
    index.total_tokens_ = check_sequences<std::int64_t>(path, data, h, 1, "element");
    check_tntidx_offsets(path, data, h, index.total_tokens_);
  }
  if (layout_has_document_index(h.layout)) check_documents(path, data, h);

  index.layout_ = h.layout;
  index.dtype_ = h.dtype;
  index.version_ = h.version;
  index.num_sequences_ = h.sequences;
  index.num_document_entries_ = h.document_entries;
  index.lengths_at_ = h.lengths_at;
  index.pointers_at_ = h.pointers_at;
  index.documents_at_ = h.documents_at;
  return index;
}

std::uint64_t Index::sequence_length(std::uint64_t i) const {
  if (i >= num_sequences_) {
    DUFU_FAIL("sequence ", i, " is out of range: '", path_, "' has ", num_sequences_, " sequences");
  }
  const std::byte* data = storage_->data;
  // Lengths were checked non-negative on open.
  if (layout_ == IndexLayout::kMMIDIDX || layout_ == IndexLayout::kFairseqMMIDIDX) {
    return static_cast<std::uint64_t>(load<std::int32_t>(data + lengths_at_ + 4 * i));
  }
  return static_cast<std::uint64_t>(load<std::int64_t>(data + lengths_at_ + 8 * i));
}

std::uint64_t Index::sequence_offset(std::uint64_t i) const {
  if (i >= num_sequences_) {
    DUFU_FAIL("sequence ", i, " is out of range: '", path_, "' has ", num_sequences_, " sequences");
  }
  const auto pointer =
      static_cast<std::uint64_t>(load<std::int64_t>(storage_->data + pointers_at_ + 8 * i));
  // MMIDIDX stores byte offsets, TNTIDX element offsets.
  const bool bytes = layout_ == IndexLayout::kMMIDIDX || layout_ == IndexLayout::kFairseqMMIDIDX;
  return bytes ? pointer / dtype_size(dtype_) : pointer;
}

std::uint64_t Index::document_index(std::uint64_t entry) const {
  if (entry >= num_document_entries_) {
    DUFU_FAIL("document index entry ", entry, " is out of range: '", path_, "' has ",
              num_document_entries_, " entries");
  }
  if (!layout_has_document_index(layout_)) return entry;
  return static_cast<std::uint64_t>(load<std::int64_t>(storage_->data + documents_at_ + 8 * entry));
}

std::uint64_t Index::file_size() const { return storage_->size; }

}  // namespace dufu::dataprep
