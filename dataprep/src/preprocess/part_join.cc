// Writes the parts of a divided job into one shard at their final offsets
// (part_join.h), from a part's files or from an anonymous part. The index arrays are
// streamed in bounded chunks; the .bin goes over
// with copy_file_range (in the kernel, or on the server for NFS 4.2), else read/write.
#include "dufu/dataprep/part_join.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

constexpr std::size_t kChunkEntries = 8192;

// Byte offsets of the .idx arrays for n sequences and d documents.
struct IdxArrays {
  std::uint64_t lengths = 0, pointers = 0, documents = 0, end = 0;  // MMIDIDX
  std::uint64_t dims = 0, offsets = 0, sizes = 0;                   // TNTIDX (documents, end shared)
};

IdxArrays idx_arrays(IndexLayout layout, std::uint64_t n, std::uint64_t d) {
  IdxArrays a;
  if (layout == IndexLayout::kMMIDIDX) {
    a.lengths = kMMIDIDXHeaderBytes;
    a.pointers = a.lengths + 4 * n;
    a.documents = a.pointers + 8 * n;
  } else {
    a.dims = kTNTIDXHeaderBytes;
    a.offsets = a.dims + 8 * (n + 1);
    a.sizes = a.offsets + 8 * (n + 1);
    a.documents = a.sizes + 8 * n;
  }
  a.end = a.documents + 8 * (d + 1);
  return a;
}

int open_for_writing(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      DUFU_FAIL("cannot see '", path, "', which the writer of the output created: the output directory must be on a ",
                "file system that every process of the job shares");
    }
    DUFU_FAIL("cannot open '", path, "' for writing: ", errno_message(error));
  }
  return fd;
}

}  // namespace

void check_joinable_layout(IndexLayout layout) {
  if (layout != IndexLayout::kMMIDIDX && layout != IndexLayout::kTNTIDX) {
    DUFU_FAIL("the ", layout_name(layout), " layout cannot be written by a divided job (parts are joined into ",
              "Megatron's MMIDIDX or TNTIDX only); run it as one process");
  }
}

JoinLayout::JoinLayout(std::vector<PartShape> parts, IndexLayout layout, DType dtype)
    : parts_(std::move(parts)), layout_(layout), dtype_(dtype), item_bytes_(dtype_size(dtype)) {
  check_joinable_layout(layout);
  for (const PartShape& part : parts_) {
    before_.push_back(total_);
    total_.sequences += part.sequences;
    total_.documents += part.documents;
    total_.tokens += part.tokens;
  }
}

std::uint64_t JoinLayout::idx_bytes() const { return idx_arrays(layout_, total_.sequences, total_.documents).end; }

JoinTarget::JoinTarget(const std::string& bin_temp, const std::string& idx_temp)
    : bin_path_(bin_temp), idx_path_(idx_temp) {
  bin_fd_ = open_for_writing(bin_temp);
  try {
    idx_fd_ = open_for_writing(idx_temp);
  } catch (...) {
    ::close(bin_fd_);
    throw;
  }
}

JoinTarget::~JoinTarget() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
  if (idx_fd_ >= 0) ::close(idx_fd_);
}

void JoinTarget::pwrite_all(int fd, const std::string& path, const void* data, std::size_t size, std::uint64_t offset) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, bytes, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) DUFU_FAIL("cannot write '", path, "' at byte ", offset, ": ", errno_message(n < 0 ? errno : EIO));
    bytes += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

void JoinTarget::set_sizes(const JoinLayout& layout) {
  if (::ftruncate(bin_fd_, static_cast<off_t>(layout.bin_bytes())) != 0) {
    DUFU_FAIL("cannot size '", bin_path_, "' to ", layout.bin_bytes(), " bytes: ", errno_message(errno));
  }
  if (::ftruncate(idx_fd_, static_cast<off_t>(layout.idx_bytes())) != 0) {
    DUFU_FAIL("cannot size '", idx_path_, "' to ", layout.idx_bytes(), " bytes: ", errno_message(errno));
  }
}

