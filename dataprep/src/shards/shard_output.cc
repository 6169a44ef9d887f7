// Replacing a shard's .bin/.idx as a pair, the lock of an output prefix, and the
// check on open (see shard_output.h for the protocol).
#include "dufu/dataprep/shard_output.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "dufu/common/error.h"
#include "dufu/common/file_lock.h"
#include "dufu/common/log.h"
#include "dufu/dataprep/index.h"

namespace dufu::dataprep {
namespace {

constexpr char kMarkerHeader[] = "dufu shard pair replacement v1";

struct SplitPrefix {
  std::string dir;     // for directory operations
  std::string prefix;  // dir + '/', or empty for a bare name: what names are built on
  std::string name;    // NAME
};

SplitPrefix split_prefix(const std::string& prefix) {
  const auto slash = prefix.rfind('/');
  if (slash == std::string::npos) return {".", "", prefix};
  return {slash == 0 ? std::string("/") : prefix.substr(0, slash), prefix.substr(0, slash + 1),
          prefix.substr(slash + 1)};
}

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId&) const = default;
};

std::optional<FileId> id_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// What the marker says: who replaced the pair, and which files are the new ones.
struct Marker {
  int pid = 0;
  std::string bin_temp, idx_temp;  // file names in the prefix's directory
  FileId bin, idx;                 // of the new files
};

std::string marker_text(const Marker& marker) {
  return str_cat(kMarkerHeader, "\npid ", marker.pid, "\nbin ", marker.bin_temp, " ", marker.bin.dev, " ",
                 marker.bin.ino, "\nidx ", marker.idx_temp, " ", marker.idx.dev, " ", marker.idx.ino, "\n");
}

// nullopt if there is no marker; throws naming it if it cannot be read or parsed.
std::optional<Marker> read_marker(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT || !exists(path)) return std::nullopt;
    DUFU_FAIL("cannot read '", path, "': ", errno_message(errno));
  }
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::istringstream lines(text);
  std::string header, pid_key, bin_key, idx_key;
  Marker marker;
  std::getline(lines, header);
  if (header == kMarkerHeader && (lines >> pid_key >> marker.pid) && pid_key == "pid" &&
      (lines >> bin_key >> marker.bin_temp >> marker.bin.dev >> marker.bin.ino) && bin_key == "bin" &&
      (lines >> idx_key >> marker.idx_temp >> marker.idx.dev >> marker.idx.ino) && idx_key == "idx" &&
      marker.bin_temp.find('/') == std::string::npos && marker.idx_temp.find('/') == std::string::npos) {
    return marker;
  }
  DUFU_FAIL("'", path, "' is not a dufu replacement marker; if no dataprep is writing beside it, remove it");
}

enum class Placed { kExchanged, kRenamedNew, kRenamedOver };

// Renames `temp` to `final`. Where the old `final` exists and the file system can,
// the two are exchanged, so the old file is then under `temp` and can be put back.
Placed put_in_place(const std::string& temp, const std::string& final) {
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0) {
    return Placed::kExchanged;
  }
  const int error = errno;
  // ENOENT: there is no old file (the temporary is ours and exists); EINVAL or ENOSYS:
  // the file system cannot exchange; anything else is a real failure.
  if (error != ENOENT && error != EINVAL && error != ENOSYS) {
    DUFU_FAIL("cannot write '", final, "': rename from '", temp, "' failed: ", errno_message(error));
  }
  const bool had_old = error != ENOENT && exists(final);
  if (::rename(temp.c_str(), final.c_str()) != 0) {
    DUFU_FAIL("cannot write '", final, "': rename from '", temp, "' failed: ", errno_message(errno));
  }
  return had_old ? Placed::kRenamedOver : Placed::kRenamedNew;
}

// Puts back what put_in_place did; false if it cannot (the old file was replaced).
bool undo_put_in_place(Placed placed, const std::string& temp, const std::string& final) noexcept {
  switch (placed) {
    case Placed::kExchanged:
      return ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0;
    case Placed::kRenamedNew:
      return ::rename(final.c_str(), temp.c_str()) == 0;
    case Placed::kRenamedOver:
      return false;
  }
  return false;
}

