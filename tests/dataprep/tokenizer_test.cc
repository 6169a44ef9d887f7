// Token for token against the real implementations: tiktoken's encode_ordinary (GPT-2,
// cl100k_base, o200k_base), HuggingFace tokenizers (byte-level BPE tokenizer.json of
// three layouts, GPT-2-style vocab.json + merges.txt, all trained with `tokenizers` on
// Debian text) and sentencepiece's EncodeAsIds (BPE and unigram, with and without byte
// fallback), on prose, kernel documentation and code, translated manual pages, edge
// cases and random Unicode. The references' ids come from
// tests/fixtures/make_bpe_fixture.sh (tests/reference/tokenizer_reference.py); end to
// end, `dataprep preprocess` must write the shards that script built with numpy.
#include "dufu/dataprep/tokenizer.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/train_tokenizer.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

using Ids = std::vector<std::int32_t>;

std::string bpe_fixture(const std::string& name) { return std::string(DUFU_FIXTURE_DIR) + "/bpe/" + name; }

const std::vector<std::string>& corpus_names() {
  static const std::vector<std::string> names = {"prose", "docs", "code", "i18n", "edge"};
  return names;
}

std::vector<std::string> read_texts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path + " (run the fixture_bpe test first)");
  std::vector<std::string> texts;
  simdjson::dom::parser parser;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    simdjson::dom::element document;
    std::string_view text;
    if (parser.parse(line).get(document) || document["text"].get(text)) {
      throw std::runtime_error("bad jsonl line in " + path);
    }
    texts.emplace_back(text);
  }
  return texts;
}

std::vector<Ids> read_ids(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path + " (run the fixture_bpe test first)");
  std::vector<Ids> documents;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Ids ids;
    std::int32_t id = 0;
    while (fields >> id) ids.push_back(id);
    documents.push_back(std::move(ids));
  }
  return documents;
}

std::string printable(const std::string& text) {
  std::string shown = text.substr(0, 120);
  for (char& c : shown) {
    if (c == '\n') c = '|';
  }
  return shown;
}

struct Case {
  const char* name;
  const char* model;
  const char* merges;   // relative to the fixture's models/, or ""
  const char* pattern;  // for .tiktoken
};

// The same list as make_bpe_fixture.sh.
const Case kCases[] = {
    {"gpt2", "gpt2.tiktoken", "", "gpt2"},
    {"cl100k", "cl100k_base.tiktoken", "", "cl100k"},
    {"o200k", "o200k_base.tiktoken", "", "o200k"},
    {"hf-bytelevel", "bytelevel.tokenizer.json", "", ""},
    {"hf-split", "split.tokenizer.json", "", ""},
    {"hf-prefix", "prefix.tokenizer.json", "", ""},
    {"hf-nfc", "nfc.tokenizer.json", "", ""},
    {"gpt2-vocab", "gpt2style-vocab.json", "gpt2style-merges.txt", ""},
    {"spm-bpe-fallback-false", "spm-bpe-fallback-false.model", "", ""},
    {"spm-bpe-fallback-true", "spm-bpe-fallback-true.model", "", ""},
    {"spm-unigram-fallback-false", "spm-unigram-fallback-false.model", "", ""},
    {"spm-unigram-fallback-true", "spm-unigram-fallback-true.model", "", ""},
    {"spm-bpe-nosplit", "spm-bpe-nosplit.model", "", ""},
    {"spm-bpe-llama", "spm-bpe-llama.model", "", ""},
};

dataprep::TokenizerSpec spec_of(const Case& c) {
  dataprep::TokenizerSpec spec;
  spec.model = bpe_fixture(std::string("models/") + c.model);
  if (c.merges[0] != '\0') spec.merges = bpe_fixture(std::string("models/") + c.merges);
  spec.pattern = c.pattern;
  return spec;
}

class ReferenceIds : public ::testing::TestWithParam<Case> {};

