#include "dufu/common/environment_seconds.h"

#include <cmath>
#include <cstdlib>

#include "dufu/common/error.h"

namespace dufu {

double positive_seconds_from_environment(const char* name, double fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(seconds > 0.0) || !std::isfinite(seconds)) {
    DUFU_FAIL("environment variable ", name, "='", value, "' is not a positive number of seconds");
  }
  return seconds;
}

}  // namespace dufu
