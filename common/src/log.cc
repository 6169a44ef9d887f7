// Leveled, subsystem-tagged logging to stderr. Kept deliberately small: one global
// level from DUFU_LOG_LEVEL, one rank prefix, one mutex so lines from worker threads
// never interleave mid-line.
#include "dufu/common/log.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace dufu {

namespace {

constexpr const char* kLevelNames[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

std::mutex& write_mutex() {
  static std::mutex mutex;
  return mutex;
}

void write_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(write_mutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

LogLevel level_from_environment() {
  const char* value = std::getenv("DUFU_LOG_LEVEL");
  if (value == nullptr || value[0] == '\0') return LogLevel::kInfo;
  try {
    return parse_log_level(value);
  } catch (const Error&) {
    // A typo in the environment should not stop a long run, but must not pass silently.
    write_line(str_cat("[dufu WARN LOG] DUFU_LOG_LEVEL='", value,
                       "' is not one of debug, info, warn, error, off; using info\n"));
    return LogLevel::kInfo;
  }
}

// Function-local static: read the environment exactly once, on first use, from
// whichever thread gets there first.
std::atomic<LogLevel>& level_storage() {
  static std::atomic<LogLevel> level{level_from_environment()};
  return level;
}

std::atomic<int> log_rank{0};
std::atomic<int> log_world_size{1};

}  // namespace

LogLevel parse_log_level(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warn") return LogLevel::kWarn;
  if (lower == "error") return LogLevel::kError;
  if (lower == "off") return LogLevel::kOff;
  DUFU_FAIL("invalid log level '", name, "' (expected debug, info, warn, error or off)");
}

LogLevel log_level() { return level_storage().load(std::memory_order_relaxed); }

void set_log_level(LogLevel level) { level_storage().store(level, std::memory_order_relaxed); }

void set_log_rank(int rank, int world_size) {
  log_rank.store(rank, std::memory_order_relaxed);
  log_world_size.store(world_size, std::memory_order_relaxed);
}

bool log_enabled(LogLevel level) {
  return level != LogLevel::kOff && static_cast<int>(level) >= static_cast<int>(log_level());
}

void log_message(LogLevel level, std::string_view subsystem, std::string_view message) {
  // Checked again here for callers that skip the macro.
  if (!log_enabled(level)) return;
  std::string line;
  if (log_world_size.load(std::memory_order_relaxed) > 1) {
    line = str_cat("[rank ", log_rank.load(std::memory_order_relaxed), "] ");
  }
  line += str_cat("[dufu ", kLevelNames[static_cast<int>(level)], ' ', subsystem, "] ", message);
  if (line.empty() || line.back() != '\n') line += '\n';
  write_line(line);
}

}  // namespace dufu
