// The gpt2 and cl100k patterns, alternative by alternative (PCRE2 takes the first
// alternative that matches at a position; `++`, `?+`, `{1,3}+` never give back):
//   gpt2:   '(?:[sdmt]|ll|ve|re) | ?\p{L}++ | ?\p{N}++ | ?[^\s\p{L}\p{N}]++ |\s++$ |\s+(?!\S) |\s
//   cl100k: '(?i:[sdmt]|ll|ve|re) |[^\r\n\p{L}\p{N}]?+\p{L}++ |\p{N}{1,3}+
//           | ?[^\s\p{L}\p{N}]++[\r\n]*+ |\s++$ |\s*[\r\n] |\s+(?!\S) |\s
//   o200k:  P?U*L+C? |P?U+L*C? |\p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n/]* |\s*[\r\n]+ |\s+(?!\S) |\s+
//           with P = [^\r\n\p{L}\p{N}], U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
//           L = [\p{Ll}\p{Lm}\p{Lo}\p{M}], C = (?i:'s|'t|'re|'ve|'m|'ll|'d); nothing
//           possessive, so U* gives back characters until L+ can match (U and L share
//           Lm, Lo and M), and P? is given back when the rest fails without it.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tiktoken_pretokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "dufu/common/error.h"
#include "pretokenizer_patterns.h"

namespace dufu::dataprep {

// PCRE2's classes of single characters, compiled as the splitter compiles patterns.
struct TiktokenPretokenizer::Classifier {
  std::array<pcre2_code*, 5> codes{};
  pcre2_match_data* match_data = nullptr;
  Classifier() {
    const char* const patterns[] = {R"(\p{L})", R"(\p{N})", R"(\s)", R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])",
                                    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])"};
    for (std::size_t k = 0; k < codes.size(); ++k) {
      int error = 0;
      PCRE2_SIZE offset = 0;
      codes[k] = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(patterns[k]), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error, &offset, nullptr);
      if (codes[k] == nullptr) DUFU_FAIL("cannot compile the character class ", patterns[k], " (PCRE2 ", error, ")");
    }
    match_data = pcre2_match_data_create(1, nullptr);
    if (match_data == nullptr) throw std::bad_alloc();
  }
  ~Classifier() {
    for (pcre2_code* code : codes) pcre2_code_free(code);
    pcre2_match_data_free(match_data);
  }
  std::uint8_t classes(char32_t code) {
    if (code >= 0xD800 && code <= 0xDFFF) return 0;  // never in valid UTF-8
    char utf8[4];
    std::size_t length = 0;
    if (code < 0x80) {
      utf8[length++] = static_cast<char>(code);
    } else if (code < 0x800) {
      utf8[length++] = static_cast<char>(0xC0 | (code >> 6));
      utf8[length++] = static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      utf8[length++] = static_cast<char>(0xE0 | (code >> 12));
      utf8[length++] = static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      utf8[length++] = static_cast<char>(0x80 | (code & 0x3F));
    } else {
      utf8[length++] = static_cast<char>(0xF0 | (code >> 18));
      utf8[length++] = static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      utf8[length++] = static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      utf8[length++] = static_cast<char>(0x80 | (code & 0x3F));
    }
    std::uint8_t result = 0;
    for (std::size_t k = 0; k < codes.size(); ++k) {
      if (pcre2_match(codes[k], reinterpret_cast<PCRE2_SPTR>(utf8), length, 0, 0, match_data, nullptr) >= 0) {
        result |= static_cast<std::uint8_t>(1U << k);
      }
    }
    return result;
  }
};

bool TiktokenPretokenizer::implements(std::string_view pattern, TiktokenPattern* which) {
  if (pattern == tokenizers::kGpt2Pattern) {
    *which = TiktokenPattern::kGpt2;
    return true;
  }
  if (pattern == tokenizers::kCl100kPattern) {
    *which = TiktokenPattern::kCl100k;
    return true;
  }
  if (pattern == tokenizers::kO200kPattern) {
    *which = TiktokenPattern::kO200k;
    return true;
  }
  return false;
}

TiktokenPretokenizer::TiktokenPretokenizer(TiktokenPattern pattern) : pattern_(pattern), blocks_(0x110000 >> 8) {
  const auto& first_block = classify_block(0);
  std::copy(first_block.begin(), first_block.begin() + 0x80, ascii_.begin());
}

TiktokenPretokenizer::~TiktokenPretokenizer() = default;

