// See sentencepiece_word_bpe.h.
#include "sentencepiece_word_bpe.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <unordered_map>

#include "dufu/common/utf8.h"

namespace dufu::dataprep::tokenizers {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, sentencepiece's escaped space

// True when the normalizer's rules (a darts-clone double-array trie over the UTF-8 of the
// text, as sentencepiece's normalizer.cc reads it) hold a key of two or more bytes that
// starts with `byte` followed by an ASCII byte: such a byte may normalize differently in
// a word of ASCII bytes. (Keys that continue with a non-ASCII byte, as nmt_nfkc's letter +
// combining mark compositions do, cannot match inside such a word.)
bool starts_ascii_rule(std::string_view charsmap, unsigned char byte) {
  if (charsmap.size() < 4) return false;
  std::uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, charsmap.data(), 4);       // little-endian, as sentencepiece writes it
  if (trie_bytes > charsmap.size() - 4) return true;  // unreadable: assume the worst
  std::vector<std::uint32_t> units(trie_bytes / 4);
  std::memcpy(units.data(), charsmap.data() + 4, units.size() * 4);
  const auto offset = [](std::uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); };
  const auto label = [](std::uint32_t unit) { return unit & ((1U << 31) | 0xFF); };
  if (units.empty()) return false;
  const std::size_t node = offset(units[0]) ^ byte;
  if (node >= units.size() || label(units[node]) != byte) return false;  // no key starts with it
  const std::size_t children = node ^ offset(units[node]);
  for (std::size_t next = 1; next < 0x80; ++next) {
    const std::size_t child = children ^ next;
    if (child < units.size() && label(units[child]) == next) return true;
  }
  return false;
}

std::uint64_t mix(std::uint64_t key) {
  key ^= key >> 31;
  key *= 0x9E3779B97F4A7C15ULL;
  return key ^ (key >> 29);
}

}  // namespace

