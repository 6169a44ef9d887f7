// The merge loop of byte-level BPE: a linear scan for short pieces (what tiktoken
// does, fastest when a piece is a few bytes), a heap of candidate merges for long ones.
// Both apply the lowest-priority merge first and the leftmost among equals, so they
// give the same tokens.
#include "byte_pair_encoder.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

namespace dufu::dataprep {

void FlatU64Map::reserve(std::size_t count) {
  std::size_t capacity = 16;
  while (capacity * 2 < count * 3) capacity *= 2;  // load factor at most 2/3
  if (capacity <= entries_.size()) return;
  auto old = std::move(entries_);
  entries_.assign(capacity, Entry{kEmpty, 0});
  mask_ = capacity - 1;
  size_ = 0;
  for (const Entry& entry : old) {
    if (entry.key != kEmpty) insert(entry.key, entry.value);
  }
}

void FlatU64Map::grow() { reserve(std::max<std::size_t>(16, size_ * 2)); }

void FlatU64Map::insert(std::uint64_t key, std::uint64_t value) {
  if ((size_ + 1) * 3 > entries_.size() * 2) grow();
  for (std::size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
    Entry& entry = entries_[slot];
    if (entry.key == key) {
      entry.value = value;
      return;
    }
    if (entry.key == kEmpty) {
      entry = Entry{key, value};
      ++size_;
      return;
    }
  }
}

std::uint64_t hash_bytes(std::string_view bytes) {
  constexpr std::uint64_t kMultiplier = 0x9E3779B97F4A7C15ULL;
  std::uint64_t hash = bytes.size() * kMultiplier;
  const char* data = bytes.data();
  std::size_t left = bytes.size();
  const auto mix = [&](std::uint64_t word) {
    hash = (hash ^ word) * kMultiplier;
    hash ^= hash >> 32;
  };
  while (left >= 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, data, 8);
    mix(word);
    data += 8;
    left -= 8;
  }
  if (left > 0) {
    // Byte by byte: a memcpy of a variable length is a library call, which costs as
    // much as the rest of the hash on short pieces.
    std::uint64_t word = 0;
    for (std::size_t k = 0; k < left; ++k) word |= std::uint64_t{static_cast<unsigned char>(data[k])} << (8 * k);
    mix(word);
  }
  hash *= kMultiplier;
  return hash ^ (hash >> 29);
}

std::int32_t TokenLookup::build(const std::vector<std::string>* tokens, const std::vector<bool>& defined,
                                std::int32_t* earlier) {
  tokens_ = tokens;
  std::size_t capacity = 16;
  while (capacity < tokens->size() * 2) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  const std::size_t count = std::min(tokens->size(), defined.size());
  // Every insert is a cache miss in a table of megabytes: the hashes first, and the
  // slot of the token kPrefetchAhead further on loaded while this one is placed.
  std::vector<std::uint64_t> hashes(count);
  for (std::size_t id = 0; id < count; ++id) {
    if (defined[id]) hashes[id] = hash_bytes((*tokens)[id]);
  }
  constexpr std::size_t kPrefetchAhead = 8;
  std::int32_t first_duplicate = -1;
  for (std::size_t id = 0; id < count; ++id) {
    if (id + kPrefetchAhead < count) prefetch(hashes[id + kPrefetchAhead]);
    if (!defined[id]) continue;
    const std::string_view bytes = (*tokens)[id];
    const std::uint64_t head = head_of(bytes);
    for (std::size_t slot = hashes[id] & mask_;; slot = (slot + 1) & mask_) {
      Slot& entry = slots_[slot];
      if (entry.id < 0) {
        entry = Slot{static_cast<std::int32_t>(id), static_cast<std::uint32_t>(bytes.size()), head};
        break;
      }
      if (entry.length == bytes.size() && entry.head == head &&
          (bytes.size() <= 8 || (*tokens)[static_cast<std::size_t>(entry.id)] == bytes)) {
        // The first of equal byte strings wins.
        if (first_duplicate < 0) {
          first_duplicate = static_cast<std::int32_t>(id);
          if (earlier != nullptr) *earlier = entry.id;
        }
        break;
      }
    }
  }
  return first_duplicate;
}

