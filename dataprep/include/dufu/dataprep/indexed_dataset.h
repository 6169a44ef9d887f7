// Readers of indexed token shards: `.bin` (raw tokens) plus `.idx` (index.h). The .idx
// layout is detected from its magic; the impl decides how the .bin is served.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dufu/dataprep/dtype.h"
#include "dufu/dataprep/index.h"

namespace dufu::dataprep {

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

}  // namespace dufu::dataprep
