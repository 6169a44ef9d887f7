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
#include <functional>
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

// One rank's side of an uneven collective: its input, an output filled with a marker,
// and the expected output.
template <typename T>
struct Case {
  std::vector<std::size_t> counts;
  std::vector<T> input;
  std::vector<T> output;
  std::vector<T> expected;
  // Where this rank's chunk starts in all_gather_v's output.
  std::size_t own_offset = 0;
  // all_gather_v's in-place form: the input copied into output's own chunk, and that chunk.
  std::span<const T> in_place_input() {
    std::copy(input.begin(), input.end(), output.begin() + static_cast<std::ptrdiff_t>(own_offset));
    return std::span<const T>(output.data() + own_offset, input.size());
  }
};

// reduce_scatter_v: the expected output is the serial left fold ((x0 + x1) + x2) ... in T.
template <typename T>
Case<T> make_reduce_scatter_case(const Communicator& c, std::vector<std::size_t> counts, int seed) {
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

// all_gather_v: rank k gives mixed(k, i) for i < counts[k]; the expected output is
// every rank's input one after another.
template <typename T>
Case<T> make_gather_case(const Communicator& c, std::vector<std::size_t> counts, int seed) {
  Case<T> result;
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
  std::vector<std::size_t> zeros{0, 11, 0}, last_only(n, 0), large(n);
  zeros.resize(n, 5);
  last_only[n - 1] = 9;
  for (std::size_t k = 0; k < n; ++k) large[k] = 3000 + 251 * k;
  return {zeros, last_only, large, std::vector<std::size_t>(n, 0)};
}

// The two collectives, described for the checks that hold for both: a rank's case, the
// non-blocking call, its blocking twin, and the bytes the traffic counts as sent.
enum class Uneven { kReduceScatterV, kAllGatherV };

template <Uneven kKind>
struct UnevenCollective {
  static constexpr bool kGather = kKind == Uneven::kAllGatherV;
  static constexpr const char* kName = kGather ? "all_gather_v" : "reduce_scatter_v";
  static constexpr bool kHasInPlaceForm = kGather;
  // The first of the seeds its checks use, so the two see different values.
  static constexpr int kSeedBase = kGather ? 20 : 0;
  template <typename T>
  static Case<T> make_case(const Communicator& c, std::vector<std::size_t> counts, int seed) {
    return kGather ? make_gather_case<T>(c, std::move(counts), seed)
                   : make_reduce_scatter_case<T>(c, std::move(counts), seed);
  }
  template <typename In, typename Out>
  static std::unique_ptr<PendingCollective> start(Communicator& c, In&& input, Out&& output,
                                                   std::span<const std::size_t> counts) {
    if constexpr (kGather) {
      return c.start_all_gather_v(std::forward<In>(input), std::forward<Out>(output), counts);
    } else {
      return c.start_reduce_scatter_v(std::forward<In>(input), std::forward<Out>(output), counts);
    }
  }
  template <typename In, typename Out>
  static void run_blocking(Communicator& c, In&& input, Out&& output, std::span<const std::size_t> counts) {
    if constexpr (kGather) {
      c.all_gather_v(std::forward<In>(input), std::forward<Out>(output), counts);
    } else {
      c.reduce_scatter_v(std::forward<In>(input), std::forward<Out>(output), counts);
    }
  }
  static std::uint64_t counted_bytes(const CommunicationTraffic& traffic) {
    return kGather ? traffic.all_gather_bytes : traffic.reduce_scatter_bytes;
  }
  // all_gather_v: this rank's input to each other rank; reduce_scatter_v: this rank's
  // input less its own chunk.
  template <typename T>
  static std::uint64_t bytes_sent(const Communicator& c, const Case<T>& started) {
    const std::size_t elements = kGather ? static_cast<std::size_t>(c.size() - 1) * started.input.size()
                                         : started.input.size() - started.output.size();
    return elements * sizeof(T);
  }
};
using ReduceScatterV = UnevenCollective<Uneven::kReduceScatterV>;
using AllGatherV = UnevenCollective<Uneven::kAllGatherV>;

// The checks below run for both collectives, reported as MpiNonblockingEach/<collective>.
template <typename Collective>
class MpiNonblockingEach : public ::testing::Test {};
using BothCollectives = ::testing::Types<ReduceScatterV, AllGatherV>;
struct CollectiveName {
  template <typename Collective>
  static std::string GetName(int) {
    return Collective::kName;
  }
};
TYPED_TEST_SUITE(MpiNonblockingEach, BothCollectives, CollectiveName);

// Started and waited (twice, and tested after) against the blocking call on a copy of
// the same case and against the serial reference, for every count pattern, in place too
// where the collective has that form.
template <typename Collective, typename T>
void check_start_wait_equals_blocking(Communicator& c) {
  int seed = Collective::kSeedBase;
  for (const std::vector<std::size_t>& counts : count_patterns(static_cast<std::size_t>(c.size()))) {
    for (bool in_place : {false, true}) {
      if (in_place && !Collective::kHasInPlaceForm) continue;
      Case<T> started = Collective::template make_case<T>(c, counts, ++seed);
      Case<T> blocking = started;
      std::unique_ptr<PendingCollective> pending =
          in_place ? Collective::start(c, started.in_place_input(), started.output, counts)
                   : Collective::start(c, started.input, started.output, counts);
      pending->wait();
      pending->wait();  // idempotent
      EXPECT_TRUE(pending->test());
      if (in_place) {
        Collective::run_blocking(c, blocking.in_place_input(), blocking.output, counts);
      } else {
        Collective::run_blocking(c, blocking.input, blocking.output, counts);
      }
      const std::string what = str_cat("counts ", ::testing::PrintToString(counts), ", ", sizeof(T),
                                       "-byte elements", in_place ? ", in place" : "");
      EXPECT_EQ(mismatches(started.output, blocking.output), 0u) << what;
      EXPECT_EQ(mismatches(started.output, started.expected), 0u) << what;
    }
  }
}

TYPED_TEST(MpiNonblockingEach, StartAndWaitGiveTheBlockingBits) {
  check_start_wait_equals_blocking<TypeParam, float>(world());
  check_start_wait_equals_blocking<TypeParam, double>(world());
}

TYPED_TEST(MpiNonblockingEach, TestTurnsTrueWhenPolled) {
  using Collective = TypeParam;
  Communicator& c = world();
  const std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), 20000);
  Case<double> polled = Collective::template make_case<double>(c, counts, Collective::kSeedBase + 5);
  std::unique_ptr<PendingCollective> pending = Collective::start(c, polled.input, polled.output, counts);
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

