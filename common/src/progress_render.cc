// Progress text for people. The bar line is built from parts that each carry an
// importance; parts are dropped, least important first, until the line fits the
// terminal, and the bar takes whatever width is left. Only ASCII is written, so a
// character is a column whatever the locale.
#include "dufu/common/progress_render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dufu/common/error.h"
#include "dufu/common/human_units.h"

namespace dufu {
namespace {

constexpr std::size_t kMinBarColumns = 10;  // "[" + 8 cells + "]"
constexpr std::size_t kMaxBarColumns = 50;
constexpr const char* kSeparator = "  ";

std::string fixed1(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.1f", value);
  return buffer;
}

double shown(const ProgressCounterState& counter, double raw) {
  return raw / (counter.scale > 0 ? counter.scale : 1.0);
}

// Scaled units carry their magnitude ("123.4 MB"); plain counts get k/M/G ("1.23M docs").
std::string amount(const ProgressCounterState& counter) {
  const double value = shown(counter, static_cast<double>(counter.value));
  if (counter.scale == 1.0) return str_cat(human_count(value, true), ' ', counter.name);
  return str_cat(fixed1(value), ' ', counter.name);
}

std::string rate(const ProgressCounterState& counter) {
  const double value = shown(counter, counter.rate);
  if (counter.scale == 1.0) return str_cat(human_count(value, false), ' ', counter.name, "/s");
  return str_cat(fixed1(value), ' ', counter.name, "/s");
}

double fraction_done(const ProgressSnapshot& snapshot) {
  if (snapshot.total == 0 || snapshot.counters.empty()) return 0.0;
  return std::clamp(static_cast<double>(snapshot.counters[0].value) / static_cast<double>(snapshot.total), 0.0, 1.0);
}

std::string percent(const ProgressSnapshot& snapshot) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "%5.1f%%", 100.0 * fraction_done(snapshot));
  return buffer;
}

std::string eta(const ProgressSnapshot& snapshot) {
  return str_cat("ETA ", snapshot.eta_seconds ? format_clock(*snapshot.eta_seconds) : std::string("-:--:--"));
}

// "[=======>     ]" in `columns` columns. Cells are filled by rounding down, so the bar
// is full only when the work is.
std::string bar(double fraction, std::size_t columns) {
  const std::size_t cells = columns - 2;
  const auto filled = static_cast<std::size_t>(std::floor(fraction * static_cast<double>(cells)));
  std::string text = "[";
  text.append(filled, '=');
  if (filled < cells) {
    text += '>';
    text.append(cells - filled - 1, ' ');
  }
  text += ']';
  return text;
}

// Right-aligns `text` in `width` columns, so that numbers changing length between
// redraws do not move the parts after them (or resize the bar).
std::string pad(std::string text, std::size_t width) {
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

// The bar's amounts and rates at fixed widths: "%.1f" of scaled units up to 9999.9,
// human counts ("999", "2.50", "45.6k", "1.23M") up to 5 characters.
std::string padded_amount(const ProgressCounterState& counter) {
  const std::string text = amount(counter);
  const std::size_t unit = counter.name.size() + 1;
  return pad(text, (counter.scale == 1.0 ? 5 : 6) + unit);
}

std::string padded_rate(const ProgressCounterState& counter) {
  const std::string text = rate(counter);
  const std::size_t unit = counter.name.size() + 3;
  return pad(text, (counter.scale == 1.0 ? 5 : 6) + unit);
}

struct Part {
  std::string text;            // empty for the bar, whose width is decided last
  int importance = 0;          // higher stays longer
  bool is_bar = false;
  std::size_t bar_reserve = 0;  // not drawn: columns kept for the bar beyond its minimum
};

}  // namespace

