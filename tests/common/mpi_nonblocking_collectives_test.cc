// start_reduce_scatter_v and start_all_gather_v on the MPI backend under mpirun: the
// same bits as the blocking reduce_scatter_v and all_gather_v and as the serial left
// fold and concatenation written out here, with several collectives outstanding and
// waited for out of order, completed by test(), by wait() and by dropping the handle,
// the same traffic counted, and bad arguments refused before anything starts.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "support/expect_error.h"
#include "support/mpi_world.h"

namespace dufu::testing {
namespace {

Communicator& world() { return mpi_world(); }

// The bits of a float or a double, to compare sums exactly (NaN and -0 included).
template <typename T>
auto bits_of(T value) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(value);
  } else {
    return std::bit_cast<std::uint64_t>(value);
  }
}

// Rank `rank`'s input element i (seed tells collectives apart): small values, and in
// every other group of three elements +1e8 on one of ranks 0-2 and -1e8 on the next, so
// the sum is a large cancellation whose low bits depend on the order of the additions.
template <typename T>
T mixed(int rank, std::size_t i, int seed) {
  const double phase = 0.3 + seed * 1.7 + rank * 2.9 + static_cast<double>(i) * 0.61;
  double value = std::sin(phase) * std::pow(10.0, static_cast<double>(i % 4) - 3.0);
  const double big = (i / 3) % 2 == 0 ? 1e8 : 0.0;
  if (static_cast<std::size_t>(rank) == i % 3) value += big;
  if (static_cast<std::size_t>(rank) == (i + 1) % 3) value -= big;
  return static_cast<T>(value);
}

std::size_t sum_of(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// One rank's side of a reduce_scatter_v: its input, an output filled with a marker,
// and the expected output, the serial left fold ((x0 + x1) + x2) ... in T.
template <typename T>
struct Case {
  std::vector<std::size_t> counts;
  std::vector<T> input;
  std::vector<T> output;
  std::vector<T> expected;
};

template <typename T>
Case<T> make_case(const Communicator& c, std::vector<std::size_t> counts, int seed) {
  Case<T> result;
  const std::size_t own = counts[static_cast<std::size_t>(c.rank())];
  const std::size_t begin = std::accumulate(counts.begin(), counts.begin() + c.rank(), std::size_t{0});
  result.input.resize(sum_of(counts));
  for (std::size_t i = 0; i < result.input.size(); ++i) result.input[i] = mixed<T>(c.rank(), i, seed);
  result.output.assign(own, T(-7));
  for (std::size_t i = 0; i < own; ++i) {
    T sum = mixed<T>(0, begin + i, seed);
    for (int k = 1; k < c.size(); ++k) sum += mixed<T>(k, begin + i, seed);
    result.expected.push_back(sum);
  }
  result.counts = std::move(counts);
  return result;
}

// How many elements of `actual` differ from `expected` in any bit.
template <typename T>
std::size_t mismatches(const std::vector<T>& actual, const std::vector<T>& expected) {
  if (actual.size() != expected.size()) return std::max(actual.size(), expected.size());
  std::size_t different = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) different += bits_of(actual[i]) != bits_of(expected[i]) ? 1 : 0;
  return different;
}

// Uneven counts for n ranks: a zero for some rank (rank 0 keeps nothing, rank 2 too on
// three ranks), one rank with everything, a few thousand elements each, and all zero.
std::vector<std::vector<std::size_t>> count_patterns(std::size_t n) {
  std::vector<std::vector<std::size_t>> patterns;
  std::vector<std::size_t> zeros{0, 11, 0};
  zeros.resize(n, 5);
  patterns.push_back(zeros);
  std::vector<std::size_t> last_only(n, 0);
  last_only[n - 1] = 9;
  patterns.push_back(last_only);
  std::vector<std::size_t> large(n);
  for (std::size_t k = 0; k < n; ++k) large[k] = 3000 + 251 * k;
  patterns.push_back(large);
  patterns.push_back(std::vector<std::size_t>(n, 0));
  return patterns;
}