// Every document of every corpus, through one encoder (its cache warm, as a worker's
// is) and, for a sample, through fresh ones; decoding gives the text back.
TEST_P(ReferenceIds, EveryDocumentOfEveryCorpus) {
  const Case& c = GetParam();
  const auto tokenizer = dataprep::Tokenizer::load(spec_of(c));
  auto encoder = tokenizer.make_encoder();
  std::size_t documents = 0, tokens = 0;
  for (const auto& corpus : corpus_names()) {
    const auto texts = read_texts(bpe_fixture("corpora/" + corpus + ".jsonl"));
    const auto expected = read_ids(bpe_fixture("expected/" + std::string(c.name) + "." + corpus + ".ids"));
    ASSERT_EQ(texts.size(), expected.size()) << corpus;
    Ids ids;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      encoder->encode(texts[i], &ids);
      ASSERT_EQ(ids, expected[i]) << c.name << " " << corpus << " document " << i << ": '" << printable(texts[i])
                                  << "'";
      if (i % 97 == 0) {
        Ids fresh;
        tokenizer.encode(texts[i], &fresh);
        ASSERT_EQ(fresh, expected[i]) << "fresh encoder, " << corpus << " document " << i;
      }
      ++documents;
      tokens += ids.size();
    }
  }
  std::printf("%s: %zu documents, %zu tokens identical to the reference\n", c.name, documents, tokens);
}

