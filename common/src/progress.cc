// Progress reporting for long jobs: counters that worker threads bump with relaxed
// atomics, and a printer that only one thread at a time runs, only when a print is
// due, so reporting never slows down or blocks the work it reports on.
#include "dufu/common/progress.h"

#include <unistd.h>

#include <string>

#include "dufu/common/error.h"
#include "dufu/common/human_units.h"

namespace dufu {

namespace {

using Clock = std::chrono::steady_clock;

std::string format(const char* fmt, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), fmt, value);
  return buffer;
}

std::string elapsed_clock(double seconds) {
  const auto total = static_cast<long long>(seconds);
  char buffer[48];
  std::snprintf(buffer, sizeof(buffer), "%lld:%02lld:%02lld", total / 3600, total / 60 % 60,
                total % 60);
  return buffer;
}

std::int64_t nanoseconds(std::chrono::milliseconds interval) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(interval).count();
}

}  // namespace

Progress::Progress(std::string label, std::vector<ProgressCounter> counters,
                   ProgressOptions options)
    : label_(std::move(label)),
      counters_(std::move(counters)),
      options_(options),
      values_(std::make_unique<std::atomic<std::uint64_t>[]>(counters_.size())),
      start_(Clock::now()),
      last_print_(start_) {
  if (options_.stream == nullptr) options_.quiet = true;
  switch (options_.mode) {
    case ProgressOptions::Mode::kBar: bar_ = true; break;
    case ProgressOptions::Mode::kLines: bar_ = false; break;
    case ProgressOptions::Mode::kAuto:
      bar_ = !options_.quiet && ::isatty(::fileno(options_.stream)) == 1;
      break;
  }
  next_print_ns_.store(nanoseconds(bar_ ? options_.bar_interval : options_.line_interval),
                       std::memory_order_relaxed);
}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {
    // A failed last line is not worth terminating for.
  }
}

void Progress::set_total(std::uint64_t total_of_first_counter) {
  total_.store(total_of_first_counter, std::memory_order_relaxed);
}

void Progress::add(std::size_t counter, std::uint64_t delta) {
  DUFU_CHECK(counter < counters_.size(), "progress counter ", counter, " of ", counters_.size());
  values_[counter].fetch_add(delta, std::memory_order_relaxed);
  maybe_print();
}

std::uint64_t Progress::value(std::size_t counter) const {
  DUFU_CHECK(counter < counters_.size(), "progress counter ", counter, " of ", counters_.size());
  return values_[counter].load(std::memory_order_relaxed);
}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void Progress::maybe_print() {
  if (options_.quiet) return;
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  if (now_ns < next_print_ns_.load(std::memory_order_relaxed)) return;
  // Whoever loses the race skips this print instead of waiting for the winner.
  std::unique_lock<std::mutex> lock(print_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;
  // Another thread may have printed between the check above and taking the lock.
  if (now_ns < next_print_ns_.load(std::memory_order_relaxed)) return;
  const auto interval = bar_ ? options_.bar_interval : options_.line_interval;
  next_print_ns_.store(now_ns + nanoseconds(interval), std::memory_order_relaxed);
  last_print_ = Clock::now();

  const std::string line = render_line();
  if (bar_) {
    // Erase-to-end-of-line clears what a longer previous line left behind.
    std::fprintf(options_.stream, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(options_.stream, "%s\n", line.c_str());
  }
  std::fflush(options_.stream);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(print_mutex_);
  if (finished_) return;
  finished_ = true;
  if (options_.quiet) return;
  const std::string line = render_line();
  if (bar_) {
    std::fprintf(options_.stream, "\r%s\033[K\n", line.c_str());
  } else {
    std::fprintf(options_.stream, "%s\n", line.c_str());
  }
  std::fflush(options_.stream);
}

std::string Progress::render_line() const {
  const double seconds = elapsed_seconds();
  std::string line = label_.empty() ? std::string() : label_ + ":";
  for (std::size_t i = 0; i < counters_.size(); ++i) {
    const ProgressCounter& counter = counters_[i];
    const double scale = counter.scale > 0 ? counter.scale : 1.0;
    const double shown = static_cast<double>(value(i)) / scale;
    const double rate = seconds > 0 ? shown / seconds : 0.0;
    if (i > 0) line += " |";
    if (!line.empty()) line += ' ';
    if (scale == 1.0) {
      // Plain counts: "1.23M docs (45.6k docs/s)".
      line += str_cat(human_count(shown, true), ' ', counter.name, " (", human_count(rate, false), ' ',
                      counter.name, "/s)");
    } else {
      // Scaled units already carry their magnitude: "123.4 MB (5.6 MB/s)".
      line += str_cat(format("%.1f", shown), ' ', counter.name, " (", format("%.1f", rate), ' ',
                      counter.name, "/s)");
    }
  }
  const std::uint64_t total = total_.load(std::memory_order_relaxed);
  if (total > 0 && !counters_.empty()) {
    const double percent = 100.0 * static_cast<double>(value(0)) / static_cast<double>(total);
    line += str_cat(" | ", format("%.1f", percent), "%");
  }
  line += str_cat(" | ", elapsed_clock(seconds));
  return line;
}

}  // namespace dufu
