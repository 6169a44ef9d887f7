// The one error type of dufu: library code throws dufu::Error for bad input and IO
// failures, and the tools catch it at their boundary to print it and exit non-zero.
// Internal invariants use DUFU_CHECK, which throws with the source location.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dufu {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates anything streamable into one string; keeps call sites short.
template <typename... Parts>
std::string str_cat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

// Describes errno the way strerror does, but thread-safe.
std::string errno_message(int error_number);

}  // namespace dufu

#define DUFU_FAIL(...) throw ::dufu::Error(::dufu::str_cat(__VA_ARGS__))

#define DUFU_CHECK(condition, ...)                                                   \
  do {                                                                               \
    if (!(condition)) {                                                              \
      throw ::dufu::Error(::dufu::str_cat("internal check failed: ", #condition,     \
                                          " at ", __FILE__, ":", __LINE__, " " __VA_OPT__(, ) \
                                          __VA_ARGS__));                             \
    }                                                                                \
  } while (false)
