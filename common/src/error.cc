// errno_message: strerror is not thread-safe, and readers, writers and tokenizer
// workers report IO errors from many threads at once. InternalError's message.
#include "dufu/common/error.h"

#include <cstring>

namespace dufu {

std::string errno_message(int error_number) {
  char buffer[256];
  // With _GNU_SOURCE (always on for g++) this is the GNU strerror_r, which may return
  // a static string instead of filling the buffer, so only its result is meaningful.
  const char* message = ::strerror_r(error_number, buffer, sizeof(buffer));
  if (message == nullptr || message[0] == '\0') {
    return str_cat("errno ", error_number);
  }
  return message;
}

namespace {

std::string internal_error_message(const char* condition, const char* file, int line, const std::string& detail) {
  return str_cat("internal check failed: ", condition, " at ", file, ":", line, detail.empty() ? "" : ": ", detail,
                 " (a bug in dufu; please report it with this message)");
}

}  // namespace

InternalError::InternalError(const char* condition, const char* file, int line, const std::string& detail)
    : std::logic_error(internal_error_message(condition, file, line, detail)),
      condition_(condition),
      file_(file),
      line_(line) {}

}  // namespace dufu
