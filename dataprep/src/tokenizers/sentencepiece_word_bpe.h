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
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dufu::dataprep::tokenizers {

class SentencePieceWordBpe {
 public:
  static constexpr std::size_t kMaxWord = 255;

  // `charsmap` is the model's NormalizerSpec.precompiled_charsmap (empty: no rules).
  SentencePieceWordBpe(const sentencepiece::SentencePieceProcessor& processor, std::string_view charsmap);

  // True when `byte` is ASCII and normalizes to itself when the bytes around it are ASCII.
  bool is_identity_byte(unsigned char byte) const { return identity_[byte]; }
  // Sets *ids to what sentencepiece's Encode gives `word` and returns true, or returns
  // false (ids unspecified) when the word is not one this loop reproduces exactly.
  bool encode(std::string_view word, std::vector<std::int32_t>* ids) const;

 private:
  struct Merge {
    std::uint64_t key = kEmpty;  // left symbol << 32 | right symbol
    std::int32_t id = -1;
    float score = 0;
  };
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  const Merge* find(std::uint32_t left, std::uint32_t right) const;
  void insert(std::uint32_t left, std::uint32_t right, std::int32_t id, float score);

  std::array<bool, 256> identity_{};
  // Initial symbol of each identity byte and of "▁": its piece id, or, when the
  // character is not a piece, an id past the vocabulary (it can still merge).
  std::array<std::uint32_t, 256> byte_symbol_{};
  std::uint32_t space_symbol_ = 0;
  std::uint32_t vocab_size_ = 0;
  std::vector<bool> unused_;   // by piece id: UNUSED pieces (resegmented by sentencepiece)
  std::vector<Merge> merges_;  // open addressing, a power of two slots
  std::uint64_t mask_ = 0;
};

}  // namespace dufu::dataprep::tokenizers
