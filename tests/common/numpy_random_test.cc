// Tests for NumpyRandomState: raw draws against the standard library's mt19937, the
// shuffle against a plain loop, and everything against numpy itself through
// tests/reference/numpy_rng_reference.py.
#include "dufu/common/numpy_random.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dufu {
namespace {

constexpr std::uint32_t kSeeds[] = {0, 1, 1234, 5489, 0xffffffffu};

// random_interval written the obvious way over std::mt19937, which shares numpy's
// init_genrand seeding and tempering: an independent oracle for the fast path.
std::uint64_t reference_interval(std::mt19937& mt, std::uint64_t max) {
  if (max == 0) return 0;
  std::uint64_t mask = 1;
  while (mask < max) mask = (mask << 1) | 1;
  while (true) {
    std::uint64_t value = mt();
    if (max > 0xffffffffu) value = (value << 32) | mt();
    value &= mask;
    if (value <= max) return value;
  }
}

template <typename T>
void reference_shuffle(std::mt19937& mt, std::vector<T>& values) {
  for (std::size_t i = values.size(); i > 1; --i) {
    std::swap(values[i - 1], values[reference_interval(mt, i - 1)]);
  }
}

template <typename T>
std::vector<T> iota_vector(std::size_t n) {
  std::vector<T> values(n);
  std::iota(values.begin(), values.end(), T{0});
  return values;
}

TEST(NumpyRandom, FormatsExampleSeed1234) {
  NumpyRandomState rng(1234);
  auto first = iota_vector<std::int32_t>(20);
  auto second = iota_vector<std::int32_t>(10);
  rng.shuffle(std::span<std::int32_t>(first));
  rng.shuffle(std::span<std::int32_t>(second));
  EXPECT_EQ(first, (std::vector<std::int32_t>{3, 13, 2, 16, 14, 5, 4, 0, 8, 18, 17, 11, 10, 9, 7, 1, 19, 12, 6, 15}));
  EXPECT_EQ(second, (std::vector<std::int32_t>{8, 1, 7, 6, 9, 5, 4, 3, 0, 2}));
}

TEST(NumpyRandom, NextU32MatchesStdMt19937AcrossReloads) {
  for (const std::uint32_t seed : kSeeds) {
    NumpyRandomState rng(seed);
    std::mt19937 mt(seed);
    // Several reloads of the 624-word state.
    for (int i = 0; i < 5 * 624 + 3; ++i) ASSERT_EQ(rng.next_u32(), mt()) << "seed " << seed << " draw " << i;
  }
}

TEST(NumpyRandom, KnownMt19937Outputs) {
  // Fixed by the C++ standard for mt19937 with its default seed 5489.
  NumpyRandomState rng(5489);
  EXPECT_EQ(rng.next_u32(), 3499211612u);
  for (int i = 1; i < 9999; ++i) rng.next_u32();
  EXPECT_EQ(rng.next_u32(), 4123659995u);
}

TEST(NumpyRandom, NextU64IsFirstDrawHigh) {
  NumpyRandomState rng(7);
  std::mt19937 mt(7);
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t high = mt();
    const std::uint64_t low = mt();
    ASSERT_EQ(rng.next_u64(), (high << 32) | low);
  }
}

TEST(NumpyRandom, RandomIntervalMatchesReference) {
  const std::uint64_t maxima[] = {0, 1, 2, 3, 5, 7, 8, 1000, (1u << 31) - 1, 1u << 31, 0xfffffffeu, 0xffffffffu,
                                  0x100000000u, 0x100000001u, (std::uint64_t{3} << 40) + 7,
                                  std::uint64_t{1} << 63, ~std::uint64_t{0}};
  for (const std::uint32_t seed : kSeeds) {
    NumpyRandomState rng(seed);
    std::mt19937 mt(seed);
    for (int round = 0; round < 50; ++round) {
      for (const std::uint64_t max : maxima) {
        const std::uint64_t value = rng.random_interval(max);
        ASSERT_LE(value, max);
        ASSERT_EQ(value, reference_interval(mt, max)) << "seed " << seed << " max " << max;
      }
    }
    // Same position in the stream afterwards: no extra or missing draws.
    EXPECT_EQ(rng.next_u32(), mt());
  }
}

TEST(NumpyRandom, RandomIntervalZeroDrawsNothing) {
  NumpyRandomState rng(99);
  NumpyRandomState fresh(99);
  EXPECT_EQ(rng.random_interval(0), 0u);
  EXPECT_EQ(rng.next_u32(), fresh.next_u32());
}