// Byte-level tokenizers decode to the text exactly (sentencepiece normalizes).
TEST_P(ReferenceIds, DecodeGivesTheTextBack) {
  const Case& c = GetParam();
  // sentencepiece and NFC normalize the text; add_prefix_space adds a space.
  if (std::string(c.name).starts_with("spm") || std::string(c.name) == "hf-prefix" ||
      std::string(c.name) == "hf-nfc") {
    GTEST_SKIP();
  }
  const auto tokenizer = dataprep::Tokenizer::load(spec_of(c));
  for (const auto& corpus : corpus_names()) {
    const auto texts = read_texts(bpe_fixture("corpora/" + corpus + ".jsonl"));
    const auto expected = read_ids(bpe_fixture("expected/" + std::string(c.name) + "." + corpus + ".ids"));
    for (std::size_t i = 0; i < texts.size(); ++i) {
      ASSERT_EQ(tokenizer.decode(expected[i]), texts[i]) << corpus << " document " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceIds, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.name;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

TEST(TokenizerFacts, VocabularySizeEndOfDocumentAndDtypeRule) {
  struct Fact {
    const char* name;
    std::int64_t vocab;
    std::int32_t eod;
  };
  const Fact facts[] = {{"gpt2", 50257, 50256}, {"cl100k", 100277, 100257}, {"o200k", 200019, 199999}};
  for (const auto& fact : facts) {
    for (const Case& c : kCases) {
      if (std::string(c.name) != fact.name) continue;
      const auto tokenizer = dataprep::Tokenizer::load(spec_of(c));
      EXPECT_EQ(tokenizer.vocab_size(), fact.vocab) << fact.name;
      EXPECT_EQ(tokenizer.eod_id(), fact.eod) << fact.name;
      EXPECT_EQ(tokenizer.piece(fact.eod), "<|endoftext|>");
      EXPECT_NE(tokenizer.name().find("tiktoken"), std::string::npos) << tokenizer.name();
    }
  }
  const auto split = dataprep::Tokenizer::load(bpe_fixture("models/split.tokenizer.json"));
  EXPECT_EQ(split.piece(split.eod_id()), "<|end_of_text|>");
  const auto vocab = dataprep::Tokenizer::load(dataprep::TokenizerSpec{
      .model = bpe_fixture("models/gpt2style-vocab.json"), .merges = bpe_fixture("models/gpt2style-merges.txt"),
      .pattern = {}});
  EXPECT_EQ(vocab.piece(vocab.eod_id()), "<|endoftext|>");
  const auto spm = dataprep::Tokenizer::load(bpe_fixture("models/spm-bpe-fallback-false.model"));
  EXPECT_EQ(spm.piece(spm.eod_id()), "</s>");
}

// sentencepiece's word cache is used exactly where the model allows it.
TEST(TokenizerFacts, SentencePieceWordCacheOnlyWhereExact) {
  for (const char* model : {"spm-bpe-fallback-false", "spm-bpe-fallback-true"}) {
    const auto tokenizer = dataprep::Tokenizer::load(bpe_fixture(std::string("models/") + model + ".model"));
    EXPECT_NE(tokenizer.name().find("word cache"), std::string::npos) << tokenizer.name();
  }
  // Unigram (Viterbi over the whole text), and BPE trained with
  // split_by_whitespace=false (pieces span words): plain Encode.
  for (const char* model : {"spm-unigram-fallback-false", "spm-unigram-fallback-true", "spm-bpe-nosplit"}) {
    const auto tokenizer = dataprep::Tokenizer::load(bpe_fixture(std::string("models/") + model + ".model"));
    EXPECT_EQ(tokenizer.name().find("word cache"), std::string::npos) << tokenizer.name();
  }
}

// The word cache against plain Encode on texts made of few words in many
// arrangements (spaces, tabs, newlines, no-break and ideographic spaces, combining
// marks after spaces), so that every word is met both in and out of the cache.
TEST(TokenizerFacts, SentencePieceWordCacheEqualsEncodeOnRearrangedWords) {
  const std::vector<std::string> words = {"the", "The", "  ", "\t", "\n", "cat", "\xC2\xA0", "\xE3\x80\x80",
                                          "\xCC\x81", "e\xCC\x81", "日本", "x", "<unk>", "\xF0\x9F\x98\x80", "3.14",
                                          "don't", "\xEF\xBD\x81", "\xE2\x96\x81"};
  std::uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>(state >> 33);
  };
  for (const char* model : {"spm-bpe-fallback-true", "spm-bpe-fallback-false"}) {
    const std::string path = bpe_fixture(std::string("models/") + model + ".model");
    const auto tokenizer = dataprep::Tokenizer::load(path);
    auto encoder = tokenizer.make_encoder();
    for (int round = 0; round < 400; ++round) {
      std::string text;
      const std::size_t count = next() % 12;
      for (std::size_t i = 0; i < count; ++i) {
        text += words[next() % words.size()];
        text += std::string(next() % 3, ' ');
      }
      Ids cached, whole;
      encoder->encode(text, &cached);
      tokenizer.encode_uncached(text, &whole);  // one Encode of the whole text
      ASSERT_EQ(cached, whole) << model << ": '" << printable(text) << "'";
    }
  }
}

// Words the cache misses and that are made of ASCII bytes go through dufu's own BPE
// merge loop (sentencepiece_word_bpe.cc), the rest through Encode: random words over
// every printable ASCII byte (runs of one byte, as in "=====" rules, and words longer
// than the loop takes), with characters the normalizer changes or composes inside or
// after them (NBSP, fullwidth letters, combining marks after "a", "<" and "="), other
// scripts, and characters only byte fallback encodes, each text against one Encode.
TEST(TokenizerFacts, SentencePieceAsciiWordsEqualEncode) {
  const std::vector<std::string> others = {"\xC2\xA0", "\xEF\xBD\x81",     "\xCC\x81",     "\xCC\xB8",     "\xCE\xBB",
                                           "日本",     "\xF0\x9F\x98\x80", "\xE2\x96\x81", "\xEA\xB0\x80", "\t",
                                           "\n"};
  std::uint64_t state = 987654321;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>(state >> 33);
  };
  const auto random_word = [&] {
    std::string word;
    const std::size_t length = next() % 8 == 0 ? 1 + next() % 300 : 1 + next() % 12;
    const bool one_byte_run = next() % 6 == 0;
    const char run_byte = static_cast<char>(0x21 + next() % 94);
    const std::string letters = "etaoinshrdlucmfwyp";
    for (std::size_t i = 0; i < length; ++i) {
      if (one_byte_run) {
        word += run_byte;
      } else if (next() % 3 == 0) {
        word += static_cast<char>(0x21 + next() % 94);  // any printable ASCII byte
      } else {
        word += letters[next() % letters.size()];  // letters, so that merges happen
      }
    }
    if (next() % 10 == 0) word.insert(next() % (word.size() + 1), others[next() % others.size()]);
    return word;
  };
  for (const char* model : {"spm-bpe-fallback-true", "spm-bpe-fallback-false"}) {
    const auto tokenizer = dataprep::Tokenizer::load(bpe_fixture(std::string("models/") + model + ".model"));
    for (int round = 0; round < 300; ++round) {
      auto encoder = tokenizer.make_encoder();  // fresh: every word a miss
      std::string text;
      for (std::size_t i = next() % 20; i > 0; --i) text += random_word() + std::string(1 + next() % 2, ' ');
      Ids fast, whole;
      encoder->encode(text, &fast);
      tokenizer.encode_uncached(text, &whole);
      ASSERT_EQ(fast, whole) << model << ": '" << printable(text) << "'";
    }
  }
}

// ASCII characters that are not in the vocabulary (a model trained on lowercase words
// and digits meets capitals and punctuation) must come out as sentencepiece's unknown or
// byte pieces, never merged: the fast BPE loop refuses such words to Encode.
TEST(TokenizerFacts, SentencePieceAsciiOutsideTheVocabularyEqualsEncode) {
  TempDir dir;
  std::uint64_t state = 4242;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>(state >> 33);
  };
  {
    std::ofstream corpus(dir.file("lower.jsonl"));
    const std::string trained = "etaoinshrdlu0123";
    for (int line = 0; line < 3000; ++line) {
      std::string text;
      for (std::size_t word = 1 + next() % 8; word > 0; --word) {
        for (std::size_t i = 1 + next() % 7; i > 0; --i) text += trained[next() % trained.size()];
        text += ' ';
      }
      corpus << "{\"text\": \"" << text << "\"}\n";
    }
  }
  for (const bool byte_fallback : {false, true}) {
    dataprep::TrainTokenizerOptions options;
    options.inputs = {dir.file("lower.jsonl")};
    options.model_prefix = dir.file(byte_fallback ? "fallback" : "plain");
    options.vocab_size = byte_fallback ? 400 : 150;
    options.character_coverage = 1.0;
    options.threads = 1;
    options.extra_args = {std::string("--byte_fallback=") + (byte_fallback ? "true" : "false")};
    dataprep::train_tokenizer(options);
    const auto tokenizer = dataprep::Tokenizer::load(options.model_prefix + ".model");
    ASSERT_NE(tokenizer.name().find("word cache"), std::string::npos) << tokenizer.name();
    const std::string letters = "etaoinshrdlu0123JQZ#~!Xetaoin";
    for (int round = 0; round < 200; ++round) {
      auto encoder = tokenizer.make_encoder();
      std::string text;
      for (std::size_t word = next() % 10; word > 0; --word) {
        for (std::size_t i = 1 + next() % 9; i > 0; --i) text += letters[next() % letters.size()];
        text += ' ';
      }
      Ids fast, whole;
      encoder->encode(text, &fast);
      tokenizer.encode_uncached(text, &whole);
      ASSERT_EQ(fast, whole) << "byte_fallback " << byte_fallback << ": '" << text << "'";
    }
  }
}

