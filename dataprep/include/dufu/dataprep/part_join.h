// Joining the parts of a divided preprocess job into one shard, with every part's
// bytes written at their final offsets: the .bin of part k is copied to the sum of
// the earlier parts' .bin sizes, and its index entries (lengths, pointers or offsets,
// document indices shifted by the earlier parts' sequences) to their places in the
// .idx. Once the parts' counts are known every offset is, so the parts can be copied
// by different processes at once (one per MPI rank) or one after another by one
// (`dataprep merge`); only the .idx header is written by one writer. The bytes equal
// those IndexedDatasetWriter writes for the same documents, in MMIDIDX or TNTIDX.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/index.h"
#include "dufu/dataprep/indexed_dataset_writer.h"

namespace dufu::dataprep {

struct PartShape {
  std::uint64_t sequences = 0;
  std::uint64_t documents = 0;
  std::uint64_t tokens = 0;
};

// Throws, naming the layout, unless parts can be joined into it (MMIDIDX, TNTIDX):
// divided runs check this before any work.
void check_joinable_layout(IndexLayout layout);

// Where everything goes.
class JoinLayout {
 public:
  JoinLayout(std::vector<PartShape> parts, IndexLayout layout, DType dtype);

  std::uint64_t bin_bytes() const { return total_.tokens * item_bytes_; }
  std::uint64_t idx_bytes() const;
  std::size_t num_parts() const { return parts_.size(); }
  const PartShape& part(std::size_t k) const { return parts_[k]; }
  const PartShape& total() const { return total_; }
  // Sums over the parts before k.
  const PartShape& before(std::size_t k) const { return before_[k]; }
  IndexLayout layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  std::uint64_t item_bytes() const { return item_bytes_; }

 private:
  std::vector<PartShape> parts_;
  std::vector<PartShape> before_;
  PartShape total_;
  IndexLayout layout_;
  DType dtype_;
  std::uint64_t item_bytes_;
};

// The output's two files, opened for writing at offsets by path (the temporaries
// rank 0 created). A path that cannot be opened is reported as not visible from here.
class JoinTarget {
 public:
  JoinTarget(const std::string& bin_temp, const std::string& idx_temp);
  JoinTarget(const JoinTarget&) = delete;
  JoinTarget& operator=(const JoinTarget&) = delete;
  ~JoinTarget();

  // Gives both files their final sizes (the writer of the header does this first).
  void set_sizes(const JoinLayout& layout);
  // The header and the index entries no part owns (document index 0, TNTIDX's
  // closing offsets).
  void write_header(const JoinLayout& layout);
  // Copies part k (opened from its prefix; its shape must be layout.part(k)).
  void write_part(const JoinLayout& layout, std::size_t k, const std::string& part_prefix);
  // Copies part k from a part written without a name (its index from memory, its
  // .bin from its descriptor).
  void write_part(const JoinLayout& layout, std::size_t k, const AnonymousShard& part);
  // fdatasync both and close: what this process wrote is on the file system (for a
  // network file system, visible to the process that renames the files).
  void finish();

 private:
  void pwrite_all(int fd, const std::string& path, const void* data, std::size_t size, std::uint64_t offset);
  // Part k's index entries: length_at(i) tokens of its sequence i, document_at(e) its
  // document index entry e.
  template <typename LengthAt, typename DocumentAt>
  void write_entries(const JoinLayout& layout, std::size_t k, LengthAt length_at, DocumentAt document_at);
  // Part k's .bin bytes from `in` (which messages call `source`) to their offset.
  void copy_bin(const JoinLayout& layout, std::size_t k, int in, const std::string& source);

  std::string bin_path_, idx_path_;
  int bin_fd_ = -1, idx_fd_ = -1;
};

// The shape of a finished part on disk (its .idx).
PartShape read_part_shape(const std::string& part_prefix, DType* dtype, IndexLayout* layout);
// The shape of a finished anonymous part.
PartShape anonymous_shard_shape(const AnonymousShard& part);

}  // namespace dufu::dataprep
