// Readers of indexed token shards. The .idx layout comes from its magic; the impl only
// decides how .bin bytes are fetched (mapping, pread, or one in-memory copy), so each
// impl is a small subclass overriding read_bytes, and the token conversion is shared.
#include "dufu/dataprep/indexed_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/common/open_file_limit.h"
#include "dufu/common/mapped_file.h"
#include "dufu/common/read_only_file.h"
#include "dufu/common/shared_file_copy.h"
#include "dufu/dataprep/shard_output.h"

namespace dufu::dataprep {

namespace {

void check_bin_size(const std::string& path, const Index& index, std::uint64_t size) {
  std::uint64_t expected = 0;
  if (__builtin_mul_overflow(index.total_tokens(), dtype_size(index.dtype()), &expected) ||
      expected != size) {
    DUFU_FAIL("corrupt dataset '", path, "': file is ", size, " bytes but its index '",
              index.path(), "' describes ", index.total_tokens(), " tokens of ",
              dtype_name(index.dtype()), " (", dtype_size(index.dtype()), " bytes each)");
  }
}

void check_byte_range(const std::string& path, std::uint64_t bin_size, std::uint64_t offset,
                      std::uint64_t size) {
  if (offset > bin_size || size > bin_size - offset) {
    DUFU_FAIL("read of ", size, " bytes at byte ", offset, " is past the end of '", path, "' (",
              bin_size, " bytes)");
  }
}

// A .bin cut shorter under a live dataset is refused on every read, whatever the impl:
// reading a mapping past the file's new end raises SIGBUS, which would kill the
// process (the Python interpreter) instead of failing with the file's name. One fstat
// per read; a truncation that lands between it and the read can still fault.
void check_not_truncated(int descriptor, const std::string& path, std::uint64_t size_when_opened) {
  struct stat st {};
  if (::fstat(descriptor, &st) != 0) DUFU_FAIL("cannot stat '", path, "': ", errno_message(errno));
  const auto size_now = static_cast<std::uint64_t>(st.st_size);
  if (size_now < size_when_opened) {
    DUFU_FAIL("'", path, "' was truncated while open: it has ", size_now, " bytes, ", size_when_opened,
              " when the dataset opened it; HINT: a shard must not be rewritten in place while it is read ",
              "(dufu's own tools replace files by renaming)");
  }
}

class MmapIndexedDataset final : public IndexedDataset {
 public:
  MmapIndexedDataset(std::string prefix, Index index, MappedFile bin)
      : IndexedDataset(std::move(prefix), std::move(index), IndexImpl::kMmap, bin.size()),
        bin_(std::move(bin)) {}

  void read_bytes(std::uint64_t offset, std::uint64_t size, std::byte* out) const override {
    check_byte_range(bin_.path(), bin_size(), offset, size);
    if (size == 0) return;
    check_not_truncated(bin_.descriptor(), bin_.path(), bin_size());
    std::memcpy(out, bin_.data() + offset, size);
  }

 private:
  MappedFile bin_;
};

// No mapping at all: for filesystems where mmap is slow or refused.
class LazyIndexedDataset final : public IndexedDataset {
 public:
  LazyIndexedDataset(std::string prefix, Index index, ReadOnlyFile bin)
      : IndexedDataset(std::move(prefix), std::move(index), IndexImpl::kLazy, bin.size()),
        bin_(std::move(bin)) {}

  void read_bytes(std::uint64_t offset, std::uint64_t size, std::byte* out) const override {
    check_byte_range(bin_.path(), bin_size(), offset, size);
    if (size == 0) return;
    check_not_truncated(bin_.descriptor(), bin_.path(), bin_size());
    bin_.read_exact(offset, size, out);
  }

