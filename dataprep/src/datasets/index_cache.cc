// IndexCache: one directory per description hash, published by renaming a finished
// temporary directory into place, so a reader sees either nothing or a complete
// cache. Builders of one key are serialised by a file lock (between processes) and a
// mutex (between threads, which fcntl locks do not separate).
#include "dufu/dataprep/index_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>

#include "dufu/common/atomic_file.h"
#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/file_lock.h"
#include "dufu/common/log.h"

namespace dufu::dataprep {

namespace fs = std::filesystem;

namespace {

constexpr char kDescriptionFile[] = "description.txt";
// Written last inside the temporary directory: a key directory without it was not
// made by a finished build (or was damaged by hand) and is rebuilt.
constexpr char kDoneFile[] = "done";
constexpr char kDoneLinePrefix[] = "dufu index cache format v";
// 128 bits of SHA-256 keep names short; a collision is still caught by comparing
// the stored description.
constexpr std::size_t kKeyHexDigits = 32;

std::string done_line() { return str_cat(kDoneLinePrefix, kIndexCacheFormatVersion, "\n"); }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DUFU_FAIL("cannot read '", path, "': ", errno_message(errno));
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) DUFU_FAIL("cannot read '", path, "'");
  return text;
}

void write_text(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// fcntl locks belong to the process, so threads of one process building the same key
// are kept apart here. Entries are never erased: one mutex per key ever built.
std::mutex& key_mutex(const std::string& lock_path) {
  static std::mutex registry_mutex;
  static std::map<std::string, std::unique_ptr<std::mutex>> registry;
  std::lock_guard<std::mutex> guard(registry_mutex);
  auto& slot = registry[lock_path];
  if (!slot) slot = std::make_unique<std::mutex>();
  return *slot;
}

// A build killed after it published its key but before it unlinked the key's lock
// file leaves the file behind, and later runs take the fast path past it. The key's
// next user removes it when nobody holds it; where it cannot (a read-only cache
// directory), the file only stays.
void remove_stale_lock(const std::string& lock_path) {
  if (!exists(lock_path)) return;
  std::lock_guard<std::mutex> thread_guard(key_mutex(lock_path));
  try {
    if (const auto lock = FileLock::try_lock(lock_path)) lock->remove_file_on_unlock();
  } catch (const Error&) {
  }
}

struct KeyPaths {
  std::string key;
  std::string dir;
  std::string lock;
};

KeyPaths key_paths(const std::string& directory, const std::string& description) {
  std::string key = sha256_hex(description).substr(0, kKeyHexDigits);
  return {key, directory + "/" + key, directory + "/" + key + ".lock"};
}

// Complete means: the done marker exists. Then the marker's format version and the
// stored description must both match, or the directory is not ours to use.
bool verify_complete(const std::string& dir, const std::string& description) {
  const std::string done_path = dir + "/" + kDoneFile;
  if (!exists(done_path)) return false;
  const std::string marker = read_text(done_path);
  if (marker != done_line()) {
    std::string found = marker.substr(0, marker.find('\n'));
    if (found.rfind(kDoneLinePrefix, 0) == 0) found = "v" + found.substr(sizeof(kDoneLinePrefix) - 1);
    DUFU_FAIL("index cache '", dir, "' was written by another cache format (", found,
              "; this build reads v", kIndexCacheFormatVersion,
              "). HINT: delete that directory to rebuild it");
  }
  const std::string description_path = dir + "/" + kDescriptionFile;
  if (!exists(description_path) || read_text(description_path) != description) {
    DUFU_FAIL("cache collision or corruption in '", dir, "': its ", kDescriptionFile,
              " does not match the requested indices. HINT: delete that directory to rebuild it");
  }
  return true;
}

void remove_tree(const std::string& path) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) DUFU_FAIL("cannot remove '", path, "': ", error.message());
}

