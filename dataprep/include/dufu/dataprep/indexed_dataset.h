// Readers and writer for indexed token shards: `.bin` (raw tokens) plus `.idx`, in
// Megatron's layouts (MMIDIDX for impl "mmap", TNTIDX for "lazy" and "cached") or
// fairseq's (the same two without a document index; its TNTIDX stores id + 1).
// Byte layouts: docs/formats.md sections 1-6. All counts and offsets are 64-bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dufu/common/atomic_file.h"
#include "dufu/dataprep/anonymous_file.h"
#include "dufu/dataprep/dtype.h"
#include "dufu/dataprep/shard_output.h"

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

// A readable shard. The .idx layout is detected from its magic; `impl` only decides
// how token bytes are fetched: mmap (zero-copy mapping), lazy (pread per read, no
// mapping), cached (whole .bin read into memory once).
class IndexedDataset {
 public:
  static std::unique_ptr<IndexedDataset> open(const std::string& prefix, IndexImpl impl);
  virtual ~IndexedDataset();

  const Index& index() const { return index_; }
  IndexImpl impl() const { return impl_; }
  DType dtype() const { return index_.dtype(); }
  std::uint64_t num_sequences() const { return index_.num_sequences(); }
  std::uint64_t num_documents() const { return index_.num_documents(); }
  std::uint64_t sequence_length(std::uint64_t i) const { return index_.sequence_length(i); }
  const std::string& prefix() const { return prefix_; }

  // Copies `count` tokens of sequence `seq` starting at token `offset`, converted to
  // int32 (the stored id + 1 of fairseq's TNTIDX is undone). Throws on out-of-range
  // requests.
  void read_tokens(std::uint64_t seq, std::uint64_t offset, std::uint64_t count,
                   std::int32_t* out) const;
  std::vector<std::int32_t> sequence(std::uint64_t seq) const;
  // Raw .bin bytes [byte_offset, byte_offset + size) into out (used by merge).
  virtual void read_bytes(std::uint64_t byte_offset, std::uint64_t size, std::byte* out) const = 0;
  std::uint64_t bin_size() const { return bin_size_; }

 protected:
  IndexedDataset(std::string prefix, Index index, IndexImpl impl, std::uint64_t bin_size);

 private:
  std::string prefix_;
  Index index_;
  IndexImpl impl_;
  std::uint64_t bin_size_;
};

// A shard written without a name (IndexedDatasetWriter's anonymous mode): its tokens,
// as the .bin would hold them, in an anonymous file, and its index in memory. The
// parts of a divided preprocess job are these where the file system allows, so that
// a rank killed at any moment leaves no file of its part.
struct AnonymousShard {
  AnonymousFile bin;                           // every byte written (flushed)
  std::vector<std::int32_t> lengths;           // tokens per sequence
  std::vector<std::int64_t> document_indices;  // documents + 1 entries, the first 0
  std::uint64_t tokens = 0;
};

// Streams a shard to disk. The .bin is written as sequences arrive; the per-sequence
// index (12-24 bytes per sequence) is kept in memory and written on commit. Both
// files appear under their final names only after commit(), as a pair (an earlier
// pair stays whole if anything fails; shard_output.h). The prefix is locked from
// construction to commit() (or destruction): a second writer of it, in this process
// or another, is refused.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, IndexLayout layout, DType dtype);
  // Anonymous mode: tokens go into `bin`, and finish_anonymous() hands the shard over
  // instead of a commit. No file is named and no lock taken (a divided job's rank 0
  // holds the output's); `description` names the shard in messages.
  IndexedDatasetWriter(AnonymousFile bin, std::string description, IndexLayout layout, DType dtype);
  ~IndexedDatasetWriter();  // without commit(): both temporaries are removed

  // Appends one sequence; throws if a token (plus stored_id_offset) does not fit the
  // dtype.
  void add_sequence(std::span<const std::int32_t> tokens);
  // Closes the current document (document_indices gets the current sequence count).
  // fairseq's layouts cannot record documents, so there each document must be exactly
  // one sequence, or this throws.
  void end_document();
  void add_document(std::span<const std::int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  // Appends every sequence and document of `other` (same dtype required): .bin bytes
  // copied in chunks where both store ids alike (else token by token), lengths
  // appended, document indices shifted. Used by merge.
  void append(const IndexedDataset& other);

  // Writes the .idx, then replaces the pair. Returns bytes of .bin + .idx.
  std::uint64_t commit();
  // For a pair that only the running job reads and then removes (a rank's part of a
  // divided preprocess): each file renamed into place on its own, without the pair's
  // marker and without holding SIGINT/SIGTERM back meanwhile, so that a signal at any
  // moment (mpirun's SIGTERM, with SIGKILL a second later) removes what the caller
  // registered for cleanup. Returns bytes of .bin + .idx.
  std::uint64_t commit_scratch();
  // Anonymous mode's end: checks every document is closed, flushes the .bin and
  // hands over the shard; the writer takes nothing more.
  AnonymousShard finish_anonymous();

  std::uint64_t num_sequences() const { return lengths_.size(); }
  std::uint64_t num_documents() const { return document_indices_.size() - 1; }
  std::uint64_t tokens() const { return tokens_; }
  std::uint64_t bin_bytes() const;
  const std::string& prefix() const { return prefix_; }

 private:
  // Throws if committed or if a document is still open.
  void check_documents_closed() const;
  // The named .bin; throws in anonymous mode, which has no name to commit to.
  AtomicFile& named_bin();
  std::string bin_name() const;  // quoted, for messages
  void write_bin(const void* data, std::size_t size);
  // Checks every document is closed and writes the .idx into its temporary.
  AtomicFile finish_index() const;
  void write_mmidx(AtomicFile& idx) const;
  void write_tntidx(AtomicFile& idx) const;
  void encode(std::span<const std::int32_t> tokens);

  std::string prefix_;
  IndexLayout layout_;
  DType dtype_;
  // Before bin_: the lock is taken before any file is made; released by commit().
  std::unique_ptr<ShardOutputLock> lock_;
  std::variant<AtomicFile, AnonymousFile> bin_;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> document_indices_{0};
  std::uint64_t tokens_ = 0;
  std::vector<std::byte> encode_buffer_;
  bool committed_ = false;
};

// `dataprep merge`: concatenates shards of one dtype into `output_prefix` with the
// layout of `output_layout` (default MMIDIDX). Throws if dtypes differ. Inputs with a
// manifest are the parts of a divided preprocess job (part_manifest.h): they must be
// all the parts of one job, each once, and are joined in part order, in the job's
// layout by default, into what the undivided job writes. Returns the merged counts.
struct MergeStats {
  std::uint64_t sequences = 0;
  std::uint64_t documents = 0;
  std::uint64_t tokens = 0;
  std::uint64_t output_bytes = 0;
  // For parts: how many, and their runs' record counts summed.
  std::uint64_t parts = 0;
  std::uint64_t records = 0, empty_skipped = 0, bad_skipped = 0;
};
MergeStats merge_datasets(const std::vector<std::string>& input_prefixes, const std::string& output_prefix,
                          std::optional<IndexLayout> output_layout = std::nullopt);

}  // namespace dufu::dataprep
