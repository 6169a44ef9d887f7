// How dufu reads the JSON tokenizer files where a reader has to choose: a key given
// twice (the last wins, as in HuggingFace tokenizers and Python's json), the eos_token
// of tokenizer_config.json (a token of the tokenizer or refused), a Split pre-tokenizer
// whose pattern matches the empty string (every character a piece), and files that are
// empty or start with a byte-order mark (named as such). The expected ids are those
// HuggingFace tokenizers 0.22.1 (the reference venv's pin,
// scripts/setup_reference_venv.sh) gives for the same files.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/tokenizer.h"
#include "support/expect_error.h"
#include "support/temp_dir_test.h"

namespace dufu::testing {
namespace {

using Ids = std::vector<std::int32_t>;

// GPT-2's bytes_to_unicode: the code point byte b stands for in the vocabulary.
std::uint32_t byte_level_code_point(int b) {
  const auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174; };
  if (printable(b)) return static_cast<std::uint32_t>(b);
  std::uint32_t next = 256;
  for (int x = 0; x < b; ++x) next += printable(x) ? 0 : 1;
  return next;
}

// {"<byte 0>": 0, ..., "<byte 255>": 255 (ids = byte values), then `extra` entries.
std::string vocab_json(const std::string& extra) {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    char key[16];
    std::snprintf(key, sizeof(key), "\"\\u%04X\"", byte_level_code_point(b));
    vocab += std::string(b == 0 ? "" : ",") + key + ":" + std::to_string(b);
  }
  return vocab + extra + "}";
}

constexpr const char* kByteLevel =
    R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";

std::string model_json(const std::string& vocab_extra, const std::string& merges) {
  return R"({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
             "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
             "vocab": )" +
         vocab_json(vocab_extra) + R"(, "merges": )" + merges + "}";
}

// A byte-level tokenizer.json: bytes 0-255, then `vocab_extra`, merging "a b".
std::string tokenizer_json(const std::string& vocab_extra, const std::string& pre_tokenizer = kByteLevel,
                           const std::string& after_model = "") {
  return R"({"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": )" + pre_tokenizer +
         R"(, "decoder": {"type": "ByteLevel"}, "model": )" + model_json(vocab_extra, R"(["a b"])") + after_model +
         "}";
}

class TokenizerJsonRules : public TempDirTest {
 protected:
  Ids encode(const std::string& json, const std::string& text) {
    const dataprep::Tokenizer tokenizer = dataprep::Tokenizer::load(write("tokenizer.json", json));
    Ids ids;
    tokenizer.encode(text, &ids);
    return ids;
  }
};

TEST_F(TokenizerJsonRules, AVocabularyStringGivenTwiceTakesItsLastId) {
  EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256)"), "ab a"), (Ids{256, 32, 97}));
  EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256,"ab":257)"), "ab a"), (Ids{257, 32, 97}));
  // A byte's own string given again: the byte is that id, its first id is unused.
  EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256,"a":257)"), "ab a"), (Ids{256, 32, 257}));
}

TEST_F(TokenizerJsonRules, AnObjectGivenTwiceIsTheLastOne) {
  // The second model has no merges; the second pre-tokenizer adds a prefix space.
  EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256)", kByteLevel, R"(, "model": )" + model_json("", "[]")), "ab a"),
            (Ids{97, 98, 32, 97}));
  EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256)", kByteLevel,
                                  R"(, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true})"),
                   "ab a"),
            (Ids{32, 256, 32, 97}));
}

TEST_F(TokenizerJsonRules, AGpt2VocabularyStringGivenTwiceTakesItsLastId) {
  const dataprep::Tokenizer tokenizer = dataprep::Tokenizer::load(dataprep::TokenizerSpec{
      .model = write("vocab.json", vocab_json(R"(,"ab":256,"ab":257)")), .merges = write("merges.txt", "a b\n"), .pattern = {}});
  Ids ids;
  tokenizer.encode("ab", &ids);
  EXPECT_EQ(ids, (Ids{257}));
}

TEST_F(TokenizerJsonRules, AnEmptySplitPatternMakesEveryCharacterAPiece) {
  for (const std::string pattern : {R"({"Regex": ""})", R"({"String": ""})"}) {
    for (const std::string behavior : {"Isolated", "Removed"}) {
      const std::string pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": )" +
                                        pattern + R"(, "behavior": ")" + behavior + R"(", "invert": false}, )" +
                                        kByteLevel + "]}";
      EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256)", pre_tokenizer), "ab ab"), (Ids{97, 98, 32, 97, 98}))
          << pattern << " " << behavior;
    }
  }
  // A literal pattern (HuggingFace escapes it into a regex) splits where it occurs.
  const std::string on_space = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": " "}, "behavior": "Removed"}, )" +
                               std::string(kByteLevel) + "]}";
  EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256)", on_space), "ab ab"), (Ids{256, 256}));
  // A pattern that can match empty splits where it does (HuggingFace: a|xx|b).
  const std::string pre_tokenizer =
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x*"}, "behavior": "Isolated"}, )" +
      std::string(kByteLevel) + "]}";
  EXPECT_EQ(encode(tokenizer_json(R"(,"ab":256,"xb":257)", pre_tokenizer), "axxb"), (Ids{97, 120, 120, 98}));
}

TEST_F(TokenizerJsonRules, TheConfiguredEosTokenMustBeAToken) {
  const std::string json = tokenizer_json(R"(,"ab":256,"<|endoftext|>":257)");
  const std::string path = write("tokenizer.json", json);
  EXPECT_EQ(dataprep::Tokenizer::load(path).eos_id(), 257);
  write("tokenizer_config.json", R"({"eos_token": {"content": "ab", "__type": "AddedToken"}})");
  EXPECT_EQ(dataprep::Tokenizer::load(path).eos_id(), 256);
  write("tokenizer_config.json", R"({"eos_token": "ab", "eos_token": null})");
  EXPECT_EQ(dataprep::Tokenizer::load(path).eos_id(), 257);
  write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  expect_error([&] { dataprep::Tokenizer::load(path); },
               {"tokenizer_config.json", "eos_token '</s>' is not a token of", path});
  write("tokenizer_config.json", R"({"eos_token": 2})");
  expect_error([&] { dataprep::Tokenizer::load(path); }, {"tokenizer_config.json", "eos_token is a number"});
}

TEST_F(TokenizerJsonRules, EmptyAndByteOrderMarkedFilesAreNamedSo) {
  expect_error([&] { dataprep::Tokenizer::load(write("tokenizer.json", "")); }, {"tokenizer.json", "is empty"});
  expect_error([&] { dataprep::Tokenizer::load(write("tokenizer.json", "\xEF\xBB\xBF" + tokenizer_json(""))); },
               {"tokenizer.json", "byte-order mark", "HINT"});
  // A .json that is not an object is reported by the JSON reader, not as a sentencepiece model.
  const std::string message = expect_error([&] { dataprep::Tokenizer::load(write("tokenizer.json", "[1, 2]")); },
                                           {"tokenizer.json", "HuggingFace"});
  EXPECT_EQ(message.find("sentencepiece"), std::string::npos) << message;
}

}  // namespace
}  // namespace dufu::testing