template <typename T>
void check_start_wait_equals_blocking(Communicator& c) {
  int seed = 0;
  for (const std::vector<std::size_t>& counts : count_patterns(static_cast<std::size_t>(c.size()))) {
    Case<T> started = make_case<T>(c, counts, ++seed);
    std::unique_ptr<PendingCollective> pending = c.start_reduce_scatter_v(started.input, started.output, counts);
    pending->wait();
    pending->wait();  // idempotent
    EXPECT_TRUE(pending->test());
    std::vector<T> blocking(started.output.size(), T(-7));
    c.reduce_scatter_v(started.input, blocking, counts);
    EXPECT_EQ(mismatches(started.output, blocking), 0u)
        << "counts " << ::testing::PrintToString(counts) << ", " << sizeof(T) << "-byte elements";
    EXPECT_EQ(mismatches(started.output, started.expected), 0u)
        << "counts " << ::testing::PrintToString(counts) << ", " << sizeof(T) << "-byte elements";
  }
}

TEST(MpiNonblocking, StartAndWaitGiveTheBlockingBits) {
  check_start_wait_equals_blocking<float>(world());
  check_start_wait_equals_blocking<double>(world());
}

TEST(MpiNonblocking, TheMixedValuesMakeTheOrderShow) {
  // The values' claim: over three ranks or more (two have one sum order), summing from
  // the last rank down gives other bits somewhere, so the bit checks above would see a
  // fold in another order.
  const int ranks = std::max(world().size(), 3);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < 3000; ++i) {
    float forward = mixed<float>(0, i, 1);
    for (int k = 1; k < ranks; ++k) forward += mixed<float>(k, i, 1);
    float backward = mixed<float>(ranks - 1, i, 1);
    for (int k = ranks - 2; k >= 0; --k) backward += mixed<float>(k, i, 1);
    differ += bits_of(forward) != bits_of(backward) ? 1 : 0;
  }
  EXPECT_GT(differ, 0u);
}

TEST(MpiNonblocking, SeveralOutstandingWaitedInReverse) {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  for (int outstanding : {2, 3}) {
    std::vector<std::size_t> small_counts{0, 4, 2};
    small_counts.resize(n, 6);
    std::vector<std::size_t> large_counts(n, 4096);
    large_counts[0] = 1;
    Case<float> first = make_case<float>(c, small_counts, 10 * outstanding);
    Case<double> second = make_case<double>(c, large_counts, 10 * outstanding + 1);
    Case<float> third = make_case<float>(c, large_counts, 10 * outstanding + 2);
    std::vector<std::unique_ptr<PendingCollective>> pending;
    pending.push_back(c.start_reduce_scatter_v(first.input, first.output, first.counts));
    pending.push_back(c.start_reduce_scatter_v(second.input, second.output, second.counts));
    // A blocking collective while the others run, in the same order on every rank.
    EXPECT_EQ(c.all_reduce_value(1), c.size());
    if (outstanding == 3) pending.push_back(c.start_reduce_scatter_v(third.input, third.output, third.counts));
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) (*it)->wait();
    EXPECT_EQ(mismatches(first.output, first.expected), 0u) << outstanding << " outstanding";
    EXPECT_EQ(mismatches(second.output, second.expected), 0u) << outstanding << " outstanding";
    if (outstanding == 3) {
      EXPECT_EQ(mismatches(third.output, third.expected), 0u) << outstanding << " outstanding";
    }
  }
}

TEST(MpiNonblocking, TestTurnsTrueWhenPolled) {
  Communicator& c = world();
  Case<double> polled = make_case<double>(c, std::vector<std::size_t>(static_cast<std::size_t>(c.size()), 20000), 5);
  std::unique_ptr<PendingCollective> pending = c.start_reduce_scatter_v(polled.input, polled.output, polled.counts);
  // Generous: the exchange takes milliseconds; a hang would fail here, not time out.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool complete = false;
  std::size_t polls = 0;
  while (!complete && std::chrono::steady_clock::now() < deadline) {
    complete = pending->test();
    ++polls;
    if (!complete) std::this_thread::yield();
  }
  ASSERT_TRUE(complete) << "after " << polls << " polls";
  EXPECT_EQ(mismatches(polled.output, polled.expected), 0u);
  EXPECT_TRUE(pending->test());
  pending->wait();  // returns at once after test() gave true
  EXPECT_EQ(mismatches(polled.output, polled.expected), 0u);
}

TEST(MpiNonblocking, DroppingTheHandleCompletesTheCollective) {
  Communicator& c = world();
  std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), 30000);
  counts[0] = 0;
  Case<float> dropped = make_case<float>(c, counts, 6);
  Case<float> after = make_case<float>(c, counts, 7);
  c.start_reduce_scatter_v(dropped.input, dropped.output, counts).reset();
  EXPECT_EQ(mismatches(dropped.output, dropped.expected), 0u);
  // The communicator goes on as usual afterwards.
  c.reduce_scatter_v(after.input, after.output, counts);
  EXPECT_EQ(mismatches(after.output, after.expected), 0u);
}

