// A hand-written pre-tokenizer for three of tiktoken's patterns (gpt2, cl100k and
// o200k, with tiktoken's `$` = end of text): the same pieces as PCRE2 running the pattern, without
// the per-match call and the JIT's generic backtracking. Character classes (\p{L},
// \p{N}, \s) are PCRE2's own answers, asked once per process for each 256-code-point
// block the text meets, so the only thing written by hand is the order of the alternatives, and
// tests/dataprep/tiktoken_pretokenizer_test.cc checks it against PCRE2 on random
// Unicode strings and the reference corpora.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "dufu/common/utf8.h"

namespace dufu::dataprep {

enum class TiktokenPattern { kGpt2, kCl100k, kO200k };

class TiktokenPretokenizer {
 public:
  // The pattern this matcher implements when `pattern` is that pattern verbatim.
  static bool implements(std::string_view pattern, TiktokenPattern* which);

  explicit TiktokenPretokenizer(TiktokenPattern pattern);
  ~TiktokenPretokenizer();

  // Calls piece(std::string_view) for every match, in order, and returns true; returns
  // false without a call when `text` is not valid UTF-8 (PCRE2's handling of invalid
  // sequences is left to PCRE2).
  template <typename Piece>
  bool split(std::string_view text, Piece&& piece) {
    if (!valid_utf8(text)) return false;
    for (std::size_t begin = 0; begin < text.size();) {
      const std::size_t end = pattern_ == TiktokenPattern::kCl100k  ? match_cl100k(text, begin)
                              : pattern_ == TiktokenPattern::kO200k ? match_o200k(text, begin)
                                                                    : match_gpt2(text, begin);
      piece(text.substr(begin, end - begin));
      begin = end;
    }
    return true;
  }

  // The end of the match that starts at `begin` (< text.size(); text valid UTF-8).
  std::size_t match_cl100k(std::string_view text, std::size_t begin);
  std::size_t match_gpt2(std::string_view text, std::size_t begin);
  std::size_t match_o200k(std::string_view text, std::size_t begin);

 private:
  // \p{L}, \p{N}, \s, and o200k's two case classes: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
  // ("upper") and [\p{Ll}\p{Lm}\p{Lo}\p{M}] ("lower"). kOther tests "none of the first
  // three" (a mark is in both case classes but not \p{L}).
  static constexpr std::uint8_t kLetter = 1, kNumber = 2, kSpace = 4, kUpper = 8, kLower = 16;
  static constexpr std::uint8_t kBasic = kLetter | kNumber | kSpace;
  static bool is_other(std::uint8_t cls) { return (cls & kBasic) == 0; }
  using Char = CodePoint;
  static Char decode(std::string_view text, std::size_t i) { return decode_valid_utf8(text, i); }
  static bool valid_utf8(std::string_view text);
  std::uint8_t classes(char32_t code) {
    if (code < 0x80) return ascii_[code];
    const Block* block = blocks_[code >> 8];
    return block ? (*block)[code & 0xFF] : classify_block(code >> 8)[code & 0xFF];
  }
  using Block = std::array<std::uint8_t, 256>;
  // The process-wide table's block, computed on its first use in the process.
  const Block& classify_block(std::uint32_t block);
  // The end of the run of characters from `i` whose classes satisfy `accept`.
  template <typename Accept>
  std::size_t run(std::string_view text, std::size_t i, Accept&& accept) {
    while (i < text.size()) {
      const Char c = decode(text, i);
      if (!accept(c.code, classes(c.code))) break;
      i += c.length;
    }
    return i;
  }
  std::size_t whitespace(std::string_view text, std::size_t begin, bool line_breaks_end_it);
  static std::size_t previous(std::string_view text, std::size_t i) {
    do --i;
    while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80);
    return i;
  }
  // o200k's pieces: its two letter alternatives from `p` (0 when they do not match
  // there), the contraction after a match, and its whitespace alternatives.
  std::size_t upper_then_lower(std::string_view text, std::size_t p);
  std::size_t upper_run_then_lower(std::string_view text, std::size_t p);
  std::size_t contraction(std::string_view text, std::size_t end);
  std::size_t o200k_whitespace(std::string_view text, std::size_t begin);

  TiktokenPattern pattern_;
  std::array<std::uint8_t, 0x80> ascii_{};  // block 0's first half, without the indirection
  std::vector<const Block*> blocks_;        // this matcher's copies of the table's pointers
  struct Classifier;
};

}  // namespace dufu::dataprep
