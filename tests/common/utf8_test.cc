// The one UTF-8 decoder (common/include/dufu/common/utf8.h) on the ill-formed
// sequences that matter: overlong forms, surrogates, code points above U+10FFFF, bytes
// that never start a character, and sequences cut short. utf8_lossy must give what
// Python's bytes.decode("utf-8", "replace") gives (the values below are Python's), and
// the regex splitter's step over a position must stay one byte on any of them.
#include "dufu/common/utf8.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

namespace dufu {
namespace {

struct LossyCase {
  std::string bytes;
  std::string replaced;  // Python's decode with errors="replace", as UTF-8
};

const std::string kFFFD = "\xEF\xBF\xBD";

std::vector<LossyCase> lossy_cases() {
  return {
      {"\xC0\x80", kFFFD + kFFFD},                         // overlong U+0000
      {"\xC1\xBF", kFFFD + kFFFD},                         // overlong U+007F
      {"\xE0\x80\x80", kFFFD + kFFFD + kFFFD},             // overlong, 3 bytes
      {"\xE0\x9F\xBF", kFFFD + kFFFD + kFFFD},             // overlong U+07FF
      {"\xED\xA0\x80", kFFFD + kFFFD + kFFFD},             // surrogate U+D800
      {"\xED\xBF\xBF", kFFFD + kFFFD + kFFFD},             // surrogate U+DFFF
      {"\xF0\x8F\xBF\xBF", kFFFD + kFFFD + kFFFD + kFFFD},  // overlong U+FFFF
      {"\xF4\x90\x80\x80", kFFFD + kFFFD + kFFFD + kFFFD},  // U+110000
      {"\xF5\x80", kFFFD + kFFFD},                          // never a lead byte
      {"\xFF", kFFFD},
      {"\xE2\x82", kFFFD},         // cut short by the end: one maximal subpart
      {"\xF0\x9F\x98" "A", kFFFD + "A"},  // cut short by an ASCII byte
      {"a\x80" "b", "a" + kFFFD + "b"},   // a lone continuation byte
  };
}

TEST(Utf8, LossyReplacesEachMaximalSubpartLikePython) {
  for (const LossyCase& c : lossy_cases()) {
    SCOPED_TRACE(::testing::PrintToString(c.bytes));
    EXPECT_FALSE(is_valid_utf8(c.bytes));
    EXPECT_EQ(utf8_lossy(c.bytes), c.replaced);
  }
}

TEST(Utf8, WellFormedTextIsKeptAtTheEdgesOfEveryRange) {
  for (const std::string text : {"\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF", "\xC2\x80",
                                 "\xEE\x80\x80", "plain ASCII"}) {
    SCOPED_TRACE(::testing::PrintToString(text));
    EXPECT_TRUE(is_valid_utf8(text));
    EXPECT_EQ(utf8_lossy(text), text);
    const Utf8Sequence first = utf8_sequence(text, 0);
    EXPECT_TRUE(first.valid);
    EXPECT_EQ(first.length, text[0] & 0x80 ? text.size() : 1u);
    if (text.size() <= 4 && (text[0] & 0x80)) {
      EXPECT_EQ(decode_valid_utf8(text, 0).length, text.size());
    }
  }
  EXPECT_EQ(decode_valid_utf8("\xE2\x82\xAC", 0).code, U'\u20AC');
  EXPECT_EQ(decode_valid_utf8("\xF4\x8F\xBF\xBF", 0).code, U'\U0010FFFF');
}

TEST(Utf8, AnIllFormedSequenceReportsItsMaximalSubpart) {
  // What utf8_lossy replaces with one U+FFFD; the regex splitter steps one byte instead.
  EXPECT_EQ(utf8_sequence("\xE2\x82", 0).length, 2u);
  EXPECT_FALSE(utf8_sequence("\xE2\x82", 0).valid);
  EXPECT_EQ(utf8_sequence("\xF0\x9F\x98" "A", 0).length, 3u);
  EXPECT_EQ(utf8_sequence("\xED\xA0\x80", 0).length, 1u);
  EXPECT_EQ(utf8_sequence("\xC0\x80", 0).length, 1u);
  EXPECT_EQ(utf8_sequence("\x80", 0).length, 1u);
  EXPECT_FALSE(utf8_sequence("\x80", 0).valid);
}

}  // namespace
}  // namespace dufu
