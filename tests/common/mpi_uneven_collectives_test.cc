// The uneven collectives under mpirun (part of mpi_communicator_test): reduce_scatter_v
// against the serial left fold bit for bit, all_gather_v against every rank's closed-form
// input, both on any group (mpi_uneven_collectives.h) and, on the world, their traffic
// counts and refusals.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "common/mpi_uneven_collectives.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "support/expect_error.h"
#include "support/mpi_world.h"
#include "support/uneven_counts.h"

namespace dufu::testing {
namespace {

Communicator& world() { return mpi_world(); }

// Rank `rank`'s element i for the uneven checks: magnitudes from 0.01 to 100, so that
// adding in another order than the left fold shows in the last bits.
template <typename T>
T varied(int rank, std::size_t i) {
  return static_cast<T>(std::sin(0.5 + rank * 3.1 + static_cast<double>(i) * 0.73) *
                        std::pow(10.0, static_cast<double>(i % 5) - 2.0));
}

// reduce_scatter_v against the serial left fold ((x0 + x1) + x2) ... in T, bit for bit;
// returns this rank's output.
template <typename T>
std::vector<T> check_reduce_scatter_v_counts(Communicator& c, const std::vector<std::size_t>& counts) {
  const std::size_t own = counts[static_cast<std::size_t>(c.rank())];
  const std::size_t begin = std::accumulate(counts.begin(), counts.begin() + c.rank(), std::size_t{0});
  std::vector<T> input(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = varied<T>(c.rank(), i);
  std::vector<T> output(own, T(-1));
  c.reduce_scatter_v(input, output, counts);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < own; ++i) {
    T expected = varied<T>(0, begin + i);
    for (int k = 1; k < c.size(); ++k) expected += varied<T>(k, begin + i);
    if (std::memcmp(&expected, &output[i], sizeof(T)) != 0) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u) << "counts " << ::testing::PrintToString(counts) << ", " << sizeof(T) << "-byte elements";
  return output;
}

// Whether a and b hold the same elements, bit for bit.
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The patterns every uneven check runs (support/uneven_counts.h).
std::vector<std::vector<std::size_t>> uneven_count_patterns(std::size_t n) {
  return dufu::testing::uneven_count_patterns(n, 1000);
}

template <typename T>
void check_reduce_scatter_v_typed(Communicator& c) {
  const std::size_t n = static_cast<std::size_t>(c.size());
  for (const std::vector<std::size_t>& counts : uneven_count_patterns(n)) check_reduce_scatter_v_counts<T>(c, counts);
  // Equal counts: bitwise what reduce_scatter gives for the same input.
  const std::vector<T> uneven = check_reduce_scatter_v_counts<T>(c, std::vector<std::size_t>(n, 129));
  std::vector<T> input(129 * n);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = varied<T>(c.rank(), i);
  std::vector<T> equal(129);
  c.reduce_scatter(input, equal);
  EXPECT_EQ(std::memcmp(uneven.data(), equal.data(), equal.size() * sizeof(T)), 0);
}

// Rank `rank`'s input element i for the all_gather_v checks; floating-point values
// must arrive bit for bit as well.
template <typename T>
T gathered_value(int rank, std::size_t i) {
  if constexpr (std::is_floating_point_v<T>) return varied<T>(rank, i);
  return static_cast<T>(rank * 100000 + static_cast<int>(i) + 1);
}

// all_gather_v, from a separate input and in place, against every rank's input; returns
// the output.
template <typename T>
std::vector<T> check_all_gather_v_counts(Communicator& c, const std::vector<std::size_t>& counts) {
  const std::size_t own = counts[static_cast<std::size_t>(c.rank())];
  const std::size_t begin = std::accumulate(counts.begin(), counts.begin() + c.rank(), std::size_t{0});
  std::vector<T> input(own);
  for (std::size_t i = 0; i < own; ++i) input[i] = gathered_value<T>(c.rank(), i);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<T> expected;
  for (int k = 0; k < c.size(); ++k) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(k)]; ++i) expected.push_back(gathered_value<T>(k, i));
  }
  std::vector<T> output(total, T(-1));
  c.all_gather_v(input, output, counts);
  EXPECT_TRUE(same_bits(output, expected))
      << "counts " << ::testing::PrintToString(counts) << ", " << sizeof(T) << "-byte elements";
  std::vector<T> in_place(total, T(-1));
  std::copy(input.begin(), input.end(), in_place.begin() + static_cast<std::ptrdiff_t>(begin));
  c.all_gather_v(std::span<const T>(in_place.data() + begin, own), in_place, counts);
  EXPECT_TRUE(same_bits(in_place, expected))
      << "in place, counts " << ::testing::PrintToString(counts) << ", " << sizeof(T) << "-byte elements";
  return output;
}

