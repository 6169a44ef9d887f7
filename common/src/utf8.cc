// The checks and the lossy conversion over utf8_sequence (utf8.h).
#include "dufu/common/utf8.h"

namespace dufu {

std::size_t first_invalid_utf8(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const Utf8Sequence sequence = utf8_sequence(bytes, i);
    if (!sequence.valid) return i;
    i += sequence.length;
  }
  return std::string_view::npos;
}

bool is_valid_utf8(std::string_view bytes) { return first_invalid_utf8(bytes) == std::string_view::npos; }

std::string utf8_lossy(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string text;
  text.reserve(bytes.size() + 8);
  for (std::size_t i = 0; i < bytes.size();) {
    const Utf8Sequence sequence = utf8_sequence(bytes, i);
    if (sequence.valid) {
      text.append(bytes.substr(i, sequence.length));
    } else {
      text += "\xEF\xBF\xBD";
    }
    i += sequence.length;
  }
  return text;
}

}  // namespace dufu
