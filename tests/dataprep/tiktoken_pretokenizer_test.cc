// The hand-written gpt2/cl100k/o200k pre-tokenizer against PCRE2 running tiktoken's pattern
// (RegexSplitter, the path it replaces): the same pieces on random Unicode strings
// built to hit every alternative's edges (contractions and U+017F, runs of Unicode
// whitespace before line breaks and at the end, numbers of every category, combining
// marks, 4-byte characters, code points from the whole range), and refusal of text
// that is not valid UTF-8, which stays with PCRE2.
#include "tokenizers/tiktoken_pretokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tokenizers/pretokenizer_patterns.h"
#include "tokenizers/regex_splitter.h"

namespace dufu::dataprep {
namespace {

std::string utf8(char32_t code) {
  std::string out;
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

std::string random_text(std::mt19937_64& random) {
  static const std::vector<char32_t> alphabet = {
      'a',     'Z',    's',    'S',      'd',    'D',     'm',    't',    'T',    'l',    'L', 'v', 'V',
      'e',     'E',    'r',    'R',      'x',    '\'',    '\'',   '0',    '7',    ' ',    ' ', ' ', '\t',
      '\r',    '\n',   '\n',   '\v',     '\f',   '.',     '(',    '/',    '-',    '_',    '"', '$',
      0x17F,                                                                               // long s: caseless 's'
      0x212A,                                                                              // Kelvin sign: caseless 'k'
      0xA0,    0x85,   0x1680, 0x180E,   0x2003, 0x2028,  0x2029, 0x200B, 0x3000, 0xFEFF,  // spaces and near-spaces
      0xE9,    0x416,  0x436,  0x65E5,   0x672C, 0x1C5,   0x2B0,  0x301,  0x93F,           // letters, marks
      0xC9,    0x410,  0x1C4,  0x1C6,    0x5D0,  0x2C6,   0x20DD, 0x903,  'Q',  'q',       // Lu, Lt's pair, Lo, Lm, Me, Mc
      0x663,   0x216B, 0xBD,   0x2460,   0xFF11, 0x1D7CE,                                  // numbers of Nd, Nl, No
      0x1F600, 0x2014, 0xAB,   0x10FFFF, 0xE000};
  std::uniform_int_distribution<std::size_t> length(0, 24);
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<std::uint32_t> any(0, 0x10FFFF);
  std::string text;
  const std::size_t n = length(random);
  for (std::size_t k = 0; k < n; ++k) {
    char32_t code = alphabet[pick(random)];
    if (random() % 8 == 0) {
      do code = any(random);
      while (code >= 0xD800 && code <= 0xDFFF);
    }
    text += utf8(code);
  }
  return text;
}

std::vector<std::string> pcre2_pieces(RegexSplitter::Matcher& matcher, std::string_view text) {
  std::vector<std::string> pieces;
  matcher.split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

void expect_pcre2_pieces(const char* pattern, TiktokenPattern expected_kind) {
  TiktokenPattern kind{};
  ASSERT_TRUE(TiktokenPretokenizer::implements(pattern, &kind));
  ASSERT_EQ(kind, expected_kind);
  const RegexSplitter splitter(pattern, RegexDialect::kTiktoken);
  RegexSplitter::Matcher matcher(splitter);
  TiktokenPretokenizer pretokenizer(kind);
  std::mt19937_64 random(12);
  for (int round = 0; round < 30000; ++round) {
    const std::string text = random_text(random);
    std::vector<std::string> pieces;
    ASSERT_TRUE(pretokenizer.split(text, [&](std::string_view piece) { pieces.emplace_back(piece); }));
    ASSERT_EQ(pieces, pcre2_pieces(matcher, text)) << "text: '" << text << "'";
  }
}

TEST(TiktokenPretokenizer, Gpt2PiecesArePcre2sOnRandomUnicode) {
  expect_pcre2_pieces(tokenizers::kGpt2Pattern, TiktokenPattern::kGpt2);
}

TEST(TiktokenPretokenizer, Cl100kPiecesArePcre2sOnRandomUnicode) {
  expect_pcre2_pieces(tokenizers::kCl100kPattern, TiktokenPattern::kCl100k);
}

// o200k: nothing possessive, so the case classes' overlap (Lm, Lo and marks are both
// "upper" and "lower") makes PCRE2 give characters back; the random alphabet has each.
TEST(TiktokenPretokenizer, O200kPiecesArePcre2sOnRandomUnicode) {
  expect_pcre2_pieces(tokenizers::kO200kPattern, TiktokenPattern::kO200k);
}

TEST(TiktokenPretokenizer, OtherPatternsAndInvalidUtf8AreLeftToPcre2) {
  TiktokenPattern kind{};
  EXPECT_FALSE(TiktokenPretokenizer::implements(tokenizers::kHuggingFaceByteLevelPattern, &kind));
  TiktokenPretokenizer pretokenizer(TiktokenPattern::kCl100k);
  int calls = 0;
  for (const std::string text : {"ab\xC3", "\xED\xA0\x80", "x\xC0\xAFy", "\xF4\x90\x80\x80"}) {
    EXPECT_FALSE(pretokenizer.split(text, [&](std::string_view) { ++calls; })) << text;
  }
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace dufu::dataprep