void JoinTarget::write_header(const JoinLayout& layout) {
  const std::uint64_t n = layout.total().sequences, entries = layout.total().documents + 1;
  const IdxArrays a = idx_arrays(layout.layout(), n, layout.total().documents);
  std::string header;
  auto put = [&](const auto& value) { header.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
  if (layout.layout() == IndexLayout::kMMIDIDX) {
    header.append(kMMIDIDXMagic, sizeof(kMMIDIDXMagic));
    put(kIndexVersion);
    put(static_cast<std::uint8_t>(layout.dtype()));
    put(n);
    put(entries);
  } else {
    header.append(kTNTIDXMagic, sizeof(kTNTIDXMagic));
    put(kIndexVersion);
    put(static_cast<std::uint64_t>(layout.dtype()));
    put(layout.item_bytes());
    put(n);
    put(n);
    put(entries);
    // The closing entries of dim_offsets (n) and data_offsets (all tokens).
    const auto dims_end = static_cast<std::int64_t>(n);
    const auto tokens_end = static_cast<std::int64_t>(layout.total().tokens);
    pwrite_all(idx_fd_, idx_path_, &dims_end, 8, a.dims + 8 * n);
    pwrite_all(idx_fd_, idx_path_, &tokens_end, 8, a.offsets + 8 * n);
  }
  pwrite_all(idx_fd_, idx_path_, header.data(), header.size(), 0);
  const std::int64_t first_document = 0;
  pwrite_all(idx_fd_, idx_path_, &first_document, 8, a.documents);
}

// The part's index entries, a chunk at a time. Sequences are contiguous in a part's
// .bin (Index checks it of a file; a writer makes them so), so their offsets are the
// running sum of their lengths.
template <typename LengthAt, typename DocumentAt>
void JoinTarget::write_entries(const JoinLayout& layout, std::size_t k, LengthAt length_at, DocumentAt document_at) {
  const PartShape& shape = layout.part(k);
  const PartShape& before = layout.before(k);
  const IdxArrays a = idx_arrays(layout.layout(), layout.total().sequences, layout.total().documents);
  const std::uint64_t item = layout.item_bytes();
  std::vector<std::int64_t> wide(kChunkEntries);
  std::vector<std::int32_t> narrow(kChunkEntries);
  std::vector<std::uint64_t> offsets(kChunkEntries);  // tokens from the start of the part
  std::uint64_t tokens = 0;
  for (std::uint64_t i = 0; i < shape.sequences; i += kChunkEntries) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkEntries, shape.sequences - i));
    const std::uint64_t at = before.sequences + i;  // entry in the output
    for (std::size_t j = 0; j < n; ++j) {
      offsets[j] = tokens;
      tokens += length_at(i + j);
    }
    if (layout.layout() == IndexLayout::kMMIDIDX) {
      for (std::size_t j = 0; j < n; ++j) narrow[j] = static_cast<std::int32_t>(length_at(i + j));
      pwrite_all(idx_fd_, idx_path_, narrow.data(), 4 * n, a.lengths + 4 * at);
      for (std::size_t j = 0; j < n; ++j) wide[j] = static_cast<std::int64_t>((before.tokens + offsets[j]) * item);
      pwrite_all(idx_fd_, idx_path_, wide.data(), 8 * n, a.pointers + 8 * at);
    } else {
      for (std::size_t j = 0; j < n; ++j) wide[j] = static_cast<std::int64_t>(at + j);
      pwrite_all(idx_fd_, idx_path_, wide.data(), 8 * n, a.dims + 8 * at);
      for (std::size_t j = 0; j < n; ++j) wide[j] = static_cast<std::int64_t>(before.tokens + offsets[j]);
      pwrite_all(idx_fd_, idx_path_, wide.data(), 8 * n, a.offsets + 8 * at);
      for (std::size_t j = 0; j < n; ++j) wide[j] = static_cast<std::int64_t>(length_at(i + j));
      pwrite_all(idx_fd_, idx_path_, wide.data(), 8 * n, a.sizes + 8 * at);
    }
  }
  // Document index entries 1..documents of the part, shifted by the earlier sequences.
  for (std::uint64_t d = 0; d < shape.documents; d += kChunkEntries) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkEntries, shape.documents - d));
    for (std::size_t j = 0; j < n; ++j) wide[j] = static_cast<std::int64_t>(before.sequences + document_at(d + j + 1));
    pwrite_all(idx_fd_, idx_path_, wide.data(), 8 * n, a.documents + 8 * (1 + before.documents + d));
  }
}