TEST(NumpyRandom, ShuffleMatchesPlainLoop) {
  // Sizes around the prefetch distance (64) exercise the look-ahead's start and end.
  const std::size_t sizes[] = {0, 1, 2, 3, 63, 64, 65, 66, 127, 128, 129, 1000, 4099};
  for (const std::uint32_t seed : kSeeds) {
    NumpyRandomState rng(seed);
    std::mt19937 mt(seed);
    for (const std::size_t n : sizes) {
      auto fast = iota_vector<std::uint32_t>(n);
      auto plain = fast;
      rng.shuffle(std::span<std::uint32_t>(fast));
      reference_shuffle(mt, plain);
      ASSERT_EQ(fast, plain) << "seed " << seed << " n " << n;
    }
    EXPECT_EQ(rng.next_u32(), mt());
  }
}

TEST(NumpyRandom, ShuffleIsIndependentOfElementType) {
  // numpy's shuffle draws the same sequence whatever the dtype; Megatron relies on
  // it when the shuffle index switches from uint32 to int64.
  NumpyRandomState narrow_rng(1234);
  NumpyRandomState wide_rng(1234);
  auto narrow = iota_vector<std::uint32_t>(5000);
  auto wide = iota_vector<std::int64_t>(5000);
  narrow_rng.shuffle(std::span<std::uint32_t>(narrow));
  wide_rng.shuffle(std::span<std::int64_t>(wide));
  for (std::size_t i = 0; i < narrow.size(); ++i) ASSERT_EQ(static_cast<std::int64_t>(narrow[i]), wide[i]);
}

TEST(NumpyRandom, ShuffleIsAPermutation) {
  NumpyRandomState rng(3);
  auto values = iota_vector<std::int32_t>(100000);
  rng.shuffle(std::span<std::int32_t>(values));
  std::vector<bool> seen(values.size(), false);
  for (const std::int32_t v : values) {
    ASSERT_GE(v, 0);
    ASSERT_LT(static_cast<std::size_t>(v), values.size());
    ASSERT_FALSE(seen[static_cast<std::size_t>(v)]);
    seen[static_cast<std::size_t>(v)] = true;
  }
}

// Runs `command` and returns its standard output; fails the test on a non-zero exit.
std::string run_and_capture(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << command;
    return {};
  }
  std::string out;
  char buffer[1 << 16];
  std::size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << "command failed: " << command;
  return out;
}

TEST(NumpyRandom, MatchesNumpyReferenceScript) {
  const std::string command = std::string(DUFU_REFERENCE_PYTHON) + " " + DUFU_SOURCE_DIR +
                              "/tests/reference/numpy_rng_reference.py";
  std::istringstream lines(run_and_capture(command));
  std::string line;
  std::optional<NumpyRandomState> rng;
  int seeds = 0, shuffles = 0, raw_lines = 0, intervals = 0;
  std::uint64_t current_seed = 0;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "seed") {
      fields >> current_seed;
      rng.emplace(static_cast<std::uint32_t>(current_seed));
      ++seeds;
      continue;
    }
    ASSERT_TRUE(rng.has_value()) << "draws before the first seed line: " << line.substr(0, 80);
    if (kind == "shuffle") {
      std::size_t n = 0;
      fields >> n;
      auto values = iota_vector<std::int64_t>(n);
      rng->shuffle(std::span<std::int64_t>(values));
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t expected = -1;
        ASSERT_TRUE(fields >> expected) << "short shuffle line, seed " << current_seed << " n " << n;
        ASSERT_EQ(values[i], expected) << "seed " << current_seed << " n " << n << " position " << i;
      }
      ++shuffles;
    } else if (kind == "u32") {
      std::uint64_t expected = 0;
      while (fields >> expected) ASSERT_EQ(rng->next_u32(), expected) << "seed " << current_seed;
      ++raw_lines;
    } else if (kind == "interval") {
      std::uint64_t max = 0, expected = 0;
      fields >> max;
      while (fields >> expected) ASSERT_EQ(rng->random_interval(max), expected) << "seed " << current_seed << " max " << max;
      ++intervals;
    } else {
      FAIL() << "unexpected line from the reference script: " << line.substr(0, 80);
    }
  }
  // Guards against a script that printed nothing or stopped early.
  EXPECT_EQ(seeds, 4);
  EXPECT_EQ(shuffles, 4 * 5);
  EXPECT_EQ(raw_lines, 4);
  EXPECT_EQ(intervals, 4 * 13);
}

}  // namespace
}  // namespace dufu
