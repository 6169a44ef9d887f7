// UTF-8, one decoder for every reader of text (the tokenizers, the TOML configuration).
// Well formed is Unicode's definition (table 3-7): no
// overlong forms, no surrogates (U+D800-U+DFFF), nothing above U+10FFFF; PCRE2, Python
// and Rust agree on it. What a caller does with the rest differs and stays the
// caller's: utf8_lossy replaces each maximal subpart with one U+FFFD (as Python's
// errors="replace" and Rust's from_utf8_lossy do), the regex splitter steps over one
// byte, is_valid_utf8 only answers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dufu {

struct Utf8Sequence {
  // Well formed: the bytes of the character. Not: the bytes of the maximal subpart (the
  // lead byte and the continuation bytes that are valid after it), at least 1.
  std::size_t length;
  bool valid;
};

// The sequence that starts at text[i] (i < text.size()); one cut short by the end of
// `text` is not well formed.
inline Utf8Sequence utf8_sequence(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return {1, true};
  std::size_t length = 0;
  // The range of the second byte; later ones are 0x80-0xBF.
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;  // overlong below U+0800
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;  // overlong below U+10000
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return {1, false};
  }
  std::size_t good = 1;
  while (good < length && i + good < text.size()) {
    const unsigned char next = byte(i + good);
    if (next < (good == 1 ? low : 0x80) || next > (good == 1 ? high : 0xBF)) break;
    ++good;
  }
  return {good, good == length};
}

// A character of text already known to be well formed: its code point and length.
struct CodePoint {
  char32_t code;
  std::uint8_t length;
};
inline CodePoint decode_valid_utf8(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[i + k])); };
  const char32_t lead = byte(0);
  if (lead < 0x80) return {lead, 1};
  if (lead < 0xE0) return {((lead & 0x1F) << 6) | (byte(1) & 0x3F), 2};
  if (lead < 0xF0) return {((lead & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F), 3};
  return {((lead & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F), 4};
}

// The offset of the first byte of the first sequence in `bytes` that is not well
// formed, or npos.
std::size_t first_invalid_utf8(std::string_view bytes);

// True if `bytes` is well-formed UTF-8.
bool is_valid_utf8(std::string_view bytes);

// `bytes` with each maximal subpart of an ill-formed sequence replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace dufu
