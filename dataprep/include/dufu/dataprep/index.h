// The .idx of an indexed token shard: the layouts dufu reads and writes (Megatron's
// MMIDIDX for impl "mmap", TNTIDX for "lazy" and "cached", and fairseq's variants of
// both without a document index; its TNTIDX stores id + 1), the names of a shard's two
// files, and Index, the parsed and validated .idx. The .bin reader is
// indexed_dataset.h, the writer indexed_dataset_writer.h.
// Byte layouts: docs/formats.md sections 1-6. All counts and offsets are 64-bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dufu/dataprep/dtype.h"

namespace dufu::dataprep {

// How the .bin is served when reading (and which .idx layout is written).
enum class IndexImpl { kMmap, kLazy, kCached };
IndexImpl parse_impl(std::string_view name);  // "mmap" | "lazy" | "cached"; throws otherwise
std::string_view impl_name(IndexImpl impl);

enum class IndexLayout { kMMIDIDX, kTNTIDX, kFairseqTNTIDX, kFairseqMMIDIDX };
std::string_view layout_name(IndexLayout layout);

// Whose layouts a writer uses: Megatron's (with a document index) or fairseq's
// (without one; each sequence is a document). The impl then picks one of the two.
enum class LayoutFamily { kMegatron, kFairseq };
LayoutFamily parse_layout_family(std::string_view name);  // "megatron" | "fairseq"; throws otherwise
std::string_view layout_family_name(LayoutFamily family);
// mmap writes MMIDIDX; lazy and cached write TNTIDX (fairseq's `make_builder` makes
// the same choice for its `--dataset-impl`).
IndexLayout layout_for_impl(IndexImpl impl, LayoutFamily family = LayoutFamily::kMegatron);
// False for fairseq's layouts, which store no document index.
bool layout_has_document_index(IndexLayout layout);
// What the .bin stores for token id t is t + stored_id_offset: 1 in fairseq's TNTIDX
// (its builder's Lua convention, which its reader undoes with fix_lua_indexing), else 0.
std::int32_t stored_id_offset(IndexLayout layout);

std::string bin_path(const std::string& prefix);  // prefix + ".bin"
std::string idx_path(const std::string& prefix);  // prefix + ".idx"
// The shard's sidecar (shard_sidecar.h), which Megatron and fairseq do not open.
std::string sidecar_path(const std::string& prefix);  // prefix + ".dufu.json"

// The .idx headers, written and read alike: each layout's magic, the one version
// there is, and each header's size up to the first array.
inline constexpr char kMMIDIDXMagic[] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr char kTNTIDXMagic[] = {'T', 'N', 'T', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::uint64_t kIndexVersion = 1;
// Magic, version, dtype code (1 byte), S, D; fairseq's has no D.
inline constexpr std::uint64_t kMMIDIDXHeaderBytes = sizeof(kMMIDIDXMagic) + 8 + 1 + 8 + 8;
inline constexpr std::uint64_t kFairseqMMIDIDXHeaderBytes = kMMIDIDXHeaderBytes - 8;
// Magic, version, dtype code, element size, N, s, doc_count; fairseq's has no doc_count.
inline constexpr std::uint64_t kTNTIDXHeaderBytes = sizeof(kTNTIDXMagic) + 6 * 8;
inline constexpr std::uint64_t kFairseqTNTIDXHeaderBytes = kTNTIDXHeaderBytes - 8;
static_assert(kMMIDIDXHeaderBytes == 34 && kFairseqMMIDIDXHeaderBytes == 26 && kTNTIDXHeaderBytes == 56 &&
              kFairseqTNTIDXHeaderBytes == 48);

// The parsed .idx. Arrays stay in the file's bytes (mapped or read into memory) and
// are read with memcpy, because MMIDIDX arrays are not aligned.
class Index {
 public:
  // Validates magic, version, dtype, counts and that the file size matches the
  // header exactly; throws dufu::Error naming the file otherwise. `map` chooses
  // mapping the file vs reading it into memory.
  static Index open(const std::string& path, bool map);

  IndexLayout layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  std::uint64_t version() const { return version_; }
  std::uint64_t num_sequences() const { return num_sequences_; }
  // Entries of document_indices (documents + 1). fairseq's layouts store none: every
  // sequence is its own document.
  std::uint64_t num_document_entries() const { return num_document_entries_; }
  std::uint64_t num_documents() const { return num_document_entries_ - 1; }
  std::uint64_t sequence_length(std::uint64_t i) const;      // tokens
  std::uint64_t sequence_offset(std::uint64_t i) const;      // tokens from start of .bin
  std::uint64_t document_index(std::uint64_t entry) const;   // document_indices[entry]
  std::uint64_t total_tokens() const { return total_tokens_; }
  std::uint64_t file_size() const;
  const std::string& path() const { return path_; }

  Index(Index&&) noexcept;
  Index& operator=(Index&&) noexcept;
  ~Index();

 private:
  Index();
  struct Storage;
  std::unique_ptr<Storage> storage_;
  std::string path_;
  IndexLayout layout_ = IndexLayout::kMMIDIDX;
  DType dtype_ = DType::kUInt16;
  std::uint64_t version_ = 0;
  std::uint64_t num_sequences_ = 0;
  std::uint64_t num_document_entries_ = 0;
  std::uint64_t total_tokens_ = 0;
  // Byte offsets of the arrays inside the file.
  std::uint64_t lengths_at_ = 0, pointers_at_ = 0, documents_at_ = 0;
};

}  // namespace dufu::dataprep
