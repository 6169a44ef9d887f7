// Derived-index caches: a directory per key, named by the SHA-256 of a canonical
// description of every input that changes the arrays (data files' identity and
// size, split, seq_length, num_samples, seed, format version), with the description
// saved beside the .npy files. Each node builds what it lacks under a file lock while
// its other ranks wait, so no shared filesystem is assumed and nothing is built twice.
#pragma once

#include <functional>
#include <string>

namespace dufu::dataprep {

// Bumped whenever the arrays a description produces would change.
inline constexpr int kIndexCacheFormatVersion = 1;

// Where caches go unless a directory is given: $DUFU_CACHE_DIR, else
// $XDG_CACHE_HOME/dufu, else ~/.cache/dufu.
std::string default_index_cache_dir();

// The identity of a data file for cache keys: absolute path, size, mtime (ns).
std::string file_identity(const std::string& path);

class IndexCache {
 public:
  // `directory` is created if needed.
  explicit IndexCache(std::string directory);

  // Returns the key directory for `description`. If it is not complete yet, takes
  // the key's file lock, checks again, and calls `build(temp_dir)` to write the
  // files into a temporary directory, which is then renamed into place with the
  // description file ("description.txt") and a completion marker. Processes that
  // waited on the lock find the finished directory. A directory written by another
  // format version (recorded in the marker, "done") is an error naming it.
  std::string get_or_build(const std::string& description,
                           const std::function<void(const std::string& temp_dir)>& build) const;
  // The key directory if complete, else an empty string (no building).
  std::string find(const std::string& description) const;
  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
};

}  // namespace dufu::dataprep