void sync_directory_quietly(const std::string& dir) noexcept {
  try {
    sync_directory(dir);
  } catch (const Error&) {
    // Best effort where nothing can be done about it any more.
  }
}

// Under the prefix's lock: a marker means a writer died during its commit (a live
// one would hold the lock). Completes its replacement if the new file still waits
// under its temporary name, else undoes it if the old one does; then the marker and
// the temporaries it names go.
void recover_interrupted_replacement(const std::string& prefix) {
  const SplitPrefix parts = split_prefix(prefix);
  const std::string marker_path = shard_replacing_path(prefix);
  std::optional<Marker> marker;
  try {
    marker = read_marker(marker_path);
  } catch (const Error& error) {
    DUFU_LOG_WARN("DATA", error.what());
    return;
  }
  if (!marker) return;
  const std::string bin_final = bin_path(prefix), idx_final = idx_path(prefix);
  const std::string bin_temp = parts.prefix + marker->bin_temp, idx_temp = parts.prefix + marker->idx_temp;
  const bool bin_new = id_of(bin_final) == marker->bin;
  const bool idx_new = id_of(idx_final) == marker->idx;
  if (bin_new != idx_new) {
    const std::string& missing_temp = bin_new ? idx_temp : bin_temp;
    const std::string& missing_final = bin_new ? idx_final : bin_final;
    const FileId missing_id = bin_new ? marker->idx : marker->bin;
    const std::string& placed_temp = bin_new ? bin_temp : idx_temp;
    const std::string& placed_final = bin_new ? bin_final : idx_final;
    try {
      if (id_of(missing_temp) == missing_id) {
        put_in_place(missing_temp, missing_final);
        DUFU_LOG_WARN("DATA", "completed the replacement of '", prefix, "' that process ", marker->pid,
                      " left halfway (it was stopped between renaming '", placed_final, "' and '", missing_final,
                      "')");
      } else if (exists(placed_temp)) {
        // The new file is gone but the old one it displaced is not: put that back.
        if (::renameat2(AT_FDCWD, placed_temp.c_str(), AT_FDCWD, placed_final.c_str(), RENAME_EXCHANGE) != 0) {
          DUFU_FAIL("cannot put '", placed_temp, "' back as '", placed_final, "': ", errno_message(errno));
        }
        DUFU_LOG_WARN("DATA", "undid the replacement of '", prefix, "' that process ", marker->pid,
                      " left halfway ('", missing_temp, "' is gone)");
      } else {
        DUFU_FAIL("neither '", missing_temp, "' nor '", placed_temp, "' is left");
      }
    } catch (const Error& error) {
      DUFU_LOG_WARN("DATA", "cannot repair '", prefix, "', which process ", marker->pid,
                    " left halfway replaced: ", error.what(), "; '", marker_path,
                    "' stays until a new pair is written");
      return;
    }
    sync_directory_quietly(parts.dir);
  }
  ::unlink(bin_temp.c_str());
  ::unlink(idx_temp.c_str());
  ::unlink(marker_path.c_str());
}

// Removes the temporaries that writers of `prefix` which are no longer running left
// (SIGKILL, a power cut): their pid is in the name. With the lock held, temporaries
// with our own pid are leftovers of an earlier process that had our pid.
void remove_dead_temporaries(const std::string& prefix) {
  const SplitPrefix parts = split_prefix(prefix);
  // The marker's own name is hidden (see shard_replacing_path).
  const std::string finals[] = {bin_path(parts.name), idx_path(parts.name),
                                split_prefix(shard_replacing_path(prefix)).name,
                                split_prefix(sidecar_path(prefix)).name};
  DIR* dir = ::opendir(parts.dir.c_str());
  if (dir == nullptr) return;
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    for (const auto& final : finals) {
      const int pid = temporary_owner_pid(name, final);
      if (pid == 0 || (pid != ::getpid() && process_exists(pid))) continue;
      if (::unlink((parts.prefix + name).c_str()) == 0) ++removed;
    }
  }
  ::closedir(dir);
  if (removed > 0) {
    DUFU_LOG_INFO("DATA", "removed ", removed, " temporary file(s) that stopped writers of '", prefix, "' left");
  }
}

