// numpy's legacy RandomState (MT19937) reproduced bit for bit, so that every shuffle
// dufu makes equals the one Megatron-LM makes with numpy.random.RandomState(seed):
// same seed, same document, sample and shuffle indices.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace dufu {

class NumpyRandomState {
 public:
  // numpy.random.RandomState(seed) for an integer seed in [0, 2^32): init_genrand.
  explicit NumpyRandomState(std::uint32_t seed);

  // Defined here so the shuffle loop inlines the draw; only the state reload, once
  // every 624 draws, is a call.
  std::uint32_t next_u32() {
    if (position_ == kStateSize) reload();
    std::uint32_t y = state_[position_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }

  // numpy's legacy 64-bit draw: (first << 32) | second.
  std::uint64_t next_u64() {
    const std::uint64_t high = next_u32();
    return (high << 32) | next_u32();
  }

  // numpy's random_interval(max): uniform in [0, max] by masked rejection sampling,
  // 32-bit draws while max <= 0xffffffff, 64-bit draws above. max == 0 draws nothing.
  std::uint64_t random_interval(std::uint64_t max) {
    if (max == 0) return 0;
    std::uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    std::uint64_t value;
    if (max <= 0xffffffffu) {
      do value = next_u32() & mask; while (value > max);
    } else {
      do value = next_u64() & mask; while (value > max);
    }
    return value;
  }

  // RandomState.shuffle of a 1-D array: for i = n-1 down to 1, swap(x[i], x[random_interval(i)]).
  template <typename T>
  void shuffle(std::span<T> values) {
    const std::size_t n = values.size();
    if (n < 2) return;
    // On arrays much larger than the caches every swap partner is a cache miss. The
    // partners depend only on the random stream, not on the data, so they are drawn
    // kAhead steps early and prefetched; the draws stay in numpy's order.
    constexpr std::size_t kAhead = 64;
    std::size_t partners[kAhead];
    const std::size_t steps = n - 1;  // step s swaps position n-1-s
    std::size_t drawn = 0;
    const auto draw = [&] {
      const auto j = static_cast<std::size_t>(random_interval(n - 1 - drawn));
      __builtin_prefetch(&values[j], 1);
      partners[drawn % kAhead] = j;
      ++drawn;
    };
    while (drawn < std::min(steps, kAhead)) draw();
    for (std::size_t s = 0; s < steps; ++s) {
      const std::size_t j = partners[s % kAhead];
      if (drawn < steps) draw();  // refills the slot just read
      std::swap(values[n - 1 - s], values[j]);
    }
  }

 private:
  static constexpr int kStateSize = 624;

  void reload();

  std::uint32_t state_[kStateSize];
  int position_ = kStateSize;
};

}  // namespace dufu