// The handle dropped without wait() or test(): its destructor completes the collective,
// and the communicator goes on as usual afterwards.
TYPED_TEST(MpiNonblockingEach, DroppingTheHandleCompletesTheCollective) {
  using Collective = TypeParam;
  Communicator& c = world();
  std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), 30000);
  counts[0] = 0;
  Case<float> dropped = Collective::template make_case<float>(c, counts, Collective::kSeedBase + 6);
  Case<float> after = Collective::template make_case<float>(c, counts, Collective::kSeedBase + 7);
  Collective::start(c, dropped.input, dropped.output, counts).reset();
  EXPECT_EQ(mismatches(dropped.output, dropped.expected), 0u);
  Collective::run_blocking(c, after.input, after.output, counts);
  EXPECT_EQ(mismatches(after.output, after.expected), 0u);
}

// Counted when started, unchanged by the wait, and the same as the blocking call's.
TYPED_TEST(MpiNonblockingEach, CountsTheBlockingCallsTraffic) {
  using Collective = TypeParam;
  Communicator& c = world();
  std::vector<std::size_t> counts{0, 5, 0, 3};
  counts.resize(static_cast<std::size_t>(c.size()), 4);
  Case<double> started = Collective::template make_case<double>(c, counts, Collective::kSeedBase + 8);
  c.reset_traffic();
  std::unique_ptr<PendingCollective> pending = Collective::start(c, started.input, started.output, counts);
  const std::uint64_t sent = Collective::bytes_sent(c, started);
  EXPECT_EQ(Collective::counted_bytes(c.traffic()), sent);
  EXPECT_EQ(c.traffic().operations, 1u);
  pending->wait();
  EXPECT_EQ(Collective::counted_bytes(c.traffic()), sent);
  EXPECT_EQ(c.traffic().operations, 1u);
  const CommunicationTraffic nonblocking = c.traffic();
  c.reset_traffic();
  Collective::run_blocking(c, started.input, started.output, counts);
  EXPECT_EQ(Collective::counted_bytes(c.traffic()), Collective::counted_bytes(nonblocking));
  EXPECT_EQ(c.traffic().operations, nonblocking.operations);
  EXPECT_EQ(c.traffic().total_bytes(), nonblocking.total_bytes());
  c.reset_traffic();
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
    Case<float> first = make_reduce_scatter_case<float>(c, small_counts, 10 * outstanding);
    Case<double> second = make_reduce_scatter_case<double>(c, large_counts, 10 * outstanding + 1);
    Case<float> third = make_reduce_scatter_case<float>(c, large_counts, 10 * outstanding + 2);
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

TEST(MpiNonblocking, AllGathersOutstandingWithAReduceScatterWaitedOutOfOrder) {
  Communicator& c = world();
  const std::size_t n = static_cast<std::size_t>(c.size());
  std::vector<std::size_t> small_counts{0, 4, 2};
  small_counts.resize(n, 6);
  std::vector<std::size_t> large_counts(n, 4096);
  large_counts[n - 1] = 0;
  Case<float> first = make_gather_case<float>(c, large_counts, 40);
  Case<double> second = make_reduce_scatter_case<double>(c, large_counts, 41);
  Case<double> third = make_gather_case<double>(c, small_counts, 42);
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

// One bad call: the non-blocking form, its blocking twin (which must give the same
// message, compared whole) and what the message must say after "<name> on MPI
// communicator 'world'".
struct Refusal {
  std::function<void()> start;
  std::function<void()> blocking;
  std::string problem;
};

template <typename Collective, typename T>
Refusal refusal(Communicator& c, std::span<const T> input, std::span<T> output, std::span<const std::size_t> counts,
                std::string problem) {
  return {[&c, input, output, counts] { Collective::start(c, input, output, counts); },
          [&c, input, output, counts] { Collective::run_blocking(c, input, output, counts); }, std::move(problem)};
}

// Every refusal before anything starts: nothing counted, nothing left outstanding, and
// a good call of two elements a rank works afterwards. A counts list with one entry
// too many is refused first, on the good call's buffers.
template <typename Collective>
void check_refusals_before_starting(Communicator& c, const std::vector<Refusal>& refusals) {
  SCOPED_TRACE(Collective::kName);
  const int n = c.size();
  const std::vector<std::size_t> twos(static_cast<std::size_t>(n), 2);
  const std::string where = str_cat(Collective::kName, " on MPI communicator 'world'");
  Case<float> good = Collective::template make_case<float>(c, twos, Collective::kSeedBase + 9);
  c.reset_traffic();
  const std::vector<std::size_t> too_many(static_cast<std::size_t>(n) + 1, 2);
  std::vector<Refusal> all{refusal<Collective, float>(
      c, good.input, good.output, too_many, str_cat("counts has ", n + 1, " entries but the group has ", n, " ranks"))};
  all.insert(all.end(), refusals.begin(), refusals.end());
  for (const Refusal& bad : all) {
    const std::string message = expect_error(bad.start, {where, bad.problem});
    EXPECT_EQ(message, error_of(bad.blocking));
  }
  EXPECT_EQ(c.traffic().operations, 0u);  // nothing started
  EXPECT_EQ(c.all_reduce_value(1), n);    // and nothing was left outstanding
  Collective::start(c, good.input, good.output, twos)->wait();
  EXPECT_EQ(mismatches(good.output, good.expected), 0u);
  c.reset_traffic();
}

TEST(MpiNonblocking, RefusesWhatReduceScatterVRefusesBeforeStarting) {
  Communicator& c = world();
  const int n = c.size();
  const std::size_t ranks = static_cast<std::size_t>(n);
  std::vector<float> input(2 * ranks), output(2), longer(2 * ranks + 1), shorter(1);
  std::vector<double> doubles(2);
  const std::vector<std::size_t> twos(ranks, 2);
  const ConstCommBuffer float_input{input.data(), input.size(), DataType::kFloat32};
  const CommBuffer double_output{doubles.data(), doubles.size(), DataType::kFloat64};
  check_refusals_before_starting<ReduceScatterV>(
      c,
      {refusal<ReduceScatterV, float>(c, longer, output, twos,
                                      str_cat("input has ", 2 * n + 1, " elements but counts sum to ", 2 * n)),
       refusal<ReduceScatterV, float>(c, input, shorter, twos,
                                      str_cat("output has 1 elements but counts[", c.rank(), "] is 2")),
       {[&] { c.start_reduce_scatter_v_buffer(float_input, double_output, twos); },
        [&] { c.reduce_scatter_v_buffer(float_input, double_output, twos); },
        "input is float32 but output is float64"}});
}

TEST(MpiNonblocking, RefusesWhatAllGatherVRefusesBeforeStarting) {
  Communicator& c = world();
  const int n = c.size();
  const std::size_t ranks = static_cast<std::size_t>(n);
  std::vector<float> input(2), output(2 * ranks), longer(2 * ranks + 1);
  const std::vector<std::size_t> twos(ranks, 2);
  // The input overlapping output other than as this rank's chunk: one element off.
  const std::size_t own_offset = 2 * static_cast<std::size_t>(c.rank());
  const std::size_t shifted = own_offset == 0 ? 1 : own_offset - 1;
  const std::span<const float> misplaced(output.data() + shifted, 2);
  check_refusals_before_starting<AllGatherV>(
      c,
      {refusal<AllGatherV, float>(c, input, longer, twos,
                                  str_cat("output has ", 2 * n + 1, " elements but counts sum to ", 2 * n)),
       refusal<AllGatherV, float>(c, misplaced, output, twos,
                                  "input overlaps output other than as this rank's chunk")});
}

}  // namespace
}  // namespace dufu::testing
