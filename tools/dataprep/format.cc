// Number formatting shared by the subcommands' summaries.
#include "format.h"

#include <cstdio>

namespace dufu::tools {

std::string human_count(double value) {
  const char* suffixes[] = {"", "k", "M", "G", "T"};
  int index = 0;
  while (value >= 1000.0 && index < 4) {
    value /= 1000.0;
    ++index;
  }
  char text[64];
  std::snprintf(text, sizeof(text), index == 0 ? "%.0f%s" : "%.2f%s", value, suffixes[index]);
  return text;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int index = 0;
  while (bytes >= 1000.0 && index < 4) {
    bytes /= 1000.0;
    ++index;
  }
  char text[64];
  std::snprintf(text, sizeof(text), index == 0 ? "%.0f %s" : "%.2f %s", bytes, units[index]);
  return text;
}

std::string rate(double amount, double seconds) {
  return human_count(seconds > 0 ? amount / seconds : 0.0);
}

}  // namespace dufu::tools
