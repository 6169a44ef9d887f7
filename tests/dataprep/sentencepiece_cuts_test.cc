// sentencepiece BPE models without normalization rules (Llama 2's settings) go through
// dufu's cut path (dataprep/src/tokenizers/sentencepiece_segments.h): the text cut where
// no piece of the vocabulary spans, each part through a cache and dufu's merge loop.
// Against one sentencepiece Encode of the whole text, on texts built to meet every
// kind of cut and every fallback: runs of spaces, tabs and newlines at the start, the
// end and between words, digit runs, characters only byte fallback encodes, "▁" written
// in the text, ill-formed UTF-8, NUL, long parts. tokenizer_test.cc's ReferenceIds
// compares the fixture's Llama-style model with the Python reference on real corpora.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "dufu/dataprep/tokenizer.h"
#include "dufu/dataprep/train_tokenizer.h"
#include "support/temp_dir.h"

namespace dufu::testing {
namespace {

using Ids = std::vector<std::int32_t>;

const std::vector<std::string>& fragments() {
  static const std::vector<std::string> list = {
      "the", "The", "cat", "int", "return", "x", " ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "0",
      "12", "2024", "3.14", "(", ");", "{", "}", "->", "==", "//", "/*", "*/", "#include", "<stdio.h>",
      "\xD1\x80\xD1\x83\xD1\x81",                  // Cyrillic
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",      // CJK
      "\xC3\xA9t\xC3\xA9",                         // accented Latin
      "\xE2\x96\x81",                              // "▁" written in the text
      "\xF0\x9F\x98\x80",                          // an emoji: byte fallback
      "\xEA\xB0\x80", "\xE0\xB8\x81",              // Hangul, Thai: rare, byte fallback
      "\xFF", "\xE2\x96", "\xC3",                  // ill-formed UTF-8
      std::string(1, '\0'), "\x01", "\x7F",        // NUL and other control bytes
      std::string(70, 'a'), std::string(300, ' '), // past the cache and the merge loop
  };
  return list;
}

std::string random_text(std::uint64_t* state) {
  const auto next = [&] {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>(*state >> 33);
  };
  std::string text;
  for (std::size_t count = next() % 14; count > 0; --count) {
    text += fragments()[next() % fragments().size()];
    if (next() % 2 == 0) text += std::string(next() % 3, ' ');
  }
  return text;
}

std::string printable(const std::string& text) {
  std::string shown;
  for (const char c : text.substr(0, 160)) {
    const auto byte = static_cast<unsigned char>(c);
    shown += byte < 0x20 ? "\\x" + std::to_string(byte) : std::string(1, c);
  }
  return shown;
}

// Random texts through one warm encoder and (every fourth) through a fresh one, against
// one Encode each.
void expect_encode_equal(const dataprep::Tokenizer& tokenizer, std::uint64_t seed, int rounds) {
  std::uint64_t state = seed;
  auto warm = tokenizer.make_encoder();
  for (int round = 0; round < rounds; ++round) {
    const std::string text = random_text(&state);
    Ids whole, cached, fresh;
    tokenizer.encode_uncached(text, &whole);
    warm->encode(text, &cached);
    ASSERT_EQ(cached, whole) << tokenizer.name() << ": '" << printable(text) << "'";
    if (round % 4 != 0) continue;  // a fresh encoder allocates its cache (megabytes)
    tokenizer.make_encoder()->encode(text, &fresh);
    ASSERT_EQ(fresh, whole) << tokenizer.name() << " (fresh encoder): '" << printable(text) << "'";
  }
}

std::string fixture_model(const std::string& name) {
  return std::string(DUFU_FIXTURE_DIR) + "/bpe/models/" + name + ".model";
}

TEST(SentencePieceCuts, LlamaSettingsTakeTheCutPath) {
  const auto tokenizer = dataprep::Tokenizer::load(fixture_model("spm-bpe-llama"));
  EXPECT_NE(tokenizer.name().find("cut where no piece spans"), std::string::npos) << tokenizer.name();
  // The default normalizer keeps the word cache, unigram plain Encode.
  for (const char* other : {"spm-bpe-fallback-true", "spm-unigram-fallback-true"}) {
    const auto default_normalizer = dataprep::Tokenizer::load(fixture_model(other));
    EXPECT_EQ(default_normalizer.name().find("cut where"), std::string::npos) << default_normalizer.name();
  }
}

TEST(SentencePieceCuts, LlamaSettingsEqualEncodeOnEdgeCases) {
  const auto tokenizer = dataprep::Tokenizer::load(fixture_model("spm-bpe-llama"));
  for (const std::string& text :
       {std::string(), std::string(" "), std::string("  "), std::string("\n"), std::string("\t"), std::string(" a"),
        std::string("a "), std::string("   leading"), std::string("trailing \t\n  "), std::string("a\n\n\tb"),
        std::string("x = 1234567890;"), std::string("\xE2\x96\x81\xE2\x96\x81x"), std::string("\xF0\x9F\x98\x80 a"),
        std::string("a\0b", 3), std::string("\xFF\xFE "), std::string(500, ' ') + "x"}) {
    Ids whole, fast;
    tokenizer.encode_uncached(text, &whole);
    tokenizer.make_encoder()->encode(text, &fast);
    EXPECT_EQ(fast, whole) << "'" << printable(text) << "'";
  }
  Ids ids;
  tokenizer.make_encoder()->encode("", &ids);
  EXPECT_TRUE(ids.empty());
}

TEST(SentencePieceCuts, LlamaSettingsEqualEncodeOnRandomTexts) {
  const auto tokenizer = dataprep::Tokenizer::load(fixture_model("spm-bpe-llama"));
  expect_encode_equal(tokenizer, 20261127, 1500);
}

// The cuts come from the vocabulary, not from the trainer's options: models whose
// pieces do cross spaces (split_by_whitespace=false) and join digits, with and without
// the dummy prefix and byte fallback, trained here in a second, still encode as Encode.
TEST(SentencePieceCuts, CutsFollowTheVocabulary) {
  TempDir dir;
  {
    std::ofstream corpus(dir.file("mixed.jsonl"));
    std::uint64_t state = 77;
    for (int line = 0; line < 1500; ++line) {
      std::string text = random_text(&state) + " of the cat  in  the hat 1234 12 ";
      std::string escaped;
      for (const char c : text) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20 || byte == 0x7F || byte >= 0x80 || c == '"' || c == '\\') continue;
        escaped += c;
      }
      corpus << "{\"text\": \"" << escaped << " \xD1\x80\xD1\x83\xD1\x81 \xC3\xA9t\xC3\xA9\"}\n";
    }
  }
  struct Variant {
    const char* name;
    std::vector<std::string> args;
  };
  const std::vector<std::string> identity = {"--normalization_rule_name=identity", "--remove_extra_whitespaces=false"};
  const Variant variants[] = {
      {"no-split-no-prefix",
       {"--split_by_whitespace=false", "--add_dummy_prefix=false", "--byte_fallback=true",
        "--allow_whitespace_only_pieces=true"}},
      {"digits-joined-no-fallback", {"--split_digits=false", "--byte_fallback=false"}},
  };
  for (const auto& variant : variants) {
    dataprep::TrainTokenizerOptions options;
    options.inputs = {dir.file("mixed.jsonl")};
    options.model_prefix = dir.file(variant.name);
    options.vocab_size = 400;
    options.character_coverage = 1.0;
    options.threads = 1;
    options.extra_args = identity;
    options.extra_args.insert(options.extra_args.end(), variant.args.begin(), variant.args.end());
    dataprep::train_tokenizer(options);
    const auto tokenizer = dataprep::Tokenizer::load(options.model_prefix + ".model");
    ASSERT_NE(tokenizer.name().find("cut where no piece spans"), std::string::npos) << tokenizer.name();
    expect_encode_equal(tokenizer, 99, 600);
  }
}

}  // namespace
}  // namespace dufu::testing