// A normalization rule from ASCII to ASCII ("ab" -> "x", "q" -> "k") keeps the bytes it
// starts from out of the BPE merge loop (read from the model's charsmap trie, and from
// its own Encode of each byte), so those words still normalize through Encode.
TEST(TokenizerFacts, SentencePieceAsciiNormalizationRulesEqualEncode) {
  TempDir dir;
  {
    std::ofstream rules(dir.file("rules.tsv"));
    rules << "61 62\t78\n71\t6B\n";
    std::ofstream corpus(dir.file("words.jsonl"));
    for (int line = 0; line < 500; ++line) corpus << "{\"text\": \"cab abba xa kx qa bb ac ca " << line << "\"}\n";
  }
  dataprep::TrainTokenizerOptions options;
  options.inputs = {dir.file("words.jsonl")};
  options.model_prefix = dir.file("rules");
  options.vocab_size = 60;
  options.character_coverage = 1.0;
  options.threads = 1;
  options.extra_args = {"--normalization_rule_tsv=" + dir.file("rules.tsv")};
  dataprep::train_tokenizer(options);
  const auto tokenizer = dataprep::Tokenizer::load(options.model_prefix + ".model");
  ASSERT_NE(tokenizer.name().find("word cache"), std::string::npos) << tokenizer.name();
  for (const std::string text : {"ab", "cab abba", "aab bab", "qq aq qa", "xab abx", "a b ab", "1ab2 c"}) {
    auto encoder = tokenizer.make_encoder();
    Ids fast, whole;
    encoder->encode(text, &fast);
    tokenizer.encode_uncached(text, &whole);
    ASSERT_EQ(fast, whole) << "'" << text << "'";
  }
}