SentencePieceWordBpe::SentencePieceWordBpe(const sentencepiece::SentencePieceProcessor& processor,
                                           std::string_view charsmap, bool identity_normalizer, bool byte_fallback) {
  vocab_size_ = static_cast<std::uint32_t>(processor.GetPieceSize());
  // Pieces sentencepiece's BPE may merge into: all but control, unknown and byte pieces.
  const auto mergeable = [&](int id) {
    return !processor.IsControl(id) && !processor.IsUnknown(id) && !processor.IsByte(id);
  };
  // The mergeable pieces by text: one copy of each piece, looked up here rather than
  // through the processor (which copies a piece per IdToPiece), about 200k times.
  std::vector<std::string> piece_text(vocab_size_);
  std::unordered_map<std::string_view, std::uint32_t> ids_of_pieces;
  unused_.resize(vocab_size_);
  for (std::uint32_t id = 0; id < vocab_size_; ++id) {
    piece_text[id] = processor.IdToPiece(static_cast<int>(id));
    unused_[id] = processor.IsUnused(static_cast<int>(id));
    if (mergeable(static_cast<int>(id))) ids_of_pieces.emplace(piece_text[id], id);
  }
  const auto piece_id = [&](std::string_view piece) -> std::int64_t {
    const auto found = ids_of_pieces.find(piece);
    return found == ids_of_pieces.end() ? std::int64_t{-1} : std::int64_t{found->second};
  };

  // A byte is an identity byte when the model itself encodes it, alone, as "▁" and the
  // byte (so its single-byte rule, if any, maps it to itself), and no longer rule starts
  // with it and another ASCII byte. Separators never reach here; control characters are left to Encode.
  // Without rules every ASCII byte but NUL and the space is one (the normalizer copies each
  // well-formed character; a byte outside the vocabulary is then a byte-fallback piece).
  std::vector<std::string> pieces;
  for (int byte = identity_normalizer ? 0x01 : 0x21; byte < (identity_normalizer ? 0x80 : 0x7F); ++byte) {
    if (identity_normalizer) {
      identity_[byte] = byte != ' ';
      continue;
    }
    const std::string text(1, static_cast<char>(byte));
    pieces.clear();
    if (!processor.Encode(text, &pieces).ok()) continue;
    std::string normalized;
    for (const auto& piece : pieces) normalized += piece;
    identity_[byte] = normalized == std::string(kSpace) + text && !starts_ascii_rule(charsmap, byte);
  }
  const auto initial_symbol = [&](std::string_view character, std::uint32_t pseudo) {
    const auto id = piece_id(character);
    return id >= 0 ? static_cast<std::uint32_t>(id) : vocab_size_ + pseudo;
  };
  for (int byte = 0; byte < 256; ++byte) {
    byte_symbol_[byte] = initial_symbol(std::string(1, static_cast<char>(byte)), static_cast<std::uint32_t>(byte));
  }
  space_symbol_ = initial_symbol(kSpace, 256);

  // What encode_segment needs: the characters of the mergeable pieces.
  byte_piece_.fill(-1);
  byte_fallback_ = identity_normalizer && byte_fallback;
  for (int byte = 0; byte < 256 && byte_fallback_; ++byte) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string name = std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">";
    const int id = processor.PieceToId(name);
    if (!processor.IsByte(id)) byte_fallback_ = false;  // a byte piece is missing: leave such text to Encode
    byte_piece_[byte] = id;
  }
  if (identity_normalizer) {
    for (const auto& [piece, id] : ids_of_pieces) {
      for (std::size_t at = 0; at < piece.size();) {
        const auto sequence = utf8_sequence(piece, at);
        if (!sequence.valid) break;  // not a piece any well-formed text can match
        const auto code = decode_valid_utf8(piece, at).code;
        if (code < 0x80) {
          in_piece_[code] = true;
        } else if (sequence.length == piece.size()) {
          char_symbol_[code] = id;
        }
        at += sequence.length;
      }
    }
    for (const auto& [piece, id] : ids_of_pieces) {
      for (std::size_t at = 0; at < piece.size();) {
        const auto sequence = utf8_sequence(piece, at);
        if (!sequence.valid) break;
        const auto code = decode_valid_utf8(piece, at).code;
        if (code >= 0x80 && code != 0x2581 && !char_symbol_.contains(code)) inner_only_chars_.insert(code);
        at += sequence.length;
      }
    }
  }

  // Every way to build each mergeable piece from two symbols: the halves are pieces, or
  // initial characters that are not (identity bytes and "▁").
  const auto symbol_of = [&](std::string_view half) -> std::int64_t {
    const auto id = piece_id(half);
    if (id >= 0) return id;
    if (half == kSpace) return space_symbol_;
    if (half.size() == 1 && identity_[static_cast<unsigned char>(half[0])]) {
      return byte_symbol_[static_cast<unsigned char>(half[0])];
    }
    return -1;
  };
  std::vector<Merge> pending;
  for (const auto& [piece, id] : ids_of_pieces) {
    for (std::size_t split = 1; split < piece.size(); ++split) {
      const auto left = symbol_of(piece.substr(0, split));
      if (left < 0) continue;
      const auto right = symbol_of(piece.substr(split));
      if (right < 0) continue;
      pending.push_back({static_cast<std::uint64_t>(left) << 32 | static_cast<std::uint64_t>(right),
                         static_cast<std::int32_t>(id), processor.GetScore(static_cast<int>(id))});
    }
  }
  std::size_t slots = 1024;
  while (slots < 2 * pending.size()) slots *= 2;
  merges_.assign(slots, Merge{});
  mask_ = slots - 1;
  for (const auto& merge : pending) {
    insert(static_cast<std::uint32_t>(merge.key >> 32), static_cast<std::uint32_t>(merge.key), merge.id, merge.score);
  }
}

void SentencePieceWordBpe::insert(std::uint32_t left, std::uint32_t right, std::int32_t id, float score) {
  const std::uint64_t key = static_cast<std::uint64_t>(left) << 32 | right;
  for (std::uint64_t slot = mix(key) & mask_;; slot = (slot + 1) & mask_) {
    if (merges_[slot].key == kEmpty || merges_[slot].key == key) {
      merges_[slot] = {key, id, score};
      return;
    }
  }
}

const SentencePieceWordBpe::Merge* SentencePieceWordBpe::find(std::uint32_t left, std::uint32_t right) const {
  const std::uint64_t key = static_cast<std::uint64_t>(left) << 32 | right;
  for (std::uint64_t slot = mix(key) & mask_;; slot = (slot + 1) & mask_) {
    const Merge& merge = merges_[slot];
    if (merge.key == key) return &merge;
    if (merge.key == kEmpty) return nullptr;
  }
}

