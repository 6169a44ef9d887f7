// An output file that appears under its final name only when complete: bytes go to a
// temporary name in the same directory, commit() flushes, fsyncs and renames, and a
// file that is destroyed without commit() removes its temporary. A failed run never
// leaves a half-written file under the final name.
//
// Temporaries (and other paths registered below) are also removed when the process
// is stopped by SIGINT, SIGTERM or SIGHUP, once a tool has called
// install_cleanup_signal_handlers(). SIGKILL cannot be caught: the temporary's name
// carries the writer's pid, so the next writer of the same output can tell a dead
// writer's leftover from a live one's (temporary_owner_pid) and remove it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dufu {

// fsyncs a directory so that renames and creations inside it survive a crash. File
// systems that cannot sync directories (EINVAL) are accepted: the entries are then as
// durable as they allow. Throws dufu::Error naming the directory when it cannot be
// opened or synced.
void sync_directory(const std::string& dir);

class AtomicFile {
 public:
  // Creates "<dir>/.<name>.tmp.<pid>.<n>" next to final_path. Throws dufu::Error.
  explicit AtomicFile(std::string final_path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();  // removes the temporary unless committed

  // Buffered append; throws dufu::Error (e.g. disk full) naming the final path.
  void write(const void* data, std::size_t size);
  template <typename T>
  void write_value(const T& value) {
    write(&value, sizeof(T));
  }
  std::uint64_t bytes_written() const { return bytes_written_; }

  // Flushes, fsyncs, renames to the final name and fsyncs the directory.
  void commit();
  // Flushes, fsyncs and closes the temporary without renaming it, so that every
  // write that can fail (a full disk, a file size limit) has failed before any of
  // several files is renamed. commit() may follow; no write may.
  void prepare();
  // After prepare(): the caller takes the temporary over (to rename it together with
  // others). This object no longer removes it, and neither does the signal cleanup.
  void release() noexcept;
  // Removes the temporary now (also done by the destructor).
  void discard() noexcept;

  const std::string& final_path() const { return final_path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush_buffer();

  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  int cleanup_slot_ = -1;
  bool prepared_ = false;
  bool committed_ = false;
  std::vector<char> buffer_;
  std::size_t buffered_ = 0;
  std::uint64_t bytes_written_ = 0;
};

// The pid in the name of an AtomicFile temporary ".<name>.tmp.<pid>.<n>" whose <name>
// is `final_name` (a file name, no directory), or 0 if `file_name` is not one.
int temporary_owner_pid(const std::string& file_name, const std::string& final_name);
// True unless kill(pid, 0) says no such process.
bool process_exists(int pid) noexcept;

// Signal cleanup. Paths registered here are unlinked by the handlers that
// install_cleanup_signal_handlers() sets for SIGINT, SIGTERM and SIGHUP, which then
// let the signal end the process as it would have. The handlers only call unlink and
// raise, so they are async-signal-safe. At most a few hundred paths are tracked;
// beyond that, registration silently does nothing and cleanup falls to the next run.
void install_cleanup_signal_handlers();
int register_cleanup_path(const std::string& path) noexcept;  // slot, or -1
void unregister_cleanup_path(int slot) noexcept;

// A write past the file size limit (`ulimit -f`, RLIMIT_FSIZE) raises SIGXFSZ, whose
// default ends the process without a word (exit status 153) and before any cleanup.
// Ignored, the write fails with EFBIG ("File too large") instead, which the writer
// reports and cleans up after as it does a full disk. Every tool calls it first.
void ignore_file_size_signal() noexcept;

// Holds those signals back while alive (for a sequence of renames that must not be
// cut short); a signal that arrived meanwhile takes effect when the last one ends.
class DeferCleanupSignals {
 public:
  DeferCleanupSignals() noexcept;
  DeferCleanupSignals(const DeferCleanupSignals&) = delete;
  DeferCleanupSignals& operator=(const DeferCleanupSignals&) = delete;
  ~DeferCleanupSignals();
};

// Fault injection for tests: if the environment variable DUFU_CRASH_POINT equals
// `name`, the process kills itself with SIGKILL here, as a power cut or the OOM
// killer would stop it. Costs a getenv; meant for the few steps of a commit.
void crash_point(const char* name);

}  // namespace dufu