// Prefixes being written by this process: fcntl locks do not exclude a second writer
// in the same process.
std::mutex& held_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<std::string>& held_prefixes() {
  static std::set<std::string> held;
  return held;
}

std::string held_key(const std::string& prefix) {
  std::error_code error;
  const auto absolute = std::filesystem::absolute(prefix, error);
  return error ? prefix : absolute.lexically_normal().string();
}

}  // namespace

std::string shard_lock_path(const std::string& prefix) {
  const SplitPrefix parts = split_prefix(prefix);
  return parts.prefix + "." + parts.name + ".lock";
}

std::string shard_replacing_path(const std::string& prefix) {
  const SplitPrefix parts = split_prefix(prefix);
  return parts.prefix + "." + parts.name + ".replacing";
}

void check_output_prefix(const std::string& prefix) {
  if (prefix.empty()) DUFU_FAIL("the output prefix is empty");
  const std::string name = split_prefix(prefix).name;
  if (name.empty() || name == "." || name == "..") {
    DUFU_FAIL("output prefix '", prefix, "' does not end in a file name (it would write '", prefix,
              ".bin'); give one, e.g. '", prefix, prefix.back() == '/' ? "" : "/", "corpus'");
  }
}

struct ShardOutputLock::Impl {
  std::string key;
  std::unique_ptr<FileLock> lock;
};

ShardOutputLock::ShardOutputLock(const std::string& prefix) : impl_(std::make_unique<Impl>()) {
  check_output_prefix(prefix);
  impl_->key = held_key(prefix);
  {
    std::lock_guard guard(held_mutex());
    if (!held_prefixes().insert(impl_->key).second) {
      impl_->key.clear();
      DUFU_FAIL("cannot write '", prefix, "': this process is already writing it");
    }
  }
  try {
    const std::string lock_path = shard_lock_path(prefix);
    impl_->lock = FileLock::try_lock(lock_path);
    if (!impl_->lock) {
      const int holder = FileLock::holder_pid(lock_path);
      DUFU_FAIL("cannot write '", prefix, "': another process", holder > 0 ? str_cat(" (pid ", holder, ")") : "",
                " is writing it (it holds '", lock_path, "'); wait for it or choose another output prefix");
    }
    impl_->lock->remove_file_on_unlock();
    for (const std::string& path : {bin_path(prefix), idx_path(prefix)}) {
      // A rename (an exchange, even) would put the directory aside, not replace it.
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        DUFU_FAIL("cannot write '", path, "': it is a directory");
      }
    }
    recover_interrupted_replacement(prefix);
    remove_dead_temporaries(prefix);
  } catch (...) {
    std::lock_guard guard(held_mutex());
    held_prefixes().erase(impl_->key);
    throw;
  }
}

ShardOutputLock::~ShardOutputLock() {
  impl_->lock.reset();
  std::lock_guard guard(held_mutex());
  held_prefixes().erase(impl_->key);
}