void JoinTarget::copy_bin(const JoinLayout& layout, std::size_t k, int in, const std::string& source) {
  const std::uint64_t item = layout.item_bytes();
  const std::uint64_t bytes = layout.part(k).tokens * item;
  off_t in_offset = 0;
  auto out_offset = static_cast<off_t>(layout.before(k).tokens * item);
  std::uint64_t done = 0;
  bool kernel_copy = true;
  std::vector<char> buffer;
  while (done < bytes) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(bytes - done, std::uint64_t{1} << 30));
    ssize_t n = -1;
    if (kernel_copy) {
      n = ::copy_file_range(in, &in_offset, bin_fd_, &out_offset, want, 0);
      if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        kernel_copy = false;  // not between these file systems: copy through memory
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) DUFU_FAIL("cannot copy ", source, " into '", bin_path_, "': ", errno_message(errno));
    } else {
      buffer.resize(std::size_t{4} << 20);
      n = ::pread(in, buffer.data(), std::min(want, buffer.size()), in_offset);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) DUFU_FAIL("error reading ", source, ": ", errno_message(errno));
      if (n > 0)
        pwrite_all(bin_fd_, bin_path_, buffer.data(), static_cast<std::size_t>(n),
                   static_cast<std::uint64_t>(out_offset));
      in_offset += n;
      out_offset += n;
    }
    if (n == 0) DUFU_FAIL(source, " ended after ", done, " of its ", bytes, " bytes while it was copied");
    done += static_cast<std::uint64_t>(n);
  }
}

void JoinTarget::write_part(const JoinLayout& layout, std::size_t k, const std::string& part_prefix) {
  const Index index = Index::open(idx_path(part_prefix), /*map=*/true);
  const PartShape& shape = layout.part(k);
  if (index.layout() == IndexLayout::kFairseqTNTIDX) {
    DUFU_FAIL("'", idx_path(part_prefix), "' is fairseq's layout (tokens stored as id+1): not a part of a dufu job");
  }
  if (index.num_sequences() != shape.sequences || index.num_documents() != shape.documents ||
      index.total_tokens() != shape.tokens || index.dtype() != layout.dtype()) {
    DUFU_FAIL("'", idx_path(part_prefix), "' changed while its parts were joined (", index.num_sequences(),
              " sequences, expected ", shape.sequences, ")");
  }
  write_entries(
      layout, k, [&](std::uint64_t i) { return index.sequence_length(i); },
      [&](std::uint64_t entry) { return index.document_index(entry); });
  const std::string source = bin_path(part_prefix);
  const int in = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) DUFU_FAIL("cannot open '", source, "': ", errno_message(errno));
  try {
    copy_bin(layout, k, in, "'" + source + "'");
  } catch (...) {
    ::close(in);
    throw;
  }
  ::close(in);
}

void JoinTarget::write_part(const JoinLayout& layout, std::size_t k, const AnonymousShard& part) {
  const PartShape& shape = layout.part(k);
  const PartShape own = anonymous_shard_shape(part);
  if (own.sequences != shape.sequences || own.documents != shape.documents || own.tokens != shape.tokens) {
    DUFU_FAIL("internal error: ", part.bin.description(), " has ", own.sequences, " sequences, but the join expects ",
              shape.sequences);
  }
  write_entries(
      layout, k, [&](std::uint64_t i) { return static_cast<std::uint64_t>(part.lengths[i]); },
      [&](std::uint64_t entry) { return static_cast<std::uint64_t>(part.document_indices[entry]); });
  copy_bin(layout, k, part.bin.fd(), part.bin.description());
}

void JoinTarget::finish() {
  for (auto [fd, path] : {std::pair{&bin_fd_, &bin_path_}, std::pair{&idx_fd_, &idx_path_}}) {
    if (::fdatasync(*fd) != 0) DUFU_FAIL("cannot write '", *path, "': fdatasync failed: ", errno_message(errno));
    const int closing = std::exchange(*fd, -1);
    if (::close(closing) != 0) DUFU_FAIL("cannot write '", *path, "': close failed: ", errno_message(errno));
  }
}

PartShape read_part_shape(const std::string& part_prefix, DType* dtype, IndexLayout* layout) {
  const Index index = Index::open(idx_path(part_prefix), /*map=*/true);
  if (dtype) *dtype = index.dtype();
  if (layout) *layout = index.layout();
  return PartShape{
      .sequences = index.num_sequences(), .documents = index.num_documents(), .tokens = index.total_tokens()};
}

PartShape anonymous_shard_shape(const AnonymousShard& part) {
  return PartShape{.sequences = part.lengths.size(),
                   .documents = part.document_indices.empty() ? 0 : part.document_indices.size() - 1,
                   .tokens = part.tokens};
}

}  // namespace dufu::dataprep