namespace {
constexpr std::size_t kShortPiece = 96;
}  // namespace

// target_clones picks its copy in an ifunc resolver that the dynamic loader runs while
// relocating the program, before a sanitizer's runtime is up; an instrumented resolver
// crashes there (ThreadSanitizer's does). Sanitized builds therefore compile the
// baseline copy only, which also gives that copy its test runs: the machines here pick
// the AVX2 one otherwise.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DUFU_SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define DUFU_SANITIZED_BUILD 1
#endif
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(DUFU_SANITIZED_BUILD)
#define DUFU_WITH_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#else
#define DUFU_WITH_AVX2_CLONE
#endif

void BytePairModel::finish(std::size_t num_ids) {
  if (roles_.size() < num_ids) roles_.resize(num_ids, 0);
  byte_pair_merges_.assign(256 * 256, kNoMerge);
  for (std::size_t left = 0; left < 256; ++left) {
    for (std::size_t right = 0; right < 256; ++right) {
      const std::uint64_t* found = merge(byte_ids_[left], byte_ids_[right]);
      if (found != nullptr) byte_pair_merges_[(left << 8) | right] = *found;
    }
  }
}

void BytePairModel::encode(std::string_view piece, Scratch& scratch, std::vector<std::int32_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
  } else if (piece.size() <= kShortPiece && max_priority_ < kMaxShortPriority) {
    encode_short(piece, scratch, out);
  } else {
    encode_long(piece, scratch, out);
  }
}

// The search for the lowest key is most of the loop's arithmetic; baseline x86-64 has
// no unsigned 32-bit vector min (five instructions emulate it), AVX2 has one.
DUFU_WITH_AVX2_CLONE
void BytePairModel::encode_short(std::string_view piece, Scratch& scratch, std::vector<std::int32_t>* out) const {
  // Tokens stay at the byte offset where they start, linked by next/prev; ids[i] is
  // the token at i, merged[i] the merge of it with the next one and keys[i] that
  // merge's priority << kOffsetBits | i, or kNoKey | i when there is none (for a token
  // merged away and for the last: kNoKey | its offset or more). Nothing moves when two
  // tokens merge (three memmoves per merge cost ~15% of a cold encode on non-English
  // text), and the lowest key, one vectorizable pass over 32-bit words, is the merge
  // to apply: the lowest priority, and among equals the leftmost (lowest offset).
  std::int32_t ids[kShortPiece];
  std::uint32_t keys[kShortPiece];
  std::int32_t merged[kShortPiece];
  std::uint8_t next[kShortPiece];
  std::uint8_t prev[kShortPiece];
  static_assert(kShortPiece < 255, "offsets in bytes");
  static_assert(kShortPiece <= (1U << kOffsetBits), "offsets in the low bits of a key");
  const std::size_t n = piece.size();
  const std::size_t pairs = n - 1;
  constexpr std::uint32_t kNoKey = ~std::uint32_t{0} << kOffsetBits;
  // kNoMerge's priority is all ones, so its key is kNoKey | i without a branch.
  const auto set_pair = [&](std::size_t i, std::uint64_t found) {
    keys[i] = (static_cast<std::uint32_t>(found >> 32) << kOffsetBits) | static_cast<std::uint32_t>(i);
    merged[i] = static_cast<std::int32_t>(found & 0xFFFFFFFFU);
  };
  const auto* bytes = reinterpret_cast<const unsigned char*>(piece.data());
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = byte_ids_[bytes[i]];
    next[i] = static_cast<std::uint8_t>(i + 1);
    prev[i] = static_cast<std::uint8_t>(i - 1);  // 255 for the first: never read
  }
  for (std::size_t i = 0; i < pairs; ++i) set_pair(i, byte_pair_merge(bytes[i], bytes[i + 1]));
  keys[pairs] = kNoKey | static_cast<std::uint32_t>(pairs);
  std::size_t tokens = n;
  while (tokens > 1) {
    std::uint32_t lowest = kNoKey;
    for (std::size_t i = 0; i < pairs; ++i) lowest = std::min(lowest, keys[i]);
    if (lowest >= kNoKey) break;
    const std::size_t best = lowest & ((1U << kOffsetBits) - 1);
    const std::size_t right = next[best];
    const std::size_t after = next[right];
    ids[best] = merged[best];
    keys[right] = kNoKey | static_cast<std::uint32_t>(right);
    next[best] = static_cast<std::uint8_t>(after);
    if (after < n) prev[after] = static_cast<std::uint8_t>(best);
    --tokens;
    const std::size_t before = prev[best];
    if (after < n) prefetch_cached_merge(ids[best], ids[after], scratch);
    if (best > 0) prefetch_cached_merge(ids[before], ids[best], scratch);
    if (after < n) {
      set_pair(best, cached_merge(ids[best], ids[after], scratch));
    } else {
      keys[best] = kNoKey | static_cast<std::uint32_t>(best);
    }
    if (best > 0) set_pair(before, cached_merge(ids[before], ids[best], scratch));
  }
  for (std::size_t i = 0; i < n; i = next[i]) out->push_back(ids[i]);
}

