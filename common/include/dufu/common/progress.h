// Progress of long work with rates: on a terminal a bar redrawn in place, fitted to
// the terminal's width at every redraw, with percent done, rates averaged over the last
// 10 seconds and an ETA; a plain line every few seconds otherwise (logs, CI); nothing
// when quiet. Counters are generic (name, unit, scale) so common knows nothing of
// documents or tokens. Thread-safe: workers may call add() concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dufu/common/progress_render.h"

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
  // Width of the bar line; 0: the terminal's (TIOCGWINSZ), else $COLUMNS, else 80.
  std::size_t columns = 0;
};

class Progress {
 public:
  Progress(std::string label, std::vector<ProgressCounter> counters, ProgressOptions options = {});
  ~Progress();  // calls finish()

  // Raw total of counter 0 when known (e.g. input bytes), enabling the bar, the
  // percentage and the ETA. Counter 0 must count work done, not work queued.
  void set_total(std::uint64_t total_of_first_counter);
  void add(std::size_t counter, std::uint64_t delta);
  // Adds deltas[i] to counter i, then prints if due: a line never shows some counters
  // of a step updated and others not.
  void add_each(std::initializer_list<std::uint64_t> deltas);
  std::uint64_t value(std::size_t counter) const;
  double elapsed_seconds() const;
  // Prints the last line (with newline on a terminal); idempotent.
  void finish();

  // The plain line (rates averaged since the start) and the bar line (rates over the
  // last 10 s) at `columns`; exposed for tests.
  std::string render_line() const;
  std::string render_bar(std::size_t columns) const;

 private:
  struct Sample {
    double seconds;
    std::vector<std::uint64_t> values;
  };
  void maybe_print();
  void record_sample();
  ProgressSnapshot snapshot(bool windowed_rates, bool finished) const;
  std::size_t columns() const;

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
  // Values at past prints, oldest first, reaching back just over the rate window.
  mutable std::mutex samples_mutex_;
  std::vector<Sample> samples_;
};

}  // namespace dufu
