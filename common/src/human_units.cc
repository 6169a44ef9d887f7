// Formatting of counts and byte sizes with SI suffixes.
#include "dufu/common/human_units.h"

#include <cmath>
#include <cstdio>
#include <iterator>

namespace dufu {
namespace {

std::string with_suffix(double value, bool whole, const char* const* suffixes, std::size_t count,
                        const char* separator) {
  std::size_t unit = 0;
  while (unit + 1 < count && std::abs(value) >= 999.5) {
    value /= 1000.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0 && whole) {
    std::snprintf(buffer, sizeof(buffer), "%.0f%s%s", value, separator, suffixes[0]);
  } else {
    const char* format = std::abs(value) < 9.995 ? "%.2f%s%s" : std::abs(value) < 99.95 ? "%.1f%s%s" : "%.0f%s%s";
    std::snprintf(buffer, sizeof(buffer), format, value, separator, suffixes[unit]);
  }
  return buffer;
}

}  // namespace

std::string human_count(double value, bool whole) {
  static constexpr const char* kSuffixes[] = {"", "k", "M", "G", "T"};
  return with_suffix(value, whole, kSuffixes, std::size(kSuffixes), "");
}

std::string human_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB"};
  return with_suffix(bytes, true, kUnits, std::size(kUnits), " ");
}

}  // namespace dufu
