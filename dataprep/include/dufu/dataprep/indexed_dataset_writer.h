// The writer of indexed token shards: a .bin streamed as sequences arrive and its .idx
// (index.h's layouts) written on commit, the pair published by shard_output.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "dufu/common/atomic_file.h"
#include "dufu/dataprep/anonymous_file.h"
#include "dufu/dataprep/dtype.h"
#include "dufu/dataprep/index.h"
#include "dufu/dataprep/shard_output.h"

namespace dufu::dataprep {

class IndexedDataset;  // indexed_dataset.h

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

}  // namespace dufu::dataprep