std::string format_clock(double seconds) {
  // An ETA from a rate near zero can be any size; past 99999 hours it says no more
  // (and the conversion to an integer stays defined).
  constexpr double kLongest = 99999.0 * 3600 + 3599;
  const double bounded = std::isnan(seconds) ? 0.0 : std::clamp(std::round(seconds), 0.0, kLongest);
  const auto total = static_cast<long long>(bounded);
  char buffer[48];
  std::snprintf(buffer, sizeof(buffer), "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  return buffer;
}

std::string render_progress_bar(const ProgressSnapshot& snapshot, std::size_t columns) {
  if (columns < 2) return "";
  const std::size_t width = columns - 1;
  const bool known_total = snapshot.total > 0 && !snapshot.counters.empty();

  // In display order.
  std::vector<Part> parts;
  if (!snapshot.label.empty()) parts.push_back({snapshot.label + ":", 60});  // importance: see the header
  if (known_total) {
    parts.push_back({"", 80, true});
    // A bar of 20 columns rather than 10 is worth more than the other counters.
    parts.push_back({"", 52, false, kMinBarColumns});
    parts.push_back({percent(snapshot), 100});
  }
  for (std::size_t i = 0; i < snapshot.counters.size(); ++i) {
    const ProgressCounterState& counter = snapshot.counters[i];
    std::string done = padded_amount(counter);
    if (i == 0 && known_total) {
      // "  1.3/3.1 MB" or "1.23k/45.0k docs": the amount, as wide as the total, and
      // the total in one unit.
      ProgressCounterState total = counter;
      total.value = snapshot.total;
      const std::string of = amount(total);
      done = str_cat(pad(amount(counter).substr(0, amount(counter).rfind(' ')), of.rfind(' ')), '/', of);
    }
    // The first counter is the one the percent and ETA are of; of the others, rates
    // say more than amounts.
    parts.push_back({done, i == 0 ? 55 : 30 - static_cast<int>(i)});
    parts.push_back({padded_rate(counter), i == 0 ? 70 : 50 - static_cast<int>(i)});
  }
  if (snapshot.finished || !known_total) {
    parts.push_back({format_clock(snapshot.elapsed_seconds), snapshot.finished ? 90 : 20});
  } else {
    parts.push_back({eta(snapshot), 90});
  }

  auto fixed_width = [&](const std::vector<Part>& kept) {
    std::size_t total = 0, drawn = 0;
    for (const Part& part : kept) {
      total += part.is_bar ? kMinBarColumns : part.bar_reserve > 0 ? part.bar_reserve : part.text.size();
      drawn += part.bar_reserve > 0 ? 0 : 1;
    }
    return total + (drawn == 0 ? 0 : (drawn - 1) * std::char_traits<char>::length(kSeparator));
  };
  while (parts.size() > 1 && fixed_width(parts) > width) {
    const auto least = std::min_element(parts.begin(), parts.end(),
                                        [](const Part& a, const Part& b) { return a.importance < b.importance; });
    parts.erase(least);
  }

  std::string line;
  std::size_t spare = width - std::min(width, fixed_width(parts));
  for (const Part& part : parts) spare += part.bar_reserve;  // the reserve is the bar's
  for (const Part& part : parts) {
    if (part.bar_reserve > 0) continue;
    if (!line.empty()) line += kSeparator;
    line += part.is_bar ? bar(fraction_done(snapshot), std::min(kMaxBarColumns, kMinBarColumns + spare)) : part.text;
  }
  // Only a terminal too narrow for the most important part alone gets here.
  if (line.size() > width) line.resize(width);
  return line;
}

std::string render_progress_line(const ProgressSnapshot& snapshot) {
  std::string line = snapshot.label.empty() ? std::string() : snapshot.label + ":";
  for (std::size_t i = 0; i < snapshot.counters.size(); ++i) {
    const ProgressCounterState& counter = snapshot.counters[i];
    if (i > 0) line += " |";
    if (!line.empty()) line += ' ';
    line += str_cat(amount(counter), " (", rate(counter), ")");
  }
  if (snapshot.total > 0 && !snapshot.counters.empty()) {
    const double percent = 100.0 * static_cast<double>(snapshot.counters[0].value) / static_cast<double>(snapshot.total);
    line += str_cat(" | ", fixed1(percent), "%");
  }
  line += str_cat(" | ", format_clock(snapshot.elapsed_seconds));
  if (snapshot.total > 0 && !snapshot.finished && snapshot.eta_seconds) {
    line += str_cat(" | ETA ", format_clock(*snapshot.eta_seconds));
  }
  return line;
}

}  // namespace dufu