TEST(MpiNonblocking, CountsTheBlockingCallsTraffic) {
  Communicator& c = world();
  std::vector<std::size_t> counts{0, 5, 0, 3};
  counts.resize(static_cast<std::size_t>(c.size()), 4);
  Case<double> started = make_case<double>(c, counts, 8);
  c.reset_traffic();
  std::unique_ptr<PendingCollective> pending = c.start_reduce_scatter_v(started.input, started.output, counts);
  // Counted when started: this rank's input less its own chunk.
  const std::uint64_t sent = (started.input.size() - started.output.size()) * sizeof(double);
  EXPECT_EQ(c.traffic().reduce_scatter_bytes, sent);
  EXPECT_EQ(c.traffic().operations, 1u);
  pending->wait();
  EXPECT_EQ(c.traffic().reduce_scatter_bytes, sent);
  EXPECT_EQ(c.traffic().operations, 1u);
  const CommunicationTraffic nonblocking = c.traffic();
  c.reset_traffic();
  c.reduce_scatter_v(started.input, started.output, counts);
  EXPECT_EQ(c.traffic().reduce_scatter_bytes, nonblocking.reduce_scatter_bytes);
  EXPECT_EQ(c.traffic().operations, nonblocking.operations);
  EXPECT_EQ(c.traffic().total_bytes(), nonblocking.total_bytes());
  c.reset_traffic();
}

TEST(MpiNonblocking, RefusesWhatReduceScatterVRefusesBeforeStarting) {
  Communicator& c = world();
  const int n = c.size();
  const int r = c.rank();
  const std::size_t ranks = static_cast<std::size_t>(n);
  std::vector<float> input(2 * ranks), output(2);
  const std::vector<std::size_t> twos(ranks, 2);
  const std::string where = "reduce_scatter_v on MPI communicator 'world'";
  c.reset_traffic();
  // The same messages as the blocking call's, compared whole.
  const std::vector<std::size_t> too_many(ranks + 1, 2);
  const std::string counts_message = expect_error(
      [&] { c.start_reduce_scatter_v(input, output, too_many); },
      {where, str_cat("counts has ", n + 1, " entries but the group has ", n, " ranks")});
  EXPECT_EQ(counts_message, error_of([&] { c.reduce_scatter_v(input, output, too_many); }));
  std::vector<float> longer(2 * ranks + 1);
  const std::string input_message =
      expect_error([&] { c.start_reduce_scatter_v(longer, output, twos); },
                   {where, str_cat("input has ", 2 * n + 1, " elements but counts sum to ", 2 * n)});
  EXPECT_EQ(input_message, error_of([&] { c.reduce_scatter_v(longer, output, twos); }));
  std::vector<float> shorter(1);
  const std::string output_message =
      expect_error([&] { c.start_reduce_scatter_v(input, shorter, twos); },
                   {where, str_cat("output has 1 elements but counts[", r, "] is 2")});
  EXPECT_EQ(output_message, error_of([&] { c.reduce_scatter_v(input, shorter, twos); }));
  std::vector<double> doubles(2);
  expect_error([&] {
    c.start_reduce_scatter_v_buffer(ConstCommBuffer{input.data(), input.size(), DataType::kFloat32},
                                    CommBuffer{doubles.data(), doubles.size(), DataType::kFloat64}, twos);
  }, {where, "input is float32 but output is float64"});
  EXPECT_EQ(c.traffic().operations, 0u);  // nothing started
  EXPECT_EQ(c.all_reduce_value(1), n);    // and nothing was left outstanding
  // A good call after the refusals works.
  Case<float> good = make_case<float>(c, twos, 9);
  c.start_reduce_scatter_v(good.input, good.output, twos)->wait();
  EXPECT_EQ(mismatches(good.output, good.expected), 0u);
  c.reset_traffic();
}

