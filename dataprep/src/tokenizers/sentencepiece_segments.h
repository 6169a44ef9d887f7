// Where a text may be cut so that sentencepiece's BPE encodes the parts independently,
// for models without normalization rules (normalization_rule_name=identity,
// remove_extra_whitespaces=false: Llama 2's and Mistral's settings), read from the
// vocabulary itself rather than from the trainer's options.
//
// Why a cut is exact: sentencepiece's BPE (bpe_model.cc) runs over the whole normalized
// text (spm_train's SplitIntoWords is used in training only), but it merges two
// adjacent symbols only when their concatenation is a piece, so every symbol it ever
// makes is a piece. If no piece contains characters a then b next to each other, no
// symbol spans a point between a and b; the merges on either side never meet, and
// the order in which sentencepiece takes them (highest score, then leftmost) is, on each
// side, the order that side alone would take. So the ids of the text are the ids of its
// parts, each encoded alone. Without normalization rules the normalizer maps each
// character to itself (a space to "▁", an ill-formed byte to U+FFFD) one at a time, so
// the parts can be cut in the raw text: the normalized form of a part is the part of
// the normalized form. The dummy prefix "▁" belongs to the first part.
//
// Classes: each ASCII byte is its own (the space standing for "▁"), every other
// character one class together (a "▁" of a piece counts as both the space and that
// class, as the text may write it either way). A point between two characters whose
// classes never meet inside a piece is a cut. For models trained as Llama's were that
// cuts before each space that follows a non-space (pieces hold "▁" only as a prefix or
// in runs of "▁" alone), between digits (split_digits), and where scripts change
// (letters against punctuation, tabs and newlines), so parts are a few bytes long and
// repeat: the per-worker cache of sentencepiece_tokenizer.cc holds them.
//
// A cut falls only between characters as the normalizer reads them: before an ASCII
// byte, or before a byte that cannot continue a UTF-8 sequence (0x80-0xBF can).
//
// One thing crosses cuts after BPE: without byte fallback, sentencepiece's Encode joins
// a run of characters outside the vocabulary into one <unk> (PopulateSentencePieceText),
// so then no cut falls between two classes that may hold such characters (an ASCII
// byte that is not a piece, any non-ASCII character).
#pragma once

#include <sentencepiece_processor.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "dufu/common/utf8.h"

namespace dufu::dataprep::tokenizers {

class SentencePieceCuts {
 public:
  static constexpr int kNonAscii = 128;
  static constexpr int kClasses = 129;

  // The mergeable pieces (normal and unused; the caller refuses user-defined ones) of
  // `processor`; `unknown_runs_join`: the model has no byte fallback.
  SentencePieceCuts(const sentencepiece::SentencePieceProcessor& processor, bool unknown_runs_join) {
    static constexpr std::string_view kSpace = "\xE2\x96\x81";
    std::array<std::array<bool, kClasses>, kClasses> meet{};
    const auto classes = [&](std::string_view piece, std::size_t at, std::size_t length, int* out) {
      const auto byte = static_cast<unsigned char>(piece[at]);
      if (byte < 0x80) {
        out[0] = byte;
        return 1;
      }
      if (piece.substr(at, length) == kSpace) {
        out[0] = ' ';
        out[1] = kNonAscii;
        return 2;
      }
      out[0] = kNonAscii;
      return 1;
    };
    for (int id = 0; id < processor.GetPieceSize(); ++id) {
      if (processor.IsControl(id) || processor.IsUnknown(id) || processor.IsByte(id)) continue;
      const std::string piece = processor.IdToPiece(id);
      int previous[2] = {0, 0};
      int previous_count = 0;
      for (std::size_t at = 0; at < piece.size();) {
        // An ill-formed piece no normalized text holds; its bytes still count.
        const std::size_t length = utf8_sequence(piece, at).length;
        int current[2] = {0, 0};
        const int current_count = classes(piece, at, length, current);
        for (int p = 0; p < previous_count; ++p) {
          for (int c = 0; c < current_count; ++c) meet[previous[p]][current[c]] = true;
        }
        std::copy(current, current + 2, previous);
        previous_count = current_count;
        at += length;
      }
    }
    for (int byte = 0; byte < 256; ++byte) class_of_[byte] = static_cast<std::uint8_t>(byte < 0x80 ? byte : kNonAscii);
    std::array<bool, kClasses> may_be_unknown{};
    for (int byte = 0; byte < 0x80 && unknown_runs_join; ++byte) {
      const std::string character = byte == ' ' ? std::string(kSpace) : std::string(1, static_cast<char>(byte));
      may_be_unknown[byte] = processor.IsUnknown(processor.PieceToId(character));
    }
    may_be_unknown[kNonAscii] = unknown_runs_join;
    for (int left = 0; left < kClasses; ++left) {
      for (int right = 0; right < kClasses; ++right) {
        cut_[left * kClasses + right] = !meet[left][right] && !(may_be_unknown[left] && may_be_unknown[right]);
      }
    }
  }

  // True when the text may be cut between the bytes `previous` and `next`.
  bool cut_between(unsigned char previous, unsigned char next) const {
    if (next >= 0x80 && next < 0xC0) return false;
    return cut_[class_of_[previous] * kClasses + class_of_[next]];
  }

 private:
  std::array<std::uint8_t, 256> class_of_{};
  std::array<bool, kClasses * kClasses> cut_{};
};

}  // namespace dufu::dataprep::tokenizers
