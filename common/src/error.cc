// errno_message: strerror is not thread-safe, and readers, writers and tokenizer
// workers report IO errors from many threads at once.
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

}  // namespace dufu
