// Leveled logging by subsystem to stderr. The level comes from DUFU_LOG_LEVEL
// (debug, info, warn, error, off; default info); with more than one rank every line
// is prefixed with the rank so interleaved logs stay readable.
#pragma once

#include <string_view>

#include "dufu/common/error.h"

namespace dufu {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Parses "debug", "info", "warn", "error", "off" (case-insensitive); throws on others.
LogLevel parse_log_level(std::string_view name);
LogLevel log_level();
void set_log_level(LogLevel level);
// Rank prefix for multi-process runs; world_size <= 1 means no prefix.
void set_log_rank(int rank, int world_size);
bool log_enabled(LogLevel level);
void log_message(LogLevel level, std::string_view subsystem, std::string_view message);

}  // namespace dufu

#define DUFU_LOG(level, subsystem, ...)                                           \
  do {                                                                            \
    if (::dufu::log_enabled(level)) {                                             \
      ::dufu::log_message(level, subsystem, ::dufu::str_cat(__VA_ARGS__));        \
    }                                                                             \
  } while (false)
#define DUFU_LOG_DEBUG(subsystem, ...) DUFU_LOG(::dufu::LogLevel::kDebug, subsystem, __VA_ARGS__)
#define DUFU_LOG_INFO(subsystem, ...) DUFU_LOG(::dufu::LogLevel::kInfo, subsystem, __VA_ARGS__)
#define DUFU_LOG_WARN(subsystem, ...) DUFU_LOG(::dufu::LogLevel::kWarn, subsystem, __VA_ARGS__)
#define DUFU_LOG_ERROR(subsystem, ...) DUFU_LOG(::dufu::LogLevel::kError, subsystem, __VA_ARGS__)