// One rank's side of an all_gather_v: rank k gives mixed(k, i) for i < counts[k]; its
// input, an output filled with a marker, and the expected output, every rank's input
// one after another.
template <typename T>
struct GatherCase {
  std::vector<std::size_t> counts;
  std::vector<T> input;
  std::vector<T> output;
  std::vector<T> expected;
  std::size_t own_offset = 0;
  // For the in-place call: the input copied into output's own chunk, and that chunk.
  std::span<const T> in_place_input() {
    std::copy(input.begin(), input.end(), output.begin() + static_cast<std::ptrdiff_t>(own_offset));
    return std::span<const T>(output.data() + own_offset, input.size());
  }
};

template <typename T>
GatherCase<T> make_gather_case(const Communicator& c, std::vector<std::size_t> counts, int seed) {
  GatherCase<T> result;
  for (int k = 0; k < c.size(); ++k) {
    if (k == c.rank()) result.own_offset = result.expected.size();
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(k)]; ++i) {
      result.expected.push_back(mixed<T>(k, i, seed));
    }
  }
  for (std::size_t i = 0; i < counts[static_cast<std::size_t>(c.rank())]; ++i) {
    result.input.push_back(mixed<T>(c.rank(), i, seed));
  }
  result.output.assign(sum_of(counts), T(-7));
  result.counts = std::move(counts);
  return result;
}

template <typename T>
void check_all_gather_start_wait_equals_blocking(Communicator& c) {
  int seed = 20;
  for (const std::vector<std::size_t>& counts : count_patterns(static_cast<std::size_t>(c.size()))) {
    for (bool in_place : {false, true}) {
      GatherCase<T> started = make_gather_case<T>(c, counts, ++seed);
      GatherCase<T> blocking = started;
      std::unique_ptr<PendingCollective> pending =
          in_place ? c.start_all_gather_v(started.in_place_input(), started.output, counts)
                   : c.start_all_gather_v(started.input, started.output, counts);
      pending->wait();
      pending->wait();  // idempotent
      EXPECT_TRUE(pending->test());
      if (in_place) {
        c.all_gather_v(blocking.in_place_input(), blocking.output, counts);
      } else {
        c.all_gather_v(blocking.input, blocking.output, counts);
      }
      const std::string what = str_cat("counts ", ::testing::PrintToString(counts), ", ", sizeof(T),
                                       "-byte elements", in_place ? ", in place" : "");
      EXPECT_EQ(mismatches(started.output, blocking.output), 0u) << what;
      EXPECT_EQ(mismatches(started.output, started.expected), 0u) << what;
    }
  }
}

TEST(MpiNonblocking, AllGatherStartAndWaitGiveTheBlockingBits) {
  check_all_gather_start_wait_equals_blocking<float>(world());
  check_all_gather_start_wait_equals_blocking<double>(world());
}

TEST(MpiNonblocking, AllGathersOutstandingWithAReduceScatterWaitedOutOfOrder) {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<std::size_t> small_counts{0, 4, 2};
  small_counts.resize(n, 6);
  std::vector<std::size_t> large_counts(n, 4096);
  large_counts[n - 1] = 0;
  GatherCase<float> first = make_gather_case<float>(c, large_counts, 40);
  Case<double> second = make_case<double>(c, large_counts, 41);
  GatherCase<double> third = make_gather_case<double>(c, small_counts, 42);
  std::vector<std::unique_ptr<PendingCollective>> pending;
  pending.push_back(c.start_all_gather_v(first.input, first.output, first.counts));
  pending.push_back(c.start_reduce_scatter_v(second.input, second.output, second.counts));
  pending.push_back(c.start_all_gather_v(third.in_place_input(), third.output, third.counts));
  // Waited middle, last, first.
  for (int index : {1, 2, 0}) pending[static_cast<std::size_t>(index)]->wait();
  EXPECT_EQ(mismatches(first.output, first.expected), 0u);
  EXPECT_EQ(mismatches(second.output, second.expected), 0u);
  EXPECT_EQ(mismatches(third.output, third.expected), 0u);
}

TEST(MpiNonblocking, AllGatherTestTurnsTrueWhenPolled) {
  Communicator& c = world();
  GatherCase<double> polled =
      make_gather_case<double>(c, std::vector<std::size_t>(static_cast<std::size_t>(c.size()), 20000), 43);
  std::unique_ptr<PendingCollective> pending = c.start_all_gather_v(polled.input, polled.output, polled.counts);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool complete = false;
  std::size_t polls = 0;
  while (!complete && std::chrono::steady_clock::now() < deadline) {
    complete = pending->test();
    ++polls;
    if (!complete) std::this_thread::yield();
  }
  ASSERT_TRUE(complete) << "after " << polls << " polls";
  EXPECT_EQ(mismatches(polled.output, polled.expected), 0u);
  EXPECT_TRUE(pending->test());
  pending->wait();
}

