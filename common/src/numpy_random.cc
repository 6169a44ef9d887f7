// MT19937 seeding and state reload as numpy's legacy RandomState does them
// (numpy/random/src/mt19937/mt19937.c); the per-draw tempering lives in the header.
#include "dufu/common/numpy_random.h"

namespace dufu {

namespace {

constexpr int kShift = 397;  // MT19937's M
constexpr std::uint32_t kMatrixA = 0x9908b0dfu;
constexpr std::uint32_t kUpperMask = 0x80000000u;
constexpr std::uint32_t kLowerMask = 0x7fffffffu;

inline std::uint32_t twist(std::uint32_t upper, std::uint32_t lower, std::uint32_t shifted) {
  const std::uint32_t y = (upper & kUpperMask) | (lower & kLowerMask);
  // 0u - (y & 1) is all ones when the low bit is set: a branch-free select of kMatrixA.
  return shifted ^ (y >> 1) ^ ((0u - (y & 1u)) & kMatrixA);
}

}  // namespace

NumpyRandomState::NumpyRandomState(std::uint32_t seed) {
  state_[0] = seed;
  for (int i = 1; i < kStateSize; ++i) {
    const std::uint32_t previous = state_[i - 1];
    state_[i] = 1812433253u * (previous ^ (previous >> 30)) + static_cast<std::uint32_t>(i);
  }
  position_ = kStateSize;
}

void NumpyRandomState::reload() {
  // Three loops instead of one with "% kStateSize" keep the indexing free of divisions.
  int i = 0;
  for (; i < kStateSize - kShift; ++i) state_[i] = twist(state_[i], state_[i + 1], state_[i + kShift]);
  for (; i < kStateSize - 1; ++i) state_[i] = twist(state_[i], state_[i + 1], state_[i + kShift - kStateSize]);
  state_[kStateSize - 1] = twist(state_[kStateSize - 1], state_[0], state_[kShift - 1]);
  position_ = 0;
}

}  // namespace dufu