TEST(TokenizerFacts, DecodeOfASplitCharacterGivesReplacementCharacters) {
  const auto tokenizer = dataprep::Tokenizer::load(bpe_fixture("models/cl100k_base.tiktoken"));
  Ids ids;
  tokenizer.encode("\xF0\x9F\x98\x80", &ids);  // one emoji, several byte tokens
  ASSERT_GT(ids.size(), 1U);
  EXPECT_EQ(tokenizer.decode(Ids(ids.begin(), ids.begin() + 1)), "\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer.decode(ids), "\xF0\x9F\x98\x80");
  EXPECT_THROW(tokenizer.decode(Ids{100261}), Error);  // a hole between the specials
  EXPECT_THROW(tokenizer.decode(Ids{-1}), Error);
}

TEST(TokenizerFacts, InvalidUtf8LosesNoByte) {
  for (const char* model : {"cl100k_base.tiktoken", "bytelevel.tokenizer.json"}) {
    const auto tokenizer = dataprep::Tokenizer::load(bpe_fixture(std::string("models/") + model));
    const std::string text = "ab\xFF\xFE cd \xE2\x82 \xC3\xA9t\xC3";
    Ids ids;
    tokenizer.encode(text, &ids);
    EXPECT_EQ(tokenizer.decode(ids), "ab\xEF\xBF\xBD\xEF\xBF\xBD cd \xEF\xBF\xBD \xC3\xA9t\xEF\xBF\xBD") << model;
  }
}

// Files and components dufu does not implement are refused by name.
TEST(TokenizerRefusals, UnsupportedComponentsAreNamed) {
  TempDir dir;
  const std::string base = read_all(bpe_fixture("models/bytelevel.tokenizer.json"));
  const auto refused = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string json = base;
    const auto at = json.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    json.replace(at, from.size(), to);
    write_all(dir.file("tokenizer.json"), json);
    try {
      dataprep::Tokenizer::load(dir.file("tokenizer.json"));
      ADD_FAILURE() << "accepted: " << to;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
  };
  refused("\"normalizer\": null", "\"normalizer\": {\"type\": \"Lowercase\"}", "Lowercase");
  refused("\"normalizer\": null",
          "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Strip\"}]}",
          "Strip");
  refused("\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "WordPiece");
  refused("\"decoder\": {\n    \"type\": \"ByteLevel\"", "\"decoder\": {\n    \"type\": \"WordPiece\"", "WordPiece");
  refused("\"pre_tokenizer\": {\n    \"type\": \"ByteLevel\"", "\"pre_tokenizer\": {\n    \"type\": \"Whitespace\"",
          "Whitespace");
  refused("\"special\": true", "\"special\": false", "special: false");
  refused("\"dropout\": null", "\"dropout\": 0.1", "dropout");

  write_all(dir.file("vocab.json"), read_all(bpe_fixture("models/gpt2style-vocab.json")));
  try {
    dataprep::Tokenizer::load(dir.file("vocab.json"));
    ADD_FAILURE() << "a vocab.json without merges was accepted";
  } catch (const Error& error) {
    // The option, as the Python package names it; the tools say their flag.
    EXPECT_NE(std::string(error.what()).find("`tokenizer_merges`"), std::string::npos) << error.what();
  }
  write_all(dir.file("custom.tiktoken"), read_all(bpe_fixture("models/gpt2.tiktoken")));
  EXPECT_THROW(dataprep::Tokenizer::load(dir.file("custom.tiktoken")), Error);  // which pattern?
  EXPECT_THROW(dataprep::Tokenizer::load(dataprep::TokenizerSpec{
                   .model = dir.file("custom.tiktoken"), .merges = {}, .pattern = "(unclosed"}),
               Error);
  write_all(dir.file("bad.tiktoken"), "IQ== 0\nnot base64! 1\n");
  EXPECT_THROW(dataprep::Tokenizer::load(dir.file("bad.tiktoken")), Error);
}

// A custom regex for a rank file: gpt2's ranks split on whitespace only.
TEST(TokenizerPatterns, ARegexGivenForARankFile) {
  const auto tokenizer = dataprep::Tokenizer::load(dataprep::TokenizerSpec{
      .model = bpe_fixture("models/gpt2.tiktoken"), .merges = {}, .pattern = R"(\S+|\s+)"});
  Ids whole, words;
  tokenizer.encode("hello world", &whole);
  const auto gpt2 = dataprep::Tokenizer::load(bpe_fixture("models/gpt2.tiktoken"));
  gpt2.encode("hello", &words);
  Ids space_world;
  gpt2.encode(" ", &space_world);
  words.insert(words.end(), space_world.begin(), space_world.end());
  Ids world;
  gpt2.encode("world", &world);
  words.insert(words.end(), world.begin(), world.end());
  EXPECT_EQ(whole, words);
}

// --- end to end: dataprep preprocess with each kind of tokenizer file

class PreprocessShards : public ::testing::TestWithParam<const char*> {};

TEST_P(PreprocessShards, AreTheReferenceIdsPlusEodInTheDtypeOfTheRule) {
  const std::string name = GetParam();
  std::string flags;
  for (const Case& c : kCases) {
    if (name != c.name) continue;
    const auto spec = spec_of(c);
    flags = "--tokenizer-model " + shell_quote(spec.model);
    if (!spec.merges.empty()) flags += " --tokenizer-merges " + shell_quote(spec.merges);
  }
  TempDir dir;
  const auto result = run_command(shell_quote(dataprep_tool()) + " preprocess --quiet --append-eod --workers 2 " +
                                  flags + " --input " + shell_quote(bpe_fixture("corpora/mixed.jsonl")) +
                                  " --output-prefix " + shell_quote(dir.file("out")) + " --batch-bytes 65536");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(read_all(dir.file("out.bin")) == read_all(bpe_fixture("expected/" + name + ".shard.bin")))
      << name << ": the .bin differs from the reference";
  std::istringstream lengths(read_all(bpe_fixture("expected/" + name + ".shard.lengths")));
  std::string dtype;
  lengths >> dtype;
  const auto dataset = dataprep::IndexedDataset::open(dir.file("out"), dataprep::IndexImpl::kMmap);
  EXPECT_EQ(std::string(dataprep::dtype_name(dataset->dtype())), dtype);
  std::uint64_t length = 0;
  std::uint64_t sequence = 0;
  while (lengths >> length) {
    ASSERT_LT(sequence, dataset->num_sequences());
    EXPECT_EQ(dataset->sequence(sequence).size(), length) << "document " << sequence;
    ++sequence;
  }
  EXPECT_EQ(sequence, dataset->num_sequences());
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, PreprocessShards,
                         ::testing::Values("gpt2", "cl100k", "o200k", "hf-split", "gpt2-vocab",
                                           "spm-unigram-fallback-true"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace dufu::testing