TEST(MpiNonblocking, DroppingAnAllGatherHandleCompletesIt) {
  Communicator& c = world();
  std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), 30000);
  counts[0] = 0;
  GatherCase<float> dropped = make_gather_case<float>(c, counts, 44);
  GatherCase<float> after = make_gather_case<float>(c, counts, 45);
  c.start_all_gather_v(dropped.input, dropped.output, counts).reset();
  EXPECT_EQ(mismatches(dropped.output, dropped.expected), 0u);
  c.all_gather_v(after.input, after.output, counts);
  EXPECT_EQ(mismatches(after.output, after.expected), 0u);
}

TEST(MpiNonblocking, AllGatherCountsTheBlockingCallsTraffic) {
  Communicator& c = world();
  std::vector<std::size_t> counts{0, 5, 0, 3};
  counts.resize(static_cast<std::size_t>(c.size()), 4);
  GatherCase<double> started = make_gather_case<double>(c, counts, 46);
  c.reset_traffic();
  std::unique_ptr<PendingCollective> pending = c.start_all_gather_v(started.input, started.output, counts);
  // Counted when started: this rank's input to each other rank.
  const std::uint64_t sent = static_cast<std::uint64_t>(c.size() - 1) * started.input.size() * sizeof(double);
  EXPECT_EQ(c.traffic().all_gather_bytes, sent);
  EXPECT_EQ(c.traffic().operations, 1u);
  pending->wait();
  EXPECT_EQ(c.traffic().operations, 1u);
  const CommunicationTraffic nonblocking = c.traffic();
  c.reset_traffic();
  c.all_gather_v(started.input, started.output, counts);
  EXPECT_EQ(c.traffic().all_gather_bytes, nonblocking.all_gather_bytes);
  EXPECT_EQ(c.traffic().operations, nonblocking.operations);
  EXPECT_EQ(c.traffic().total_bytes(), nonblocking.total_bytes());
  c.reset_traffic();
}

TEST(MpiNonblocking, RefusesWhatAllGatherVRefusesBeforeStarting) {
  Communicator& c = world();
  const int n = c.size();
  const std::size_t ranks = static_cast<std::size_t>(n);
  std::vector<float> input(2), output(2 * ranks);
  const std::vector<std::size_t> twos(ranks, 2);
  const std::string where = "all_gather_v on MPI communicator 'world'";
  c.reset_traffic();
  const std::vector<std::size_t> too_many(ranks + 1, 2);
  const std::string counts_message = expect_error(
      [&] { c.start_all_gather_v(input, output, too_many); },
      {where, str_cat("counts has ", n + 1, " entries but the group has ", n, " ranks")});
  EXPECT_EQ(counts_message, error_of([&] { c.all_gather_v(input, output, too_many); }));
  std::vector<float> longer(2 * ranks + 1);
  const std::string output_message =
      expect_error([&] { c.start_all_gather_v(input, longer, twos); },
                   {where, str_cat("output has ", 2 * n + 1, " elements but counts sum to ", 2 * n)});
  EXPECT_EQ(output_message, error_of([&] { c.all_gather_v(input, longer, twos); }));
  // The input overlapping output other than as this rank's chunk: one element off.
  const std::size_t own_offset = 2 * static_cast<std::size_t>(c.rank());
  const std::size_t shifted = own_offset == 0 ? 1 : own_offset - 1;
  const std::span<const float> misplaced(output.data() + shifted, 2);
  const std::string overlap_message =
      expect_error([&] { c.start_all_gather_v(misplaced, output, twos); },
                   {where, "input overlaps output other than as this rank's chunk"});
  EXPECT_EQ(overlap_message, error_of([&] { c.all_gather_v(misplaced, output, twos); }));
  EXPECT_EQ(c.traffic().operations, 0u);  // nothing started
  EXPECT_EQ(c.all_reduce_value(1), n);    // and nothing was left outstanding
  GatherCase<float> good = make_gather_case<float>(c, twos, 47);
  c.start_all_gather_v(good.input, good.output, twos)->wait();
  EXPECT_EQ(mismatches(good.output, good.expected), 0u);
  c.reset_traffic();
}

}  // namespace
}  // namespace dufu::testing
