// A per-worker cache from a piece of text (a pre-tokenized piece, a whitespace-
// delimited word) to its ids: direct-mapped, of fixed size, so memory is bounded
// whatever the corpus; a colliding piece replaces the one in its slot. Pieces longer
// than MaxPiece bytes or with more than MaxIds ids are not cached; 2^SlotBits slots.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "huge_page_allocator.h"

namespace dufu::dataprep::tokenizers {

template <std::size_t MaxIds, std::size_t SlotBits = 16, std::size_t MaxPiece = 64>
class PieceCache {
 public:
  static constexpr std::size_t kSlots = std::size_t{1} << SlotBits;
  static constexpr std::size_t kMaxPiece = MaxPiece;

  PieceCache() : slots_(kSlots) {}

  void prefetch(std::uint64_t hash) const { __builtin_prefetch(&slots_[hash & (kSlots - 1)]); }
  // The cached ids of `piece` (whose hash_bytes is `hash`), or nullptr.
  const std::int32_t* find(std::string_view piece, std::uint64_t hash, std::size_t* count) const {
    const Slot& slot = slots_[hash & (kSlots - 1)];
    if (slot.hash != hash || slot.key != piece) return nullptr;
    *count = slot.count;
    return slot.ids;
  }
  void insert(std::string_view piece, std::uint64_t hash, const std::int32_t* ids, std::size_t count) {
    if (count > MaxIds || piece.size() > kMaxPiece) return;
    Slot& slot = slots_[hash & (kSlots - 1)];
    slot.hash = hash;
    slot.key.assign(piece);
    slot.count = static_cast<std::uint32_t>(count);
    std::copy(ids, ids + count, slot.ids);
  }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::string key;
    std::uint32_t count = 0;
    std::int32_t ids[MaxIds] = {};
  };
  std::vector<Slot, HugePageAllocator<Slot>> slots_;
};

}  // namespace dufu::dataprep::tokenizers
