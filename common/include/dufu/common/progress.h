// Progress of long work with rates: a redrawn bar on a terminal, a plain line every
// few seconds otherwise (logs, CI), nothing when quiet. Counters are generic (name,
// unit, scale) so common knows nothing of documents or tokens. Thread-safe: workers
// may call add() concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dufu {

struct ProgressCounter {
  std::string name;   // "docs", "MB", "tokens"
  double scale = 1.0; // shown value = raw count / scale (e.g. 1e6 for MB)
};

struct ProgressOptions {
  bool quiet = false;
  // Terminal detection is on the output stream; tests force one or the other.
  enum class Mode { kAuto, kBar, kLines } mode = Mode::kAuto;
  std::chrono::milliseconds bar_interval{200};
  std::chrono::milliseconds line_interval{5000};
  std::FILE* stream = stderr;
};

class Progress {
 public:
  Progress(std::string label, std::vector<ProgressCounter> counters, ProgressOptions options = {});
  ~Progress();  // calls finish()

  // Raw total of counter 0 when known (e.g. input bytes), enabling a percentage.
  void set_total(std::uint64_t total_of_first_counter);
  void add(std::size_t counter, std::uint64_t delta);
  std::uint64_t value(std::size_t counter) const;
  double elapsed_seconds() const;
  // Prints the last line (with newline on a terminal); idempotent.
  void finish();

  // "12.3 docs/s" style line; exposed for tests.
  std::string render_line() const;

 private:
  void maybe_print();

  std::string label_;
  std::vector<ProgressCounter> counters_;
  ProgressOptions options_;
  bool bar_ = false;
  std::unique_ptr<std::atomic<std::uint64_t>[]> values_;
  std::atomic<std::uint64_t> total_{0};
  std::chrono::steady_clock::time_point start_;
  std::mutex print_mutex_;
  std::chrono::steady_clock::time_point last_print_;
  // Nanoseconds after start_ when the next print is due; lets add() decide without
  // touching the mutex.
  std::atomic<std::int64_t> next_print_ns_{0};
  bool finished_ = false;
};

}  // namespace dufu
