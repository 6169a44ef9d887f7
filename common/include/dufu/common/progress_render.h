// Formats a state of progress for people: the bar a terminal redraws in place, fitted
// to its width so that it never wraps, and the plain line of logs. Pure functions of a
// snapshot, so any state can be rendered at any width (Progress takes the snapshots).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dufu {

struct ProgressCounterState {
  std::string name;          // "MB", "docs", "tokens"
  double scale = 1.0;        // shown value = raw / scale
  std::uint64_t value = 0;   // raw count so far
  double rate = 0.0;         // raw units per second
};

struct ProgressSnapshot {
  std::string label;
  std::vector<ProgressCounterState> counters;
  std::uint64_t total = 0;  // raw total of counter 0; 0 when unknown (no bar, percent or ETA)
  double elapsed_seconds = 0.0;
  std::optional<double> eta_seconds;  // unknown while nothing has been done
  bool finished = false;              // the last line: elapsed time instead of an ETA
};

// "H:MM:SS".
std::string format_clock(double seconds);

// At most columns - 1 characters (ASCII only, so characters are columns; writing into
// the last column makes some terminals wrap). As the width shrinks, parts are dropped,
// least important first; by importance: percent, ETA, a bar of at least 10 columns,
// the first counter's rate, the label, its amount, 10 more columns of bar, the other
// rates, their amounts, the elapsed time (on the last line: after the percent). The bar gets the columns left over (at most 50). A width too small
// for the most important part alone cuts it.
std::string render_progress_bar(const ProgressSnapshot& snapshot, std::size_t columns);

// The plain line of logs: "label: 12.3 MB (4.5 MB/s) | 1.23k docs (45.6 docs/s) |
// 42.0% | 0:00:12 | ETA 0:00:17", every part always present.
std::string render_progress_line(const ProgressSnapshot& snapshot);

}  // namespace dufu