const TiktokenPretokenizer::Block& TiktokenPretokenizer::classify_block(std::uint32_t block) {
  // Shared by every matcher of the process: asking PCRE2 (interpreted) 768 times per
  // block costs a fresh encoder ~30 ms on CJK text, whose ideographs span 82 blocks.
  // Blocks are written once under the lock and never freed.
  static std::mutex mutex;
  static std::vector<std::unique_ptr<const Block>> table(0x110000 >> 8);
  static std::unique_ptr<Classifier> classifier;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!table[block]) {
    if (!classifier) classifier = std::make_unique<Classifier>();
    auto classes = std::make_unique<Block>();
    for (std::uint32_t k = 0; k < 256; ++k) (*classes)[k] = classifier->classes((block << 8) | k);
    table[block] = std::move(classes);
  }
  blocks_[block] = table[block].get();
  return *blocks_[block];
}

bool TiktokenPretokenizer::valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    // The multi-byte rest: utf8.h's strict check (no overlongs, surrogates).
    const std::size_t start = i;
    while (i < text.size() && static_cast<unsigned char>(text[i]) >= 0x80) ++i;
    if (!is_valid_utf8(text.substr(start, i - start))) return false;
  }
  return true;
}

// The whitespace alternatives, from a \s at `begin`: \s++$, then (cl100k only, with
// line_breaks_end_it) \s*[\r\n], then \s+(?!\S), then \s.
std::size_t TiktokenPretokenizer::whitespace(std::string_view text, std::size_t begin, bool line_breaks_end_it) {
  std::size_t end = begin, last_start = begin, after_line_break = 0;
  while (end < text.size()) {
    const Char c = decode(text, end);
    if ((classes(c.code) & kSpace) == 0) break;
    last_start = end;
    end += c.length;
    if (c.code == '\r' || c.code == '\n') after_line_break = end;
  }
  if (end == text.size()) return end;
  if (line_breaks_end_it && after_line_break != 0) return after_line_break;
  // \s+ gives back its last character, which then is the \s the lookahead needs.
  if (last_start > begin) return last_start;
  return end;
}

std::size_t TiktokenPretokenizer::match_gpt2(std::string_view text, std::size_t begin) {
  const auto letter = [](char32_t, std::uint8_t cls) { return (cls & kLetter) != 0; };
  const auto number = [](char32_t, std::uint8_t cls) { return (cls & kNumber) != 0; };
  const auto other = [](char32_t, std::uint8_t cls) { return is_other(cls); };
  const Char first = decode(text, begin);
  if (first.code == '\'' && begin + 1 < text.size()) {
    const char next = text[begin + 1];
    if (next == 's' || next == 'd' || next == 'm' || next == 't') return begin + 2;
    if (begin + 2 < text.size()) {
      const std::string_view two = text.substr(begin + 1, 2);
      if (two == "ll" || two == "ve" || two == "re") return begin + 3;
    }
  }
  std::uint8_t cls = classes(first.code);
  std::size_t start = begin;
  if (first.code == ' ' && begin + 1 < text.size()) {
    // ` ?X++`: the space belongs to a run of letters, numbers or other characters after it.
    const std::uint8_t next = classes(decode(text, begin + 1).code);
    if ((next & kSpace) == 0) {
      start = begin + 1;
      cls = next;
    }
  }
  if (cls & kLetter) return run(text, start, letter);
  if (cls & kNumber) return run(text, start, number);
  if (is_other(cls)) return run(text, start, other);
  return whitespace(text, begin, false);
}

std::size_t TiktokenPretokenizer::match_cl100k(std::string_view text, std::size_t begin) {
  const auto letter = [](char32_t, std::uint8_t cls) { return (cls & kLetter) != 0; };
  const auto other = [](char32_t, std::uint8_t cls) { return is_other(cls); };
  const auto line_break = [](char32_t code, std::uint8_t) { return code == '\r' || code == '\n'; };
  const Char first = decode(text, begin);
  if (first.code == '\'' && begin + 1 < text.size()) {
    // Caseless under Unicode rules: s also matches U+017F (long s), which PCRE2 folds to it.
    const Char next = decode(text, begin + 1);
    switch (next.code) {
      case 's':
      case 'S':
      case 'd':
      case 'D':
      case 'm':
      case 'M':
      case 't':
      case 'T':
      case 0x17F:
        return begin + 1 + next.length;
      default:
        break;
    }
    if (begin + 2 < text.size()) {
      const auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); };
      const std::string two{lower(text[begin + 1]), lower(text[begin + 2])};
      if (two == "ll" || two == "ve" || two == "re") return begin + 3;
    }
  }
  const std::uint8_t cls = classes(first.code);
  if (cls & kLetter) return run(text, begin, letter);
  const bool is_line_break = first.code == '\r' || first.code == '\n';
  if (!is_line_break && (cls & kNumber) == 0) {
    // [^\r\n\p{L}\p{N}]?+\p{L}++: one such character, then letters.
    const std::size_t after = begin + first.length;
    if (after < text.size() && (classes(decode(text, after).code) & kLetter) != 0) return run(text, after, letter);
  }
  if (cls & kNumber) {
    std::size_t end = begin + first.length;
    for (int count = 1; count < 3 && end < text.size(); ++count) {
      const Char c = decode(text, end);
      if ((classes(c.code) & kNumber) == 0) break;
      end += c.length;
    }
    return end;
  }
  // ` ?[^\s\p{L}\p{N}]++[\r\n]*+`
  std::size_t start = begin;
  if (first.code == ' ' && begin + 1 < text.size() && is_other(classes(decode(text, begin + 1).code))) start = begin + 1;
  if (start != begin || is_other(cls)) return run(text, run(text, start, other), line_break);
  return whitespace(text, begin, true);
}