std::string absolute_normal(const std::string& path) {
  std::error_code error;
  fs::path absolute = fs::absolute(path, error);
  if (error) DUFU_FAIL("cannot resolve '", path, "': ", error.message());
  std::string text = absolute.lexically_normal().string();
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  return text;
}

}  // namespace

std::string default_index_cache_dir() {
  if (const char* dir = std::getenv("DUFU_CACHE_DIR"); dir != nullptr && dir[0] != '\0') {
    return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] != '\0') {
    return std::string(xdg) + "/dufu";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return std::string(home) + "/.cache/dufu";
  }
  // Batch systems sometimes start jobs without HOME; the password entry still knows it.
  if (const passwd* entry = ::getpwuid(::getuid()); entry != nullptr && entry->pw_dir != nullptr) {
    return std::string(entry->pw_dir) + "/.cache/dufu";
  }
  DUFU_FAIL("no cache directory: set DUFU_CACHE_DIR (or XDG_CACHE_HOME or HOME)");
}

std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    DUFU_FAIL("cannot stat '", path, "': ", errno_message(errno));
  }
  const auto mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return str_cat(absolute_normal(path), " size=", static_cast<std::uint64_t>(st.st_size),
                 " mtime_ns=", mtime_ns);
}

IndexCache::IndexCache(std::string directory) : directory_(absolute_normal(directory)) {
  std::error_code error;
  fs::create_directories(directory_, error);
  if (error || !fs::is_directory(directory_)) {
    DUFU_FAIL("cannot create index cache directory '", directory_, "': ",
              error ? error.message() : std::string("not a directory"));
  }
}

std::string IndexCache::find(const std::string& description) const {
  const KeyPaths paths = key_paths(directory_, description);
  return verify_complete(paths.dir, description) ? paths.dir : std::string();
}

std::string IndexCache::get_or_build(const std::string& description,
                                     const std::function<void(const std::string& temp_dir)>& build) const {
  const KeyPaths paths = key_paths(directory_, description);
  // Fast path without any lock, so read-only cache directories work once filled.
  if (verify_complete(paths.dir, description)) {
    remove_stale_lock(paths.lock);
    return paths.dir;
  }

  std::lock_guard<std::mutex> thread_guard(key_mutex(paths.lock));
  FileLock process_guard(paths.lock);
  // One lock file per key ever built would pile up beside the caches.
  process_guard.remove_file_on_unlock();
  // Whoever held the lock before us may have finished the same key.
  if (verify_complete(paths.dir, description)) return paths.dir;

  // Holding the key's lock, any leftover of this key is from a build that died:
  // an unmarked key directory or temporaries named after the key.
  if (exists(paths.dir)) {
    DUFU_LOG_WARN("DATA", "removing incomplete index cache '", paths.dir, "'");
    remove_tree(paths.dir);
  }
  const std::string temp_prefix = ".tmp-" + paths.key + "-";
  for (const auto& entry : fs::directory_iterator(directory_)) {
    if (entry.path().filename().string().rfind(temp_prefix, 0) == 0) remove_tree(entry.path().string());
  }

  std::string temp = directory_ + "/" + temp_prefix + "XXXXXX";
  if (::mkdtemp(temp.data()) == nullptr) {
    DUFU_FAIL("cannot create a temporary directory in index cache '", directory_, "': ",
              errno_message(errno));
  }
  try {
    DUFU_LOG_INFO("DATA", "building index cache '", paths.dir, "'");
    build(temp);
    write_text(temp + "/" + kDescriptionFile, description);
    // Inside the temporary, so the rename publishes files and marker at once.
    write_text(temp + "/" + kDoneFile, done_line());
    if (::rename(temp.c_str(), paths.dir.c_str()) != 0) {
      DUFU_FAIL("cannot rename '", temp, "' to '", paths.dir, "': ", errno_message(errno));
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    throw;
  }
  sync_directory(directory_);
  return paths.dir;
}

}  // namespace dufu::dataprep