bool SentencePieceWordBpe::encode(std::string_view word, std::vector<std::int32_t>* ids) const {
  if (word.empty() || word.size() > kMaxWord) return false;
  for (const char c : word) {
    if (!identity_[static_cast<unsigned char>(c)]) return false;
  }
  std::array<std::uint32_t, kMaxWord + 1> symbols;
  symbols[0] = space_symbol_;
  for (std::size_t i = 0; i < word.size(); ++i) symbols[i + 1] = byte_symbol_[static_cast<unsigned char>(word[i])];
  return merge_and_emit(word, symbols.data(), word.size() + 1, ids);
}

bool SentencePieceWordBpe::encode_segment(std::string_view segment, std::vector<std::int32_t>* ids) const {
  if (segment.empty() || segment.size() > kMaxWord) return false;
  std::array<std::uint32_t, kMaxWord> symbols;
  std::size_t count = 0;
  for (std::size_t at = 0; at < segment.size();) {
    const auto byte = static_cast<unsigned char>(segment[at]);
    const auto unknown = kUnknownChar | static_cast<std::uint32_t>(at);
    if (byte < 0x80) {
      if (byte == ' ') {
        symbols[count++] = space_symbol_;
      } else if (!identity_[byte]) {
        return false;
      } else if (byte_symbol_[byte] < vocab_size_ || in_piece_[byte]) {
        symbols[count++] = byte_symbol_[byte];
      } else if (byte_fallback_) {
        symbols[count++] = unknown;
      } else {
        return false;
      }
      ++at;
      continue;
    }
    const auto sequence = utf8_sequence(segment, at);
    if (!sequence.valid) return false;
    const char32_t code = decode_valid_utf8(segment, at).code;
    if (code == 0x2581) {
      symbols[count++] = space_symbol_;
    } else if (const auto found = char_symbol_.find(code); found != char_symbol_.end()) {
      symbols[count++] = found->second;
    } else if (byte_fallback_ && !inner_only_chars_.contains(code)) {
      symbols[count++] = unknown;
    } else {
      return false;
    }
    at += sequence.length;
  }
  return merge_and_emit(segment, symbols.data(), count, ids);
}

bool SentencePieceWordBpe::merge_and_emit(std::string_view text, std::uint32_t* symbols, std::size_t count,
                                          std::vector<std::int32_t>* ids) const {
  // pairs[i]: the merge of symbols[i] with symbols[i + 1] (nullptr: none).
  std::array<const Merge*, kMaxWord + 1> pairs;
  for (std::size_t i = 0; i + 1 < count; ++i) pairs[i] = find(symbols[i], symbols[i + 1]);
  for (;;) {
    std::size_t best = count;
    for (std::size_t i = 0; i + 1 < count; ++i) {
      // Strictly greater: among equal scores the leftmost pair wins, as in sentencepiece.
      if (pairs[i] != nullptr && (best == count || pairs[i]->score > pairs[best]->score)) best = i;
    }
    if (best == count) break;
    symbols[best] = static_cast<std::uint32_t>(pairs[best]->id);
    for (std::size_t i = best + 1; i + 1 < count; ++i) symbols[i] = symbols[i + 1];
    for (std::size_t i = best + 1; i + 2 < count; ++i) pairs[i] = pairs[i + 1];
    --count;
    if (best > 0) pairs[best - 1] = find(symbols[best - 1], symbols[best]);
    if (best + 1 < count) pairs[best] = find(symbols[best], symbols[best + 1]);
  }
  ids->clear();
  for (std::size_t i = 0; i < count; ++i) {
    if ((symbols[i] & kUnknownChar) != 0) {
      const std::size_t at = symbols[i] & ~kUnknownChar;
      const std::size_t length = utf8_sequence(text, at).length;
      for (std::size_t k = 0; k < length; ++k) ids->push_back(byte_piece_[static_cast<unsigned char>(text[at + k])]);
      continue;
    }
    if (symbols[i] >= vocab_size_ || unused_[symbols[i]]) return false;
    ids->push_back(static_cast<std::int32_t>(symbols[i]));
  }
  return true;
}

}  // namespace dufu::dataprep::tokenizers