void BytePairModel::encode_long(std::string_view piece, Scratch& scratch, std::vector<std::int32_t>* out) const {
  // Tokens live at the byte offset where they start; next/prev link the live ones.
  const auto n = static_cast<std::uint32_t>(piece.size());
  auto& ids = scratch.ids;
  auto& next = scratch.next;
  auto& prev = scratch.prev;
  auto& heap = scratch.heap;
  ids.resize(n);
  next.resize(n);
  prev.resize(n);
  heap.clear();
  for (std::uint32_t i = 0; i < n; ++i) {
    ids[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1;
    prev[i] = i == 0 ? n : i - 1;
  }
  // Heap entries: priority << 32 | left offset, smallest first, so among equal
  // priorities the leftmost merge comes first. A stale entry (its tokens changed) is
  // recognized on popping by looking the pair up again.
  const auto push_found = [&](std::uint32_t left, std::uint64_t found) {
    if (found == kNoMerge) return;
    heap.push_back((found & 0xFFFFFFFF00000000ULL) | left);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  const auto push = [&](std::uint32_t left) {
    if (left >= n || next[left] >= n) return;
    push_found(left, cached_merge(ids[left], ids[next[left]], scratch));
  };
  const auto* bytes = reinterpret_cast<const unsigned char*>(piece.data());
  for (std::uint32_t i = 0; i + 1 < n; ++i) push_found(i, byte_pair_merge(bytes[i], bytes[i + 1]));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const std::uint64_t entry = heap.back();
    heap.pop_back();
    const auto left = static_cast<std::uint32_t>(entry & 0xFFFFFFFFU);
    // A token that was merged into its left neighbour has prev == n + 1.
    if (prev[left] == n + 1) continue;
    const std::uint32_t right = next[left];
    if (right >= n) continue;
    const std::uint64_t found = cached_merge(ids[left], ids[right], scratch);
    if (found == kNoMerge || (found >> 32) != (entry >> 32)) continue;
    ids[left] = static_cast<std::int32_t>(found & 0xFFFFFFFFU);
    next[left] = next[right];
    if (next[right] < n) prev[next[right]] = left;
    prev[right] = n + 1;
    if (prev[left] < n) push(prev[left]);
    push(left);
  }
  for (std::uint32_t i = 0; i < n; i = next[i]) out->push_back(ids[i]);
}

}  // namespace dufu::dataprep
