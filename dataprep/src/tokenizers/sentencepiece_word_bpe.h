// sentencepiece's BPE merge loop, re-implemented for the one kind of word where its
// input is known without running sentencepiece's normalizer: a word made only of ASCII
// bytes that the model's normalizer provably leaves as they are, whose normalized form
// is then "▁" + word. The word cache of sentencepiece_tokenizer.cc sends the words it
// misses here first: sentencepiece's own Encode spends most of its time in string-keyed
// hash lookups of candidate pairs, and this loop looks pairs up by the ids of their two
// halves in a flat table instead.
//
// Exact by construction, and checked token for token by tests/dataprep/tokenizer_test.cc:
// sentencepiece (0.1.97, bpe_model.cc) starts from one symbol per character, repeatedly
// merges the adjacent pair whose concatenation is a piece (normal, user-defined or
// unused) of the highest score, the leftmost among equal scores, and emits each final
// symbol's id. Here the same choice is made by a scan over the current pairs. What this
// loop does not reproduce is refused, and the caller uses Encode: a character that is not
// a piece (unknown, byte fallback), a final piece that is unused (sentencepiece splits it
// again), models with user-defined symbols (matched before the characters), and words
// longer than kMaxWord bytes (the scan is quadratic).
//
// Models without normalization rules (normalization_rule_name=identity, as Llama 2's and
// Mistral's) have a second entry, encode_segment: their normalized text is the text with
// each space as "▁" (the dummy prefix aside), so the symbols of any piece of text
// are its characters, and characters outside the vocabulary become byte-fallback pieces
// (<0xAB>) as sentencepiece's Encode makes them, one per byte of the character.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dufu::dataprep::tokenizers {

class SentencePieceWordBpe {
 public:
  static constexpr std::size_t kMaxWord = 255;

  // `charsmap` is the model's NormalizerSpec.precompiled_charsmap (empty: no rules).
  // `identity_normalizer`: the model has no rules and keeps extra whitespace, so
  // encode_segment applies; `byte_fallback`: its TrainerSpec.byte_fallback.
  SentencePieceWordBpe(const sentencepiece::SentencePieceProcessor& processor, std::string_view charsmap,
                       bool identity_normalizer = false, bool byte_fallback = false);

  // True when `byte` is ASCII and normalizes to itself when the bytes around it are ASCII.
  bool is_identity_byte(unsigned char byte) const { return identity_[byte]; }
  // Sets *ids to what sentencepiece's Encode gives `word` and returns true, or returns
  // false (ids unspecified) when the word is not one this loop reproduces exactly.
  bool encode(std::string_view word, std::vector<std::int32_t>* ids) const;
  // For an identity_normalizer model: sets *ids to the pieces sentencepiece's BPE gives
  // the normalized `segment` (its spaces as "▁", no dummy prefix) and returns true,
  // or returns false (ids unspecified) where this loop does not reproduce it: ill-formed
  // UTF-8 (the normalizer makes it U+FFFD), NUL, a character inside pieces that is not
  // one itself, one outside the vocabulary without byte fallback, an unused final piece,
  // a segment longer than kMaxWord bytes.
  bool encode_segment(std::string_view segment, std::vector<std::int32_t>* ids) const;

 private:
  struct Merge {
    std::uint64_t key = kEmpty;  // left symbol << 32 | right symbol
    std::int32_t id = -1;
    float score = 0;
  };
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  // A symbol for a character outside the vocabulary: this bit | its offset in the
  // segment. It never merges; it comes out as the byte pieces of the character.
  static constexpr std::uint32_t kUnknownChar = 0x80000000U;

  const Merge* find(std::uint32_t left, std::uint32_t right) const;
  // Runs the merges over symbols[0, count) and emits the final pieces (the bytes of
  // unknown characters from `text`); false where a final symbol is not a usable piece.
  bool merge_and_emit(std::string_view text, std::uint32_t* symbols, std::size_t count,
                      std::vector<std::int32_t>* ids) const;
  void insert(std::uint32_t left, std::uint32_t right, std::int32_t id, float score);

  std::array<bool, 256> identity_{};
  // Initial symbol of each identity byte and of "▁": its piece id, or, when the
  // character is not a piece, an id past the vocabulary (it can still merge).
  std::array<std::uint32_t, 256> byte_symbol_{};
  std::uint32_t space_symbol_ = 0;
  std::uint32_t vocab_size_ = 0;
  std::vector<bool> unused_;   // by piece id: UNUSED pieces (resegmented by sentencepiece)
  // For encode_segment: ASCII bytes inside some mergeable piece (those that are not
  // pieces themselves merge as pseudo symbols), non-ASCII one-character pieces by code
  // point, non-ASCII characters inside pieces that are not pieces (refused), the
  // byte-fallback pieces by byte (-1: none, or no byte fallback).
  std::array<bool, 256> in_piece_{};
  std::unordered_map<char32_t, std::uint32_t> char_symbol_;
  std::unordered_set<char32_t> inner_only_chars_;
  std::array<std::int32_t, 256> byte_piece_{};
  bool byte_fallback_ = false;
  std::vector<Merge> merges_;  // open addressing, a power of two slots
  std::uint64_t mask_ = 0;
};

}  // namespace dufu::dataprep::tokenizers
