// Exact byte-pair encoding of one pre-tokenized piece. The model is a table of pair
// merges: (left id, right id) -> (priority, merged id). Encoding starts from one token
// per byte and repeatedly applies the applicable merge of lowest priority, the
// leftmost one among equals, until none applies: the merge order of tiktoken's
// _byte_pair_merge (where the priority of a pair is the rank of the merged bytes and
// every pair of tokens whose concatenation is a token merges) and of HuggingFace's BPE
// (where the priority is the merge's line in merges.txt). A heap keeps that O(n log n)
// in the piece length, so a megabyte without spaces costs what it should.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "huge_page_allocator.h"

namespace dufu::dataprep {

// Open-addressing map from a 64-bit key (never ~0) to a 64-bit value.
class FlatU64Map {
 public:
  void reserve(std::size_t count);
  // Overwrites an existing key's value.
  void insert(std::uint64_t key, std::uint64_t value);
  // nullptr when absent.
  const std::uint64_t* find(std::uint64_t key) const {
    if (mask_ == 0) return nullptr;
    for (std::size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
      const Entry& entry = entries_[slot];
      if (entry.key == key) return &entry.value;
      if (entry.key == kEmpty) return nullptr;
    }
  }
  std::size_t size() const { return size_; }
  // Starts loading the slot of `key` into the cache.
  void prefetch(std::uint64_t key) const {
    if (mask_ != 0) __builtin_prefetch(&entries_[hash(key) & mask_]);
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  static std::size_t hash(std::uint64_t key) {
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ULL;
    return static_cast<std::size_t>(key ^ (key >> 29));
  }
  void grow();
  // Key and value side by side: one cache line per probe.
  struct Entry {
    std::uint64_t key;
    std::uint64_t value;
  };
  std::vector<Entry, HugePageAllocator<Entry>> entries_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

// 64-bit hash of a short byte string, for piece caches.
std::uint64_t hash_bytes(std::string_view bytes);

// Token bytes -> id over a vocabulary held elsewhere (open addressing on hash_bytes).
// A slot holds the id, the length and the first 8 bytes of its token, so a lookup of a
// token up to 8 bytes long (most) touches one cache line, and a miss rarely two.
class TokenLookup {
 public:
  // `tokens[id]` are the bytes of id; ids with defined[id] false are left out. The
  // vectors must outlive the lookup. The first of two equal byte strings wins; the
  // return value is the first id whose bytes an earlier id has (that id in *earlier),
  // -1 when the byte strings are distinct.
  std::int32_t build(const std::vector<std::string>* tokens, const std::vector<bool>& defined,
                     std::int32_t* earlier = nullptr);
  // The token bytes have moved to `tokens` (the same strings): the slots stay valid.
  void rebind(const std::vector<std::string>* tokens) { tokens_ = tokens; }
  // -1 when `bytes` is no token.
  std::int32_t find(std::string_view bytes) const { return find(bytes, hash_bytes(bytes)); }
  std::int32_t find(std::string_view bytes, std::uint64_t hash) const {
    if (mask_ == 0) return -1;
    const std::uint64_t head = head_of(bytes);
    for (std::size_t slot = hash & mask_;; slot = (slot + 1) & mask_) {
      const Slot& entry = slots_[slot];
      if (entry.id < 0) return -1;
      if (entry.length == bytes.size() && entry.head == head &&
          (bytes.size() <= 8 || (*tokens_)[static_cast<std::size_t>(entry.id)] == bytes)) {
        return entry.id;
      }
    }
  }
  void prefetch(std::uint64_t hash) const {
    if (mask_ != 0) __builtin_prefetch(&slots_[hash & mask_]);
  }

 private:
  struct Slot {
    std::int32_t id = -1;
    std::uint32_t length = 0;
    std::uint64_t head = 0;
  };
  static std::uint64_t head_of(std::string_view bytes) {
    // A fixed-size memcpy is one load; a variable one is a library call.
    std::uint64_t head = 0;
    if (bytes.size() >= 8) {
      std::memcpy(&head, bytes.data(), 8);
    } else {
      for (std::size_t k = 0; k < bytes.size(); ++k) {
        std::memcpy(reinterpret_cast<unsigned char*>(&head) + k, bytes.data() + k, 1);
      }
    }
    return head;
  }
  const std::vector<std::string>* tokens_ = nullptr;
  std::vector<Slot, HugePageAllocator<Slot>> slots_;
  std::size_t mask_ = 0;
};

class BytePairModel {
 public:
  // Each byte must have a token (byte-level vocabularies have all 256).
  void set_byte_token(unsigned char byte, std::int32_t id) { byte_ids_[byte] = id; }
  std::int32_t byte_token(unsigned char byte) const { return byte_ids_[byte]; }
  // A later merge of the same pair replaces an earlier one.
  void add_merge(std::int32_t left, std::int32_t right, std::uint32_t priority, std::int32_t merged) {
    merges_.insert(pair_key(left, right), (std::uint64_t{priority} << 32) | static_cast<std::uint32_t>(merged));
    max_priority_ = std::max(max_priority_, priority);
    const auto larger = static_cast<std::size_t>(std::max(left, right)) + 1;
    if (roles_.size() < larger) roles_.resize(larger, 0);
    roles_[static_cast<std::size_t>(left)] |= kLeft;
    roles_[static_cast<std::size_t>(right)] |= kRight;
  }
  void reserve_merges(std::size_t count) { merges_.reserve(count); }
  // Call once every token id is known: ids up to num_ids - 1 may be looked up.
  // Byte tokens must be set by then.
  void finish(std::size_t num_ids);
  std::size_t num_merges() const { return merges_.size(); }

  // Scratch space of one thread, with its cache of recent pair lookups (the merge
  // table is too large for the CPU caches; the pairs a corpus uses are not).
  struct Scratch {
    static constexpr std::size_t kPairSlots = 1 << 15;
    std::vector<std::int32_t> ids;
    std::vector<std::uint32_t> next;
    std::vector<std::uint32_t> prev;
    std::vector<std::uint64_t> heap;
    // key, then the merge (kNoMerge when none); key ~0 = empty.
    std::vector<std::uint64_t> pair_cache = std::vector<std::uint64_t>(2 * kPairSlots, ~std::uint64_t{0});
  };
  static constexpr std::uint64_t kNoMerge = ~std::uint64_t{0};
  // Appends the ids of `piece` (non-empty) to `out`.
  void encode(std::string_view piece, Scratch& scratch, std::vector<std::int32_t>* out) const;

 private:
  static std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  // Priority in the high 32 bits, merged id in the low; nullptr when no merge. Most
  // pairs of a piece have no merge; the roles (a few hundred kB, cache-resident) rule
  // out many of them before the table (tens of MB) is touched.
  bool may_merge(std::int32_t left, std::int32_t right) const {
    return (roles_[static_cast<std::size_t>(left)] & kLeft) != 0 && (roles_[static_cast<std::size_t>(right)] & kRight) != 0;
  }
  const std::uint64_t* merge(std::int32_t left, std::int32_t right) const {
    return may_merge(left, right) ? merges_.find(pair_key(left, right)) : nullptr;
  }
  // The merge of two byte tokens, or kNoMerge: a dense table of every pair of bytes
  // (512 kB, its hot rows cache-resident), the first look-ups of every piece.
  std::uint64_t byte_pair_merge(unsigned char left, unsigned char right) const {
    return byte_pair_merges_[(std::size_t{left} << 8) | right];
  }
  // Starts loading what cached_merge(left, right) reads, so that the two look-ups
  // after a merge wait for memory together.
  void prefetch_cached_merge(std::int32_t left, std::int32_t right, const Scratch& scratch) const {
    if (!may_merge(left, right)) return;
    const std::uint64_t key = pair_key(left, right);
    __builtin_prefetch(&scratch.pair_cache[2 * pair_cache_slot(key)]);
    merges_.prefetch(key);
  }
  static std::size_t pair_cache_slot(std::uint64_t key) {
    return static_cast<std::size_t>(((key * 0x9E3779B97F4A7C15ULL) >> 49) & (Scratch::kPairSlots - 1));
  }
  // The merge of (left, right), or kNoMerge, through the scratch's pair cache.
  std::uint64_t cached_merge(std::int32_t left, std::int32_t right, Scratch& scratch) const {
    if (!may_merge(left, right)) return kNoMerge;
    const std::uint64_t key = pair_key(left, right);
    std::uint64_t* entry = &scratch.pair_cache[2 * pair_cache_slot(key)];
    if (entry[0] == key) return entry[1];
    const std::uint64_t* found = merges_.find(key);
    entry[0] = key;
    entry[1] = found != nullptr ? *found : kNoMerge;
    return entry[1];
  }
  void encode_short(std::string_view piece, Scratch& scratch, std::vector<std::int32_t>* out) const;
  void encode_long(std::string_view piece, Scratch& scratch, std::vector<std::int32_t>* out) const;

  // encode_short keys a merge by priority << kOffsetBits | offset in 32 bits: models
  // with priorities from kMaxShortPriority up (33 million merges) take encode_long.
  static constexpr unsigned kOffsetBits = 7;
  static constexpr std::uint32_t kMaxShortPriority = (std::uint32_t{1} << (32 - kOffsetBits)) - 1;
  std::uint32_t max_priority_ = 0;
  static constexpr std::uint8_t kLeft = 1;
  static constexpr std::uint8_t kRight = 2;
  std::int32_t byte_ids_[256] = {};
  FlatU64Map merges_;
  // Per token id: whether it is the left (kLeft) or right (kRight) side of some merge.
  // Sized by finish(): every id the model produces is covered.
  std::vector<std::uint8_t> roles_;
  // By (left byte << 8 | right byte), filled by finish().
  std::vector<std::uint64_t> byte_pair_merges_;
};

}  // namespace dufu::dataprep
