// numpy's legacy RandomState (MT19937) reproduced bit for bit, so that every shuffle
// dufu makes equals the one Megatron-LM makes with numpy.random.RandomState(seed):
// same seed, same document, sample and shuffle indices.
#pragma once

#include <cstdint>
#include <span>

namespace dufu {

class NumpyRandomState {
 public:
  // numpy.random.RandomState(seed) for an integer seed in [0, 2^32): init_genrand.
  explicit NumpyRandomState(std::uint32_t seed);

  std::uint32_t next_u32();
  // numpy's legacy 64-bit draw: (first << 32) | second.
  std::uint64_t next_u64();
  // numpy's random_interval(max): uniform in [0, max] by masked rejection sampling,
  // 32-bit draws while max <= 0xffffffff, 64-bit draws above.
  std::uint64_t random_interval(std::uint64_t max);

  // RandomState.shuffle of a 1-D array: for i = n-1 down to 1, swap(x[i], x[random_interval(i)]).
  template <typename T>
  void shuffle(std::span<T> values) {
    for (std::size_t i = values.size(); i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(random_interval(i - 1));
      std::swap(values[i - 1], values[j]);
    }
  }

 private:
  void reload();
  std::uint32_t state_[624];
  int position_ = 624;
};

}  // namespace dufu
