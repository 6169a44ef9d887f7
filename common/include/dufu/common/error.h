// dufu's two error types. Library code throws dufu::Error (DUFU_FAIL) for bad input
// and IO failures, and the tools catch it at their boundary to print it as one line
// and exit 1. A broken internal invariant (DUFU_CHECK) is a bug in dufu, not the
// user's input: it throws dufu::InternalError, which carries the source location and
// is deliberately not a dufu::Error, so code that catches bad input (to add the file's
// name, to fall back, to retry) never swallows a bug; the tools print it as
// "internal error: ..." and exit 3, Python raises it as RuntimeError.
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

// A DUFU_CHECK that failed. what() is "internal check failed: CONDITION at
// FILE:LINE[: DETAIL] (a bug in dufu; please report it with this message)".
class InternalError : public std::logic_error {
 public:
  InternalError(const char* condition, const char* file, int line, const std::string& detail);
  const char* condition() const { return condition_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  const char* condition_;
  const char* file_;
  int line_;
};

// Concatenates anything streamable into one string; keeps call sites short.
template <typename... Parts>
std::string str_cat(Parts&&... parts) {
  std::ostringstream out;
  if constexpr (sizeof...(Parts) > 0) (out << ... << std::forward<Parts>(parts));
  return out.str();
}

// Describes errno the way strerror does, but thread-safe.
std::string errno_message(int error_number);

}  // namespace dufu

#define DUFU_FAIL(...) throw ::dufu::Error(::dufu::str_cat(__VA_ARGS__))

#define DUFU_CHECK(condition, ...)                                                               \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      throw ::dufu::InternalError(#condition, __FILE__, __LINE__, ::dufu::str_cat(__VA_ARGS__)); \
    }                                                                                            \
  } while (false)