template <typename T>
void check_all_gather_v_typed(Communicator& c) {
  const std::size_t n = static_cast<std::size_t>(c.size());
  for (const std::vector<std::size_t>& counts : uneven_count_patterns(n)) check_all_gather_v_counts<T>(c, counts);
  // Equal counts: what all_gather gives for the same input.
  const std::vector<T> uneven = check_all_gather_v_counts<T>(c, std::vector<std::size_t>(n, 129));
  std::vector<T> input(129);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = gathered_value<T>(c.rank(), i);
  std::vector<T> equal(129 * n);
  c.all_gather(input, equal);
  EXPECT_TRUE(same_bits(uneven, equal));
}

}  // namespace

void check_reduce_scatter_v(Communicator& c) {
  check_reduce_scatter_v_typed<float>(c);
  check_reduce_scatter_v_typed<double>(c);
}

void check_all_gather_v(Communicator& c) {
  check_all_gather_v_typed<float>(c);
  check_all_gather_v_typed<double>(c);
  check_all_gather_v_typed<std::int32_t>(c);
  check_all_gather_v_typed<std::int64_t>(c);
}

namespace {

TEST(Mpi, ReduceScatterVCountsWhatThisRankSends) {
  const int n = world().size();
  const int r = world().rank();
  std::vector<std::size_t> counts{0, 5, 0, 3};
  counts.resize(static_cast<std::size_t>(n), 4);
  if (n == 1) counts[0] = 6;  // {0} would move nothing and count nothing
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<double> input(total, 1.0);
  std::vector<double> output(counts[static_cast<std::size_t>(r)]);
  world().reset_traffic();
  world().reduce_scatter_v(input, output, counts);
  EXPECT_EQ(world().traffic().reduce_scatter_bytes, (total - output.size()) * sizeof(double));
  EXPECT_EQ(world().traffic().operations, 1u);
  EXPECT_EQ(world().traffic().total_bytes(), world().traffic().reduce_scatter_bytes);
  // Equal chunks: the same count as reduce_scatter's.
  std::vector<float> equal_input(static_cast<std::size_t>(3 * n), 1.0f);
  std::vector<float> equal_output(3);
  world().reset_traffic();
  world().reduce_scatter(equal_input, equal_output);
  const std::uint64_t reduce_scatter_bytes = world().traffic().reduce_scatter_bytes;
  world().reset_traffic();
  world().reduce_scatter_v(equal_input, equal_output, std::vector<std::size_t>(static_cast<std::size_t>(n), 3));
  EXPECT_EQ(world().traffic().reduce_scatter_bytes, reduce_scatter_bytes);
  world().reset_traffic();
}

TEST(Mpi, ReduceScatterVRefusesBadArgumentsOnEveryRank) {
  const int n = world().size();
  const int r = world().rank();
  const std::size_t ranks = static_cast<std::size_t>(n);
  std::vector<float> input(2 * ranks), output(2);
  const std::vector<std::size_t> twos(ranks, 2);
  const std::string where = "reduce_scatter_v on MPI communicator 'world'";
  expect_error([&] { world().reduce_scatter_v(input, output, std::vector<std::size_t>(ranks + 1, 2)); },
               {where, str_cat("counts has ", n + 1, " entries but the group has ", n, " ranks")});
  std::vector<float> longer(2 * ranks + 1);
  expect_error([&] { world().reduce_scatter_v(longer, output, twos); },
               {where, str_cat("input has ", 2 * n + 1, " elements but counts sum to ", 2 * n)});
  std::vector<float> shorter(1);
  expect_error([&] { world().reduce_scatter_v(input, shorter, twos); },
               {where, str_cat("output has 1 elements but counts[", r, "] is 2")});
  std::vector<double> doubles(2);
  expect_error([&] {
    world().reduce_scatter_v_buffer(ConstCommBuffer{input.data(), input.size(), DataType::kFloat32},
                                    CommBuffer{doubles.data(), doubles.size(), DataType::kFloat64}, twos);
  }, {where, "input is float32 but output is float64"});
  EXPECT_EQ(world().all_reduce_value(1), n);  // nothing was left waiting
}

TEST(Mpi, AllGatherVCountsWhatThisRankSends) {
  const int n = world().size();
  const int r = world().rank();
  std::vector<std::size_t> counts{0, 5, 0, 3};
  counts.resize(static_cast<std::size_t>(n), 4);
  if (n == 1) counts[0] = 6;  // {0} would move nothing and count nothing
  const std::size_t own = counts[static_cast<std::size_t>(r)];
  std::vector<double> input(own, 1.0);
  std::vector<double> output(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  world().reset_traffic();
  world().all_gather_v(input, output, counts);
  // This rank's input, to each of the others.
  EXPECT_EQ(world().traffic().all_gather_bytes, static_cast<std::uint64_t>(n - 1) * own * sizeof(double));
  EXPECT_EQ(world().traffic().operations, 1u);
  EXPECT_EQ(world().traffic().total_bytes(), world().traffic().all_gather_bytes);
  // Equal chunks: the same count as all_gather's.
  std::vector<float> equal_input(3, 1.0f);
  std::vector<float> equal_output(static_cast<std::size_t>(3 * n));
  world().reset_traffic();
  world().all_gather(equal_input, equal_output);
  const std::uint64_t all_gather_bytes = world().traffic().all_gather_bytes;
  world().reset_traffic();
  world().all_gather_v(equal_input, equal_output, std::vector<std::size_t>(static_cast<std::size_t>(n), 3));
  EXPECT_EQ(world().traffic().all_gather_bytes, all_gather_bytes);
  world().reset_traffic();
}

TEST(Mpi, AllGatherVRefusesBadArgumentsOnEveryRank) {
  const int n = world().size();
  const int r = world().rank();
  const std::size_t ranks = static_cast<std::size_t>(n);
  std::vector<float> input(2), output(2 * ranks);
  const std::vector<std::size_t> twos(ranks, 2);
  const std::string where = "all_gather_v on MPI communicator 'world'";
  expect_error([&] { world().all_gather_v(input, output, std::vector<std::size_t>(ranks + 1, 2)); },
               {where, str_cat("counts has ", n + 1, " entries but the group has ", n, " ranks")});
  std::vector<float> longer(2 * ranks + 1);
  expect_error([&] { world().all_gather_v(input, longer, twos); },
               {where, str_cat("output has ", 2 * n + 1, " elements but counts sum to ", 2 * n)});
  std::vector<float> shorter(1);
  expect_error([&] { world().all_gather_v(shorter, output, twos); },
               {where, str_cat("input has 1 elements but counts[", r, "] is 2")});
  // Another rank's chunk (the next one's, or the previous one's on the last rank).
  const std::size_t other = static_cast<std::size_t>(r + 1 < n ? r + 1 : r - 1);
  if (n > 1) {
    expect_error([&] { world().all_gather_v(std::span<const float>(output.data() + 2 * other, 2), output, twos); },
                 {where, "input overlaps output other than as this rank's chunk"});
  }
  std::vector<double> doubles(2 * ranks);
  expect_error([&] {
    world().all_gather_v_buffer(ConstCommBuffer{input.data(), input.size(), DataType::kFloat32},
                                CommBuffer{doubles.data(), doubles.size(), DataType::kFloat64}, twos);
  }, {where, "input is float32 but output is float64"});
  EXPECT_EQ(world().all_reduce_value(1), n);  // nothing was left waiting
}

}  // namespace
}  // namespace dufu::testing