// U*L+ from p: U* as long as it can be with L+ still matching after it (then L+ takes
// the longest run), or 0.
std::size_t TiktokenPretokenizer::upper_then_lower(std::string_view text, std::size_t p) {
  const auto upper = [](char32_t, std::uint8_t cls) { return (cls & kUpper) != 0; };
  const auto lower = [](char32_t, std::uint8_t cls) { return (cls & kLower) != 0; };
  for (std::size_t j = run(text, p, upper);; j = previous(text, j)) {
    if (j < text.size() && (classes(decode(text, j).code) & kLower) != 0) return run(text, j, lower);
    if (j == p) return 0;
  }
}

// U+L* from p, or 0.
std::size_t TiktokenPretokenizer::upper_run_then_lower(std::string_view text, std::size_t p) {
  const auto upper = [](char32_t, std::uint8_t cls) { return (cls & kUpper) != 0; };
  const auto lower = [](char32_t, std::uint8_t cls) { return (cls & kLower) != 0; };
  if (p >= text.size() || (classes(decode(text, p).code) & kUpper) == 0) return 0;
  return run(text, run(text, p, upper), lower);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)? after a match ending at `end`: where it ends.
std::size_t TiktokenPretokenizer::contraction(std::string_view text, std::size_t end) {
  if (end + 1 >= text.size() || text[end] != '\'') return end;
  const Char next = decode(text, end + 1);
  switch (next.code) {
    case 's':
    case 'S':
    case 0x17F:  // long s: caseless 's' under Unicode rules
    case 't':
    case 'T':
    case 'm':
    case 'M':
    case 'd':
    case 'D':
      return end + 1 + next.length;
    default:
      break;
  }
  if (end + 2 < text.size()) {
    const auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); };
    const std::string two{lower(text[end + 1]), lower(text[end + 2])};
    if (two == "re" || two == "ve" || two == "ll") return end + 3;
  }
  return end;
}

// \s*[\r\n]+ |\s+(?!\S) |\s+ from a \s at `begin`: past the run's last line break if it
// has one; else the run, but for its last character when something follows it.
std::size_t TiktokenPretokenizer::o200k_whitespace(std::string_view text, std::size_t begin) {
  std::size_t end = begin, last_start = begin, after_line_break = 0;
  while (end < text.size()) {
    const Char c = decode(text, end);
    if ((classes(c.code) & kSpace) == 0) break;
    last_start = end;
    end += c.length;
    if (c.code == '\r' || c.code == '\n') after_line_break = end;
  }
  if (after_line_break != 0) return after_line_break;
  if (end == text.size() || last_start == begin) return end;
  return last_start;
}

std::size_t TiktokenPretokenizer::match_o200k(std::string_view text, std::size_t begin) {
  const Char first = decode(text, begin);
  const std::uint8_t cls = classes(first.code);
  const bool prefix = first.code != '\r' && first.code != '\n' && (cls & (kLetter | kNumber)) == 0;
  const std::size_t after_prefix = begin + first.length;
  // The two letter alternatives, each first with the prefix character, then without.
  for (int alternative = 0; alternative < 2; ++alternative) {
    const auto letters = [&](std::size_t p) {
      return alternative == 0 ? upper_then_lower(text, p) : upper_run_then_lower(text, p);
    };
    std::size_t end = prefix ? letters(after_prefix) : 0;
    if (end == 0) end = letters(begin);
    if (end != 0) return contraction(text, end);
  }
  if (cls & kNumber) {
    std::size_t end = after_prefix;
    for (int count = 1; count < 3 && end < text.size(); ++count) {
      const Char c = decode(text, end);
      if ((classes(c.code) & kNumber) == 0) break;
      end += c.length;
    }
    return end;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
  const auto other = [](char32_t, std::uint8_t c) { return is_other(c); };
  const auto breaks_or_slashes = [](char32_t code, std::uint8_t) { return code == '\r' || code == '\n' || code == '/'; };
  std::size_t start = begin;
  if (first.code == ' ' && after_prefix < text.size() && is_other(classes(decode(text, after_prefix).code))) {
    start = after_prefix;
  }
  if (start != begin || is_other(cls)) return run(text, run(text, start, other), breaks_or_slashes);
  return o200k_whitespace(text, begin);
}

}  // namespace dufu::dataprep