void commit_shard_pair(AtomicFile& bin, AtomicFile& idx, const std::string& prefix) {
  // Every write that can fail happens here, before any final name changes.
  bin.prepare();
  idx.prepare();
  const SplitPrefix parts = split_prefix(prefix);
  Marker marker;
  marker.pid = static_cast<int>(::getpid());
  marker.bin_temp = split_prefix(bin.temp_path()).name;
  marker.idx_temp = split_prefix(idx.temp_path()).name;
  const auto bin_id = id_of(bin.temp_path()), idx_id = id_of(idx.temp_path());
  if (!bin_id || !idx_id) {
    DUFU_FAIL("cannot write '", prefix, "': its temporaries '", bin.temp_path(), "' and '", idx.temp_path(),
              "' vanished (removed by someone else?)");
  }
  marker.bin = *bin_id;
  marker.idx = *idx_id;
  const std::string marker_path = shard_replacing_path(prefix);
  {
    AtomicFile marker_file(marker_path);
    const std::string text = marker_text(marker);
    marker_file.write(text.data(), text.size());
    marker_file.commit();  // durable, directory synced, before any rename
  }
  crash_point("shard-pair:marked");

  // The old pair's sidecar must not describe the new one, even for a moment: its
  // writer publishes a new one once the pair is in place (shard_sidecar.h).
  ::unlink(sidecar_path(prefix).c_str());

  // From here on SIGINT/SIGTERM wait: the temporaries may hold the old files.
  const DeferCleanupSignals defer;
  const std::string bin_temp = bin.temp_path(), idx_temp = idx.temp_path();
  const std::string bin_final = bin_path(prefix), idx_final = idx_path(prefix);
  bin.release();
  idx.release();
  auto drop = [&](bool keep_marker) noexcept {
    ::unlink(bin_temp.c_str());
    ::unlink(idx_temp.c_str());
    if (!keep_marker) ::unlink(marker_path.c_str());
  };

  Placed bin_placed;
  try {
    bin_placed = put_in_place(bin_temp, bin_final);
  } catch (...) {
    drop(false);
    throw;
  }
  crash_point("shard-pair:between-renames");
  Placed idx_placed;
  try {
    idx_placed = put_in_place(idx_temp, idx_final);
  } catch (const Error& error) {
    if (undo_put_in_place(bin_placed, bin_temp, bin_final)) {
      drop(false);
      throw;
    }
    // The old .bin is gone: the marker stays to refuse the mix, and the new .idx stays
    // under its temporary name for the next writer to complete the pair with.
    ::unlink(bin_temp.c_str());
    DUFU_FAIL(error.what(), "; '", bin_final, "' is already the new one, so '", prefix,
              "' is refused until it is written again ('", marker_path, "' marks it)");
  }
  sync_directory(parts.dir);
  crash_point("shard-pair:renamed");
  // Both new files are in place: the marker and the displaced old files can go.
  ::unlink(marker_path.c_str());
  if (bin_placed == Placed::kExchanged) ::unlink(bin_temp.c_str());
  if (idx_placed == Placed::kExchanged) ::unlink(idx_temp.c_str());
}

void refuse_output_that_is_an_input(const std::string& output_prefix, const std::vector<std::string>& inputs) {
  for (const std::string& output : {bin_path(output_prefix), idx_path(output_prefix), sidecar_path(output_prefix)}) {
    struct stat out {};
    if (::stat(output.c_str(), &out) != 0) continue;
    for (const std::string& input : inputs) {
      struct stat in {};
      const int rc = input == "-" ? ::fstat(STDIN_FILENO, &in) : ::stat(input.c_str(), &in);
      if (rc == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
        DUFU_FAIL("input '", input == "-" ? std::string("- (standard input)") : input, "' is the output '", output,
                  "': writing it would destroy what is being read; choose another output prefix");
      }
    }
  }
}

void check_shard_pair(const std::string& prefix) {
  const std::string marker_path = shard_replacing_path(prefix);
  const std::optional<Marker> marker = read_marker(marker_path);
  if (!marker) return;
  const bool bin_new = id_of(bin_path(prefix)) == marker->bin;
  const bool idx_new = id_of(idx_path(prefix)) == marker->idx;
  if (bin_new == idx_new) return;  // both old (the replacement had not begun) or both new
  const bool writing = FileLock::holder_pid(shard_lock_path(prefix)) > 0;
  DUFU_FAIL("cannot open '", prefix, "': its ", bin_new ? ".bin" : ".idx", " is new and its ",
            bin_new ? ".idx" : ".bin", " still the old one, because ",
            writing ? str_cat("process ", marker->pid, " is replacing them right now; try again")
                    : str_cat("process ", marker->pid,
                              " was stopped between renaming the two ('", marker_path,
                              "' marks it); writing the prefix again (dataprep preprocess or merge) "
                              "first completes that replacement"));
}

}  // namespace dufu::dataprep
