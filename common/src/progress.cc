// Progress reporting for long jobs: counters that worker threads bump with relaxed
// atomics, and a printer that only one thread at a time runs, only when a print is
// due, so reporting never slows down or blocks the work it reports on.
#include "dufu/common/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "dufu/common/environment_seconds.h"
#include "dufu/common/error.h"

namespace dufu {

namespace {

using Clock = std::chrono::steady_clock;

// Rates on the bar, and the ETA, are over this much recent time: long enough to smooth
// out work that arrives in batches, short enough to follow a change of pace.
constexpr double kRateWindowSeconds = 10.0;
constexpr std::size_t kDefaultColumns = 80;

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
  samples_.push_back({0.0, std::vector<std::uint64_t>(counters_.size(), 0)});
  if (options_.stream == nullptr) options_.quiet = true;
  switch (options_.mode) {
    case ProgressOptions::Mode::kBar: bar_ = true; break;
    case ProgressOptions::Mode::kLines: bar_ = false; break;
    case ProgressOptions::Mode::kAuto:
      bar_ = !options_.quiet && ::isatty(::fileno(options_.stream)) == 1;
      break;
  }
  // The user's redraw interval wins over the caller's: a log collector may want lines
  // more often or less, and a test needs redraws on a machine of any speed.
  auto& interval = bar_ ? options_.bar_interval : options_.line_interval;
  const double seconds = positive_seconds_from_environment("DUFU_PROGRESS_INTERVAL", 0.0);
  if (seconds > 0.0) {
    interval = std::max(std::chrono::milliseconds(1),
                        std::chrono::milliseconds(std::llround(std::min(seconds, 1e6) * 1000.0)));
  }
  next_print_ns_.store(nanoseconds(interval), std::memory_order_relaxed);
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

void Progress::add_each(std::initializer_list<std::uint64_t> deltas) {
  DUFU_CHECK(deltas.size() <= counters_.size(), deltas.size(), " progress deltas for ", counters_.size(), " counters");
  std::size_t counter = 0;
  for (const std::uint64_t delta : deltas) values_[counter++].fetch_add(delta, std::memory_order_relaxed);
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
  record_sample();

  if (bar_) {
    // Erase-to-end-of-line clears what a longer previous line left behind; the width
    // is asked again each time, so a resized terminal gets a line that fits.
    std::fprintf(options_.stream, "\r%s\033[K", render_bar(columns()).c_str());
  } else {
    std::fprintf(options_.stream, "%s\n", render_line().c_str());
  }
  std::fflush(options_.stream);
}

void Progress::record_sample() {
  Sample sample{elapsed_seconds(), std::vector<std::uint64_t>(counters_.size())};
  for (std::size_t i = 0; i < counters_.size(); ++i) sample.values[i] = value(i);
  std::lock_guard<std::mutex> lock(samples_mutex_);
  samples_.push_back(std::move(sample));
  // Keep one sample at or before the window's start, as the base of the rates.
  const double window_start = samples_.back().seconds - kRateWindowSeconds;
  std::size_t drop = 0;
  while (drop + 1 < samples_.size() && samples_[drop + 1].seconds <= window_start) ++drop;
  samples_.erase(samples_.begin(), samples_.begin() + static_cast<std::ptrdiff_t>(drop));
}

std::size_t Progress::columns() const {
  if (options_.columns > 0) return options_.columns;
  winsize size{};
  if (::ioctl(::fileno(options_.stream), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* env = std::getenv("COLUMNS")) {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value > 0 && value < 100000) return static_cast<std::size_t>(value);
  }
  return kDefaultColumns;
}

ProgressSnapshot Progress::snapshot(bool windowed_rates, bool finished) const {
  ProgressSnapshot snapshot;
  snapshot.label = label_;
  snapshot.total = total_.load(std::memory_order_relaxed);
  snapshot.elapsed_seconds = elapsed_seconds();
  snapshot.finished = finished;
  Sample base;
  {
    // The newest sample at least a window old, else the oldest (the start).
    std::lock_guard<std::mutex> lock(samples_mutex_);
    const double window_start = snapshot.elapsed_seconds - kRateWindowSeconds;
    std::size_t at = 0;
    while (at + 1 < samples_.size() && samples_[at + 1].seconds <= window_start) ++at;
    base = samples_[at];
  }
  const double window_seconds = snapshot.elapsed_seconds - base.seconds;
  std::vector<double> windowed(counters_.size(), 0.0);
  for (std::size_t i = 0; i < counters_.size(); ++i) {
    ProgressCounterState counter{counters_[i].name, counters_[i].scale, value(i), 0.0};
    // Counters only grow, but a value read before the sample was taken can be older.
    const double recent = static_cast<double>(counter.value) - static_cast<double>(base.values[i]);
    windowed[i] = window_seconds > 0 ? std::max(0.0, recent) / window_seconds : 0.0;
    const double average =
        snapshot.elapsed_seconds > 0 ? static_cast<double>(counter.value) / snapshot.elapsed_seconds : 0.0;
    counter.rate = windowed_rates && !finished ? windowed[i] : average;
    snapshot.counters.push_back(std::move(counter));
  }
  if (snapshot.total > 0 && !snapshot.counters.empty()) {
    const std::uint64_t done = snapshot.counters[0].value;
    if (done >= snapshot.total) {
      snapshot.eta_seconds = 0.0;
    } else if (windowed[0] > 0) {
      snapshot.eta_seconds = static_cast<double>(snapshot.total - done) / windowed[0];
    }
  }
  return snapshot;
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(print_mutex_);
  if (finished_) return;
  finished_ = true;
  if (options_.quiet) return;
  if (bar_) {
    const std::string line = render_progress_bar(snapshot(/*windowed_rates=*/false, /*finished=*/true), columns());
    std::fprintf(options_.stream, "\r%s\033[K\n", line.c_str());
  } else {
    const std::string line = render_progress_line(snapshot(/*windowed_rates=*/false, /*finished=*/true));
    std::fprintf(options_.stream, "%s\n", line.c_str());
  }
  std::fflush(options_.stream);
}

std::string Progress::render_line() const {
  return render_progress_line(snapshot(/*windowed_rates=*/false, /*finished=*/false));
}

std::string Progress::render_bar(std::size_t columns) const {
  return render_progress_bar(snapshot(/*windowed_rates=*/true, /*finished=*/false), columns);
}

}  // namespace dufu