 private:
  ReadOnlyFile bin_;
};

// The .bin held in memory once per node: ranks on one machine attach to the same
// shared-memory copy instead of each reading their own.
// The copy does not fault when the file shrinks, but serving bytes the shard no longer
// has would hide what the other impls report, so the file is watched all the same.
class CachedIndexedDataset final : public IndexedDataset {
 public:
  CachedIndexedDataset(std::string prefix, Index index, ReadOnlyFile file, SharedFileCopy bin)
      : IndexedDataset(std::move(prefix), std::move(index), IndexImpl::kCached, bin.size()),
        file_(std::move(file)),
        bin_(std::move(bin)) {}

  void read_bytes(std::uint64_t offset, std::uint64_t size, std::byte* out) const override {
    check_byte_range(file_.path(), bin_size(), offset, size);
    if (size == 0) return;
    check_not_truncated(file_.descriptor(), file_.path(), bin_size());
    std::memcpy(out, bin_.data() + offset, size);
  }

 private:
  ReadOnlyFile file_;  // the file the copy was made of, watched for truncation
  SharedFileCopy bin_;
};

// Converts n stored tokens to int32, subtracting `bias` (1 for fairseq's id+1 files).
// Returns n, or the position of the first value that does not fit. For the narrow
// types the range test is constant-false and compiles away.
template <typename T>
std::size_t convert_tokens(const std::byte* in, std::size_t n, std::int64_t bias,
                           std::int32_t* out) {
  constexpr std::int64_t kMin = std::numeric_limits<std::int32_t>::min();
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  for (std::size_t i = 0; i < n; ++i) {
    T value;
    std::memcpy(&value, in + i * sizeof(T), sizeof(T));
    if constexpr (std::is_signed_v<T>) {
      const auto wide = static_cast<std::int64_t>(value);
      if (wide < kMin + bias || wide > kMax + bias) return i;
      out[i] = static_cast<std::int32_t>(wide - bias);
    } else {
      const auto wide = static_cast<std::uint64_t>(value);
      if (wide > static_cast<std::uint64_t>(kMax + bias)) return i;
      out[i] = static_cast<std::int32_t>(static_cast<std::int64_t>(wide) - bias);
    }
  }
  return n;
}

std::size_t convert_tokens(DType dtype, const std::byte* in, std::size_t n, std::int64_t bias,
                           std::int32_t* out) {
  switch (dtype) {
    case DType::kUInt8:
      return convert_tokens<std::uint8_t>(in, n, bias, out);
    case DType::kInt8:
      return convert_tokens<std::int8_t>(in, n, bias, out);
    case DType::kInt16:
      return convert_tokens<std::int16_t>(in, n, bias, out);
    case DType::kUInt16:
      return convert_tokens<std::uint16_t>(in, n, bias, out);
    case DType::kInt32:
      return convert_tokens<std::int32_t>(in, n, bias, out);
    case DType::kUInt32:
      return convert_tokens<std::uint32_t>(in, n, bias, out);
    case DType::kInt64:
      return convert_tokens<std::int64_t>(in, n, bias, out);
    case DType::kUInt64:
      return convert_tokens<std::uint64_t>(in, n, bias, out);
    case DType::kFloat32:
    case DType::kFloat64:
      break;
  }
  DUFU_FAIL("internal error: no token conversion for dtype ", dtype_name(dtype));
}

std::string stored_value(DType dtype, const std::byte* at) {
  auto as = [at]<typename T>(T) {
    T value;
    std::memcpy(&value, at, sizeof(T));
    return std::to_string(value);
  };
  switch (dtype) {
    case DType::kUInt32:
      return as(std::uint32_t{});
    case DType::kInt64:
      return as(std::int64_t{});
    case DType::kUInt64:
      return as(std::uint64_t{});
    default:  // the narrower types always fit
      return as(std::int32_t{});
  }
}

}  // namespace

std::unique_ptr<IndexedDataset> IndexedDataset::open(const std::string& prefix, IndexImpl impl) {
  const std::string bin = bin_path(prefix);
  // A pair whose replacement was cut between its two renames is refused here, even
  // where the sizes happen to agree.
  check_shard_pair(prefix);
  // Each impl keeps the .bin's descriptor for the dataset's life: large blends need
  // more than the usual soft limit.
  raise_open_file_limit();
  switch (impl) {
    case IndexImpl::kMmap: {
      Index index = Index::open(idx_path(prefix), /*map=*/true);
      MappedFile file = MappedFile::open(bin, /*keep_descriptor=*/true);
      check_bin_size(bin, index, file.size());
      return std::make_unique<MmapIndexedDataset>(prefix, std::move(index), std::move(file));
    }
    case IndexImpl::kLazy: {
      Index index = Index::open(idx_path(prefix), /*map=*/false);
      ReadOnlyFile file = ReadOnlyFile::open(bin);
      check_bin_size(bin, index, file.size());
      return std::make_unique<LazyIndexedDataset>(prefix, std::move(index), std::move(file));
    }
    case IndexImpl::kCached: {
      Index index = Index::open(idx_path(prefix), /*map=*/false);
      ReadOnlyFile file = ReadOnlyFile::open(bin);
      SharedFileCopy copy = SharedFileCopy::open(bin);
      check_bin_size(bin, index, copy.size());
      if (file.size() != copy.size()) {
        DUFU_FAIL("'", bin, "' changed size while being opened (", file.size(), " then ", copy.size(), " bytes)");
      }
      return std::make_unique<CachedIndexedDataset>(prefix, std::move(index), std::move(file), std::move(copy));
    }
  }
  DUFU_FAIL("internal error: unknown dataset impl ", static_cast<int>(impl));
}

IndexedDataset::IndexedDataset(std::string prefix, Index index, IndexImpl impl,
                               std::uint64_t bin_size)
    : prefix_(std::move(prefix)), index_(std::move(index)), impl_(impl), bin_size_(bin_size) {}

IndexedDataset::~IndexedDataset() = default;

void IndexedDataset::read_tokens(std::uint64_t seq, std::uint64_t offset, std::uint64_t count,
                                 std::int32_t* out) const {
  const std::uint64_t length = index_.sequence_length(seq);
  if (offset > length || count > length - offset) {
    DUFU_FAIL("cannot read ", count, " tokens at offset ", offset, " of sequence ", seq, " in '",
              prefix_, "': the sequence has ", length, " tokens");
  }
  if (count == 0) return;
  const DType dtype = index_.dtype();
  if (!dtype_is_integer(dtype)) {
    DUFU_FAIL("'", prefix_, "' holds ", dtype_name(dtype), " values, not integer tokens");
  }
  const std::uint64_t item = dtype_size(dtype);
  const std::uint64_t first = index_.sequence_offset(seq) + offset;
  // fairseq's TNTIDX builder stores every id as id + 1.
  const std::int64_t bias = stored_id_offset(index_.layout());
  if (dtype == DType::kInt32 && bias == 0) {
    read_bytes(first * item, count * item, reinterpret_cast<std::byte*>(out));
    return;
  }
  // A small bounce buffer stays in cache, so converting through it costs little more
  // than converting in place, and works the same for every impl.
  constexpr std::size_t kChunkBytes = 32 * 1024;
  alignas(8) std::byte chunk[kChunkBytes];
  const std::uint64_t chunk_tokens = kChunkBytes / item;
  for (std::uint64_t done = 0; done < count;) {
    const std::uint64_t n = std::min(chunk_tokens, count - done);
    read_bytes((first + done) * item, n * item, chunk);
    const std::size_t converted = convert_tokens(dtype, chunk, n, bias, out + done);
    if (converted != n) {
      DUFU_FAIL("token ", offset + done + converted, " of sequence ", seq, " in '",
                bin_path(prefix_), "' is stored as ", stored_value(dtype, chunk + converted * item),
                bias ? " (fairseq id+1)" : "", ", which does not fit int32");
    }
    done += n;
  }
}

std::vector<std::int32_t> IndexedDataset::sequence(std::uint64_t seq) const {
  std::vector<std::int32_t> tokens(index_.sequence_length(seq));
  read_tokens(seq, 0, tokens.size(), tokens.data());
  return tokens;
}

}  // namespace dufu::dataprep
