// The identity of a blend's shards and the watch over them (see shard_identity.h).
#include "dufu/trainer/checkpoint/shard_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string_view>

#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/mapped_file.h"
#include "dufu/dataprep/indexed_dataset.h"

namespace dufu::trainer {

namespace {

struct FileStat {
  std::uint64_t bytes = 0;
  std::int64_t mtime_ns = 0;
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
};

FileStat stat_file(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) DUFU_FAIL("cannot stat data shard file '", path, "': ", errno_message(errno));
  return {static_cast<std::uint64_t>(info.st_size),
          static_cast<std::int64_t>(info.st_mtim.tv_sec) * 1'000'000'000 + info.st_mtim.tv_nsec,
          static_cast<std::uint64_t>(info.st_dev), static_cast<std::uint64_t>(info.st_ino)};
}

// The SHA-256 of kSampleBlocks blocks of kSampleBytes spread evenly over the file
// (the whole file when it is smaller), read with pread: no mapping, which a file
// truncated meanwhile would turn into SIGBUS.
constexpr std::uint64_t kSampleBlocks = 16;
constexpr std::uint64_t kSampleBytes = 4096;

std::string sampled_sha256(const std::string& path, std::uint64_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DUFU_FAIL("cannot open data shard file '", path, "': ", errno_message(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    DUFU_FAIL("cannot stat data shard file '", path, "': ", errno_message(error));
  }
  size = static_cast<std::uint64_t>(info.st_size);
  std::string sample;
  const std::uint64_t blocks = size <= kSampleBlocks * kSampleBytes ? 1 : kSampleBlocks;
  const std::uint64_t block = blocks == 1 ? size : kSampleBytes;
  for (std::uint64_t k = 0; k < blocks; ++k) {
    const std::uint64_t offset =
        blocks == 1 ? 0
                    : static_cast<std::uint64_t>(static_cast<unsigned __int128>(size - block) * k / (blocks - 1));
    const std::size_t at = sample.size();
    sample.resize(at + block);
    std::uint64_t done = 0;
    while (done < block) {
      const ssize_t count = ::pread(fd, sample.data() + at + done, block - done, static_cast<off_t>(offset + done));
      if (count <= 0) {
        const int error = errno;
        ::close(fd);
        DUFU_FAIL("cannot read data shard file '", path, "': ",
                  count == 0 ? "it ended early (truncated meanwhile?)" : errno_message(error));
      }
      done += static_cast<std::uint64_t>(count);
    }
  }
  ::close(fd);
  return sha256_hex(sample);
}

}  // namespace

ShardIdentity shard_identity(const std::string& prefix) {
  ShardIdentity identity;
  identity.prefix = prefix;
  identity.bin_sample_sha256 = sampled_sha256(dataprep::bin_path(prefix), identity.bin_bytes);
  const MappedFile index = MappedFile::open(dataprep::idx_path(prefix));
  identity.idx_bytes = index.size();
  identity.idx_sha256 =
      sha256_hex(std::string_view(reinterpret_cast<const char*>(index.data()), static_cast<std::size_t>(index.size())));
  return identity;
}

AgreedSetting agreed_setting(const ShardIdentity& identity) {
  return {str_cat("the data shard '", identity.prefix, "'"),
          str_cat(dataprep::bin_path(identity.prefix), " of ", identity.bin_bytes, " bytes (sampled SHA-256 ",
                  identity.bin_sample_sha256.substr(0, 16), "), ", dataprep::idx_path(identity.prefix), " of ",
                  identity.idx_bytes, " bytes (SHA-256 ", identity.idx_sha256.substr(0, 16), ")"),
          ""};
}

std::optional<std::string> shard_change(const std::vector<ShardIdentity>& recorded,
                                        const std::vector<ShardIdentity>& current, const std::string& checkpoint) {
  for (const ShardIdentity& was : recorded) {
    for (const ShardIdentity& now : current) {
      if (now.prefix != was.prefix) continue;
      const std::string changed = str_cat("data shard '", now.prefix, "' changed since ", checkpoint, " was written: ");
      if (now.bin_bytes != was.bin_bytes) {
        return str_cat(changed, dataprep::bin_path(now.prefix), " is ", now.bin_bytes, " bytes, it was ", was.bin_bytes);
      }
      if (now.idx_bytes != was.idx_bytes) {
        return str_cat(changed, dataprep::idx_path(now.prefix), " is ", now.idx_bytes, " bytes, it was ", was.idx_bytes);
      }
      if (now.idx_sha256 != was.idx_sha256) {
        return str_cat(changed, dataprep::idx_path(now.prefix), " has SHA-256 ", now.idx_sha256, ", it had ",
                       was.idx_sha256, " (its documents changed)");
      }
      if (now.bin_sample_sha256 != was.bin_sample_sha256) {
        return str_cat(changed, dataprep::bin_path(now.prefix), " holds other tokens (the SHA-256 of its sampled ",
                       "blocks is ", now.bin_sample_sha256, ", it was ", was.bin_sample_sha256, ")");
      }
    }
  }
  return std::nullopt;
}

ShardWatch::ShardWatch(const std::vector<std::string>& prefixes) {
  for (const std::string& prefix : prefixes) {
    for (const std::string& path : {dataprep::bin_path(prefix), dataprep::idx_path(prefix)}) {
      const FileStat stat = stat_file(path);
      files_.push_back({path, stat.bytes, stat.mtime_ns, stat.device, stat.inode});
    }
  }
}

void ShardWatch::check() const {
  for (const FileState& file : files_) {
    const FileStat now = stat_file(file.path);
    // A file renamed over the shard leaves the run reading the one it opened.
    if (now.device != file.device || now.inode != file.inode) continue;
    if (now.bytes != file.bytes) {
      DUFU_FAIL("data shard file '", file.path, "' changed while training: it is ", now.bytes, " bytes, it was ",
                file.bytes, now.bytes < file.bytes ? " (truncated)" : " (appended to or replaced)",
                "; HINT: a shard must not change while a run reads it");
    }
    if (now.mtime_ns != file.mtime_ns) {
      DUFU_FAIL("data shard file '", file.path, "' changed while training: it was modified after the run opened it",
                "; HINT: a shard must not change while a run reads it");
    }
  }
}

}  // namespace dufu::trainer
