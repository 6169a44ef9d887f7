// Shared by the txt and jsonl document-reader targets: which reader options an input
// runs with, and whether its bytes reach the reader as they are.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dufu::fuzz {

// The options come from the input's size, not from its bytes, so that every seed is
// a real txt or jsonl file and a crashing input reproduces with the same options:
// bit 0, bit 1 and bit 2 of the size each switch one option.
inline bool size_bit(std::size_t size, int bit) { return ((size >> bit) & 1) != 0; }

// A short document limit, so that lines over it (and their skipping) are common.
inline constexpr std::size_t kShortDocumentLimit = 64;

// True when the reader sees the bytes as they are: no zstd (or zstd skippable-frame)
// or gzip magic at the start, which would make it decompress them.
inline bool is_plain(const std::uint8_t* data, std::size_t size) {
  if (size >= 4 && data[1] == 0xB5 && data[2] == 0x2F && data[3] == 0xFD && data[0] == 0x28) return false;
  if (size >= 4 && (data[0] & 0xF0) == 0x50 && data[1] == 0x2A && data[2] == 0x4D && data[3] == 0x18) return false;
  if (size >= 2 && data[0] == 0x1F && data[1] == 0x8B) return false;
  return true;
}

}  // namespace dufu::fuzz
