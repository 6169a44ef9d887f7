// Tests for the single-process Communicator, the argument checks every backend
// shares, the shared element-wise reduction, the launcher environment parsing and the
// backend choice of make_communicator. The MPI backend has its own program,
// mpi_communicator_test.cc, run under mpirun.
#include "dufu/common/communicator.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dufu/common/launch_environment.h"
#include "support/expect_error.h"

namespace dufu {
namespace {

using dufu::testing::expect_error;

TEST(SingleProcessCommunicator, CollectivesAreIdentities) {
  auto comm = make_single_process_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "world");
  EXPECT_EQ(comm->describe(), "single-process communicator 'world'");

  std::vector<float> data{1.5f, -2.0f, 3.25f};
  comm->all_reduce(data);
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  comm->all_reduce(data, ReduceOp::kMax);
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(comm->all_reduce_value(7.5), 7.5);
  EXPECT_EQ(comm->all_reduce_value<std::int64_t>(-3, ReduceOp::kMax), -3);

  std::array<std::int64_t, 2> input{4, 5};
  std::vector<std::int64_t> gathered(2);
  comm->all_gather(input, gathered);
  EXPECT_EQ(gathered, (std::vector<std::int64_t>{4, 5}));
  comm->all_gather(std::span<const std::int64_t>(gathered), gathered);  // in place
  EXPECT_EQ(gathered, (std::vector<std::int64_t>{4, 5}));

  std::vector<double> scattered(3);
  comm->reduce_scatter(std::vector<double>{1, 2, 3}, scattered);
  EXPECT_EQ(scattered, (std::vector<double>{1, 2, 3}));

  std::vector<std::int32_t> broadcast{9, 8};
  comm->broadcast(broadcast, 0);
  EXPECT_EQ(broadcast, (std::vector<std::int32_t>{9, 8}));

  std::vector<std::uint8_t> received(2);
  comm->send_recv(std::vector<std::uint8_t>{1, 2}, 0, received, 0);
  EXPECT_EQ(received, (std::vector<std::uint8_t>{1, 2}));
  comm->barrier();
}

TEST(SingleProcessCommunicator, EmptyBuffersAreFine) {
  auto comm = make_single_process_communicator();
  std::vector<float> empty;
  comm->all_reduce(empty);
  comm->all_gather(empty, empty);
  comm->reduce_scatter(empty, empty);
  comm->reduce_scatter_v(empty, empty, std::vector<std::size_t>{0});
  comm->broadcast(empty, 0);
}

TEST(SingleProcessCommunicator, ReduceScatterVKeepsTheWholeInput) {
  auto comm = make_single_process_communicator();
  const std::vector<double> input{1.5, -2.25, 1e300};
  std::vector<double> output(3);
  comm->reduce_scatter_v(input, output, std::vector<std::size_t>{3});
  EXPECT_EQ(output, input);
  std::vector<float> in_place{4.0f, 5.0f};
  comm->reduce_scatter_v(std::span<const float>(in_place), in_place, std::vector<std::size_t>{2});
  EXPECT_EQ(in_place, (std::vector<float>{4.0f, 5.0f}));
  // One rank sends nothing: the operation is counted, no bytes.
  EXPECT_EQ(comm->traffic().reduce_scatter_bytes, 0u);
  EXPECT_EQ(comm->traffic().operations, 2u);
}

TEST(SingleProcessCommunicator, AllGatherVCopiesTheInput) {
  auto comm = make_single_process_communicator();
  const std::vector<std::int64_t> input{7, -3, std::int64_t{1} << 60};
  std::vector<std::int64_t> output(3, -1);
  comm->all_gather_v(input, output, std::vector<std::size_t>{3});
  EXPECT_EQ(output, input);
  std::vector<float> in_place{4.0f, 5.0f};
  comm->all_gather_v(std::span<const float>(in_place), in_place, std::vector<std::size_t>{2});
  EXPECT_EQ(in_place, (std::vector<float>{4.0f, 5.0f}));
  std::vector<float> empty;
  comm->all_gather_v(empty, empty, std::vector<std::size_t>{0});
  // One rank sends nothing: the operations are counted, no bytes; the empty one not at all.
  EXPECT_EQ(comm->traffic().all_gather_bytes, 0u);
  EXPECT_EQ(comm->traffic().operations, 2u);
}

TEST(SingleProcessCommunicator, AllGatherVRefusesBadArguments) {
  auto comm = make_single_process_communicator();
  std::vector<float> three(3), two(2), four(4);
  const std::string where = "all_gather_v on single-process communicator 'world'";
  expect_error([&] { comm->all_gather_v(three, three, std::vector<std::size_t>{3, 0}); },
               {where, "counts has 2 entries but the group has 1 ranks"});
  expect_error([&] { comm->all_gather_v(three, three, std::vector<std::size_t>{}); }, {"counts has 0 entries"});
  expect_error([&] { comm->all_gather_v(two, three, std::vector<std::size_t>{2}); },
               {where, "output has 3 elements but counts sum to 2"});
  expect_error([&] { comm->all_gather_v(three, two, std::vector<std::size_t>{2}); },
               {where, "input has 3 elements but counts[0] is 2"});
  expect_error([&] { comm->all_gather_v(std::span<const float>(four.data() + 1, 3), std::span<float>(four.data(), 3),
                                        std::vector<std::size_t>{3}); },
               {where, "input overlaps output other than as this rank's chunk"});
  std::vector<double> doubles(3);
  expect_error([&] {
    comm->all_gather_v_buffer(ConstCommBuffer{three.data(), 3, DataType::kFloat32},
                              CommBuffer{doubles.data(), 3, DataType::kFloat64}, std::vector<std::size_t>{3});
  }, {where, "input is float32 but output is float64"});
  EXPECT_EQ(comm->traffic().operations, 0u);
}

TEST(SingleProcessCommunicator, ReduceScatterVRefusesBadArguments) {
  auto comm = make_single_process_communicator();
  std::vector<float> three(3), two(2);
  const std::string where = "reduce_scatter_v on single-process communicator 'world'";
  expect_error([&] { comm->reduce_scatter_v(three, three, std::vector<std::size_t>{3, 0}); },
               {where, "counts has 2 entries but the group has 1 ranks"});
  expect_error([&] { comm->reduce_scatter_v(three, three, std::vector<std::size_t>{}); }, {"counts has 0 entries"});
  expect_error([&] { comm->reduce_scatter_v(three, two, std::vector<std::size_t>{2}); },
               {where, "input has 3 elements but counts sum to 2"});
  expect_error([&] { comm->reduce_scatter_v(two, three, std::vector<std::size_t>{2}); },
               {where, "output has 3 elements but counts[0] is 2"});
  std::vector<double> doubles(3);
  expect_error([&] {
    comm->reduce_scatter_v_buffer(ConstCommBuffer{three.data(), 3, DataType::kFloat32},
                                  CommBuffer{doubles.data(), 3, DataType::kFloat64}, std::vector<std::size_t>{3});
  }, {where, "input is float32 but output is float64"});
  EXPECT_EQ(comm->traffic().operations, 0u);
}

// Rank 2 of a group of 4 that records what reaches the uneven collectives' hooks, for
// the checks and the traffic counts of the shared entry points at a size above one.
class UnevenCollectiveRecorder final : public Communicator {
 public:
  UnevenCollectiveRecorder() : Communicator("recorder") {}
  int rank() const override { return 2; }
  int size() const override { return 4; }
  std::string describe() const override { return "recorder (rank 2 of 4)"; }

  std::vector<std::size_t> counts_seen;
  std::size_t reduce_scatter_v_calls = 0;
  std::size_t all_gather_v_calls = 0;

 protected:
  void do_reduce_scatter_v(ConstCommBuffer, CommBuffer, std::span<const std::size_t> counts) override {
    counts_seen.assign(counts.begin(), counts.end());
    ++reduce_scatter_v_calls;
  }
  void do_all_gather_v(ConstCommBuffer, CommBuffer, std::span<const std::size_t> counts) override {
    counts_seen.assign(counts.begin(), counts.end());
    ++all_gather_v_calls;
  }
  // Nothing else may be reached.
  void do_all_reduce(CommBuffer, ReduceOp) override { unexpected(); }
  void do_all_gather(ConstCommBuffer, CommBuffer) override { unexpected(); }
  void do_reduce_scatter(ConstCommBuffer, CommBuffer) override { unexpected(); }
  void do_broadcast(CommBuffer, int) override { unexpected(); }
  void do_send(ConstCommBuffer, int, int) override { unexpected(); }
  void do_recv(CommBuffer, int, int) override { unexpected(); }
  void do_send_recv(ConstCommBuffer, int, CommBuffer, int, int) override { unexpected(); }
  void do_barrier() override { unexpected(); }
  std::unique_ptr<Communicator> do_split(int, int, std::string) override {
    unexpected();
    return nullptr;
  }

 private:
  static void unexpected() { ADD_FAILURE() << "a hook other than the uneven collectives' was called"; }
};

TEST(Communicator, ReduceScatterVChecksAndCountsWhatThisRankSends) {
  UnevenCollectiveRecorder comm;
  const std::vector<std::size_t> counts{0, 5, 3, 0};
  std::vector<double> input(8), output(3);
  comm.reduce_scatter_v(input, output, counts);
  EXPECT_EQ(comm.reduce_scatter_v_calls, 1u);
  EXPECT_EQ(comm.counts_seen, counts);
  // Chunks 0, 1 and 3 leave this rank: 5 doubles.
  EXPECT_EQ(comm.traffic().reduce_scatter_bytes, 5 * sizeof(double));
  EXPECT_EQ(comm.traffic().operations, 1u);

  // A rank that keeps nothing still sends its chunks of others' shards.
  std::vector<float> four(4), none;
  comm.reduce_scatter_v(four, none, std::vector<std::size_t>{1, 3, 0, 0});
  EXPECT_EQ(comm.reduce_scatter_v_calls, 2u);
  EXPECT_EQ(comm.traffic().reduce_scatter_bytes, 5 * sizeof(double) + 4 * sizeof(float));

  // All counts zero: nothing to do on any rank, nothing counted.
  comm.reduce_scatter_v(none, none, std::vector<std::size_t>(4, 0));
  EXPECT_EQ(comm.reduce_scatter_v_calls, 2u);
  EXPECT_EQ(comm.traffic().operations, 2u);

  expect_error([&] { comm.reduce_scatter_v(input, output, std::vector<std::size_t>{0, 5, 3}); },
               {"reduce_scatter_v on recorder (rank 2 of 4): counts has 3 entries but the group has 4 ranks"});
  expect_error([&] { comm.reduce_scatter_v(input, output, std::vector<std::size_t>{1, 5, 3, 0}); },
               {"input has 8 elements but counts sum to 9"});
  expect_error([&] { comm.reduce_scatter_v(input, output, std::vector<std::size_t>{0, 3, 5, 0}); },
               {"output has 3 elements but counts[2] is 5"});
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  expect_error([&] { comm.reduce_scatter_v(input, output, std::vector<std::size_t>{huge, 5, 3, 0}); },
               {"counts overflow std::size_t when summed"});
  EXPECT_EQ(comm.reduce_scatter_v_calls, 2u);
}

// The two uneven collectives as the start checks below see them: the non-blocking call,
// the recorder's count of blocking hook calls, and the bytes the traffic counts.
template <bool kGather>
struct UnevenStart {
  static constexpr const char* kName = kGather ? "all_gather_v" : "reduce_scatter_v";
  // The checks pass vectors they own, so plain references do.
  template <typename In, typename Out>
  static std::unique_ptr<PendingCollective> start(Communicator& comm, In& input, Out& output,
                                                   std::span<const std::size_t> counts) {
    if constexpr (kGather) return comm.start_all_gather_v(input, output, counts);
    return comm.start_reduce_scatter_v(input, output, counts);
  }
  static std::size_t hook_calls(const UnevenCollectiveRecorder& comm) {
    return kGather ? comm.all_gather_v_calls : comm.reduce_scatter_v_calls;
  }
  static std::uint64_t counted_bytes(const CommunicationTraffic& traffic) {
    return kGather ? traffic.all_gather_bytes : traffic.reduce_scatter_bytes;
  }
};
using StartReduceScatterV = UnevenStart<false>;
using StartAllGatherV = UnevenStart<true>;

// The default start hook (NCCL's, and any backend's without its own) on a fresh
// recorder, counts {0, 5, 3, 0}: the blocking hook runs once, at the start, and the
// handle is complete, with the blocking call's traffic; all counts zero complete at once
// and reach neither the hook nor the counters; a counts list of the wrong size is
// refused without reaching the hook.
template <typename Start>
void check_start_runs_the_blocking_hook(UnevenCollectiveRecorder& comm, std::vector<double>& input,
                                        std::vector<double>& output, std::uint64_t bytes_sent) {
  const std::vector<std::size_t> counts{0, 5, 3, 0};
  std::unique_ptr<PendingCollective> pending = Start::start(comm, input, output, counts);
  EXPECT_EQ(Start::hook_calls(comm), 1u);
  EXPECT_EQ(comm.counts_seen, counts);
  EXPECT_TRUE(pending->test());
  pending->wait();
  EXPECT_EQ(Start::hook_calls(comm), 1u);
  EXPECT_EQ(Start::counted_bytes(comm.traffic()), bytes_sent);
  EXPECT_EQ(comm.traffic().operations, 1u);
  // All counts zero: complete at once, nothing reaches the hook or the counters.
  std::vector<float> none;
  EXPECT_TRUE(Start::start(comm, none, none, std::vector<std::size_t>(4, 0))->test());
  EXPECT_EQ(Start::hook_calls(comm), 1u);
  EXPECT_EQ(comm.traffic().operations, 1u);
  expect_error([&] { Start::start(comm, input, output, std::vector<std::size_t>{0, 5, 3}); },
               {str_cat(Start::kName, " on recorder (rank 2 of 4): counts has 3 entries but the group has 4 ranks")});
  EXPECT_EQ(Start::hook_calls(comm), 1u);
}

TEST(Communicator, StartReduceScatterVRunsTheBlockingHookByDefault) {
  UnevenCollectiveRecorder comm;
  std::vector<double> input(8), output(3);
  // Chunks 0, 1 and 3 leave this rank: 5 doubles.
  check_start_runs_the_blocking_hook<StartReduceScatterV>(comm, input, output, 5 * sizeof(double));
  expect_error([&] { comm.start_reduce_scatter_v(input, output, std::vector<std::size_t>{0, 3, 5, 0}); },
               {"reduce_scatter_v on recorder (rank 2 of 4): output has 3 elements but counts[2] is 5"});
  EXPECT_EQ(comm.reduce_scatter_v_calls, 1u);
}

// The single-process start: a completed handle with the input copied to the output, and
// a bad call refused with `refusal` after the communicator's description.
template <typename Start>
void check_single_process_start_copies_the_input(Communicator& comm, const std::string& refusal) {
  const std::vector<double> input{1.5, -2.25, 1e300};
  std::vector<double> output(3);
  std::unique_ptr<PendingCollective> pending = Start::start(comm, input, output, std::vector<std::size_t>{3});
  EXPECT_TRUE(pending->test());
  pending->wait();
  EXPECT_EQ(output, input);
  expect_error([&] { Start::start(comm, input, output, std::vector<std::size_t>{2}); },
               {str_cat(Start::kName, " on single-process communicator 'world': ", refusal)});
}

TEST(SingleProcessCommunicator, StartReduceScatterVCopiesTheInput) {
  auto comm = make_single_process_communicator();
  check_single_process_start_copies_the_input<StartReduceScatterV>(*comm, "input has 3 elements but counts sum to 2");
  EXPECT_EQ(comm->traffic().operations, 1u);
}

TEST(Communicator, AllGatherVChecksAndCountsWhatThisRankSends) {
  UnevenCollectiveRecorder comm;
  const std::vector<std::size_t> counts{0, 5, 3, 0};
  std::vector<double> input(3), output(8);
  comm.all_gather_v(input, output, counts);
  EXPECT_EQ(comm.all_gather_v_calls, 1u);
  EXPECT_EQ(comm.counts_seen, counts);
  // This rank's 3 doubles go to each of the 3 others, as all_gather counts its input.
  EXPECT_EQ(comm.traffic().all_gather_bytes, 3 * 3 * sizeof(double));
  EXPECT_EQ(comm.traffic().operations, 1u);
  // In place: the input is chunk 2 of the output, 5 elements in.
  comm.all_gather_v(std::span<const double>(output.data() + 5, 3), output, counts);
  EXPECT_EQ(comm.all_gather_v_calls, 2u);

  // A rank that gives nothing still receives the others' chunks; it sends nothing.
  std::vector<float> none, four(4);
  comm.reset_traffic();
  comm.all_gather_v(none, four, std::vector<std::size_t>{1, 3, 0, 0});
  EXPECT_EQ(comm.all_gather_v_calls, 3u);
  EXPECT_EQ(comm.traffic().all_gather_bytes, 0u);
  EXPECT_EQ(comm.traffic().operations, 1u);

  // Equal counts: exactly all_gather's count, (n - 1) inputs.
  comm.reset_traffic();
  std::vector<float> two(2), eight(8);
  comm.all_gather_v(two, eight, std::vector<std::size_t>(4, 2));
  EXPECT_EQ(comm.traffic().all_gather_bytes, 3 * 2 * sizeof(float));

  // All counts zero: nothing to do on any rank, nothing counted.
  comm.reset_traffic();
  comm.all_gather_v(none, none, std::vector<std::size_t>(4, 0));
  EXPECT_EQ(comm.all_gather_v_calls, 4u);
  EXPECT_EQ(comm.traffic().operations, 0u);

  const std::string where = "all_gather_v on recorder (rank 2 of 4)";
  expect_error([&] { comm.all_gather_v(input, output, std::vector<std::size_t>{0, 5, 3}); },
               {where, "counts has 3 entries but the group has 4 ranks"});
  expect_error([&] { comm.all_gather_v(input, output, std::vector<std::size_t>{1, 5, 3, 0}); },
               {where, "output has 8 elements but counts sum to 9"});
  expect_error([&] { comm.all_gather_v(input, output, std::vector<std::size_t>{0, 3, 5, 0}); },
               {where, "input has 3 elements but counts[2] is 5"});
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  expect_error([&] { comm.all_gather_v(input, output, std::vector<std::size_t>{huge, 5, 3, 0}); },
               {where, "counts overflow std::size_t when summed"});
  // Overlaps other than the own chunk: another rank's chunk, or straddling two.
  expect_error([&] { comm.all_gather_v(std::span<const double>(output.data(), 3), output, counts); },
               {where, "input overlaps output other than as this rank's chunk"});
  expect_error([&] { comm.all_gather_v(std::span<const double>(output.data() + 4, 3), output, counts); },
               {where, "input overlaps output"});
  std::vector<std::int32_t> ints(3);
  expect_error([&] {
    comm.all_gather_v_buffer(ConstCommBuffer{ints.data(), 3, DataType::kInt32},
                             CommBuffer{output.data(), 8, DataType::kFloat64}, counts);
  }, {where, "input is int32 but output is float64"});
  EXPECT_EQ(comm.all_gather_v_calls, 4u);
  EXPECT_EQ(comm.reduce_scatter_v_calls, 0u);
}

// The default start hook for all_gather_v, as for reduce_scatter_v; the in-place rule
// is checked too.
TEST(Communicator, StartAllGatherVRunsTheBlockingHookByDefault) {
  UnevenCollectiveRecorder comm;
  std::vector<double> input(3), output(8);
  // This rank's 3 doubles to each of the 3 others.
  check_start_runs_the_blocking_hook<StartAllGatherV>(comm, input, output, 3 * 3 * sizeof(double));
  // In place: the input is chunk 2 of the output, 5 elements in.
  const std::vector<std::size_t> counts{0, 5, 3, 0};
  EXPECT_TRUE(comm.start_all_gather_v(std::span<const double>(output.data() + 5, 3), output, counts)->test());
  EXPECT_EQ(comm.all_gather_v_calls, 2u);
  EXPECT_EQ(comm.traffic().operations, 2u);
  const std::string where = "all_gather_v on recorder (rank 2 of 4)";
  expect_error([&] { comm.start_all_gather_v(input, output, std::vector<std::size_t>{1, 5, 3, 0}); },
               {where, "output has 8 elements but counts sum to 9"});
  expect_error([&] { comm.start_all_gather_v(std::span<const double>(output.data(), 3), output, counts); },
               {where, "input overlaps output other than as this rank's chunk"});
  EXPECT_EQ(comm.all_gather_v_calls, 2u);
  EXPECT_EQ(comm.traffic().operations, 2u);
}

TEST(SingleProcessCommunicator, StartAllGatherVCopiesTheInput) {
  auto comm = make_single_process_communicator();
  check_single_process_start_copies_the_input<StartAllGatherV>(*comm, "output has 3 elements but counts sum to 2");
  // In place: the output is its own input and stays as it was.
  std::vector<float> in_place{4.0f, -0.0f};
  comm->start_all_gather_v(std::span<const float>(in_place), in_place, std::vector<std::size_t>{2})->wait();
  EXPECT_EQ(in_place, (std::vector<float>{4.0f, -0.0f}));
  // One rank sends to nobody: counted as an operation of no bytes.
  EXPECT_EQ(comm->traffic().operations, 2u);
  EXPECT_EQ(comm->traffic().all_gather_bytes, 0u);
}

TEST(SingleProcessCommunicator, SplitAndSubgroup) {
  auto comm = make_single_process_communicator();
  EXPECT_EQ(comm->split(-1, 0), nullptr);
  auto split = comm->split(3, 7, "tensor");
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->name(), "tensor");
  EXPECT_EQ(split->size(), 1);
  auto group = comm->subgroup({0}, "data");
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->describe(), "single-process communicator 'data'");
  EXPECT_EQ(comm->subgroup({}, "embedding"), nullptr);
  expect_error([&] { comm->subgroup({1}, "tensor"); }, {"subgroup on single-process communicator 'world'",
                                                        "member rank 1 is not in [0, 1)"});
  expect_error([&] { comm->subgroup({0, 0}, "tensor"); }, {"rank 0 is listed twice"});
}

TEST(SingleProcessCommunicator, RefusesBadArguments) {
  auto comm = make_single_process_communicator();
  std::vector<float> three(3), four(4);
  expect_error([&] { comm->all_gather(three, four); },
               {"all_gather on single-process communicator 'world'", "output has 4 elements", "need 3"});
  expect_error([&] { comm->reduce_scatter(four, three); }, {"reduce_scatter", "input has 4 elements", "need 3"});
  expect_error([&] { comm->broadcast(three, 1); }, {"broadcast", "root rank 1 is not in [0, 1)"});
  expect_error([&] { comm->broadcast(three, -1); }, {"root rank -1"});
  expect_error([&] { comm->send(three, 0); }, {"send", "cannot send to itself"});
  expect_error([&] { comm->recv(three, 0); }, {"recv", "cannot receive from itself"});
  expect_error([&] { comm->send(three, 1); }, {"destination rank 1 is not in [0, 1)"});
  expect_error([&] { comm->send_recv(three, 0, three, 0, 40000); }, {"tag 40000 is not in [0, 32767]"});
  expect_error([&] { comm->send_recv(three, 0, four, 0); }, {"exchange with itself of 3 elements into 4"});
  std::vector<double> doubles(3);
  expect_error([&] { comm->send_recv(three, 0, doubles, 0); }, {"sends float32 but receives float64"});
  // all_gather: input overlapping output other than as this rank's own slice.
  expect_error([&] { comm->all_gather(std::span<const float>(four.data() + 1, 2), std::span<float>(four.data(), 2)); },
               {"input overlaps output"});
}

// Exposes the shared reduction for direct tests.
struct ReductionProbe : Communicator {
  using Communicator::reduce_elements;
};

TEST(Communicator, ReduceElementsSumIsPlainAddition) {
  std::vector<float> accumulator{1.0f, 1e8f, -0.0f};
  const std::vector<float> input{2.0f, 1.0f, 0.0f};
  ReductionProbe::reduce_elements(DataType::kFloat32, ReduceOp::kSum, accumulator.data(), input.data(), 3);
  EXPECT_EQ(accumulator[0], 3.0f);
  EXPECT_EQ(accumulator[1], 1e8f + 1.0f);  // rounds back to 1e8 in float, like the serial loop
  EXPECT_FALSE(std::signbit(accumulator[2]));
}

TEST(Communicator, ReduceElementsMaxPropagatesNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> accumulator{nan, 1.0f, 2.0f, -1.0f};
  const std::vector<float> input{5.0f, nan, 1.0f, 3.0f};
  ReductionProbe::reduce_elements(DataType::kFloat32, ReduceOp::kMax, accumulator.data(), input.data(), 4);
  EXPECT_TRUE(std::isnan(accumulator[0]));
  EXPECT_TRUE(std::isnan(accumulator[1]));
  EXPECT_EQ(accumulator[2], 2.0f);
  EXPECT_EQ(accumulator[3], 3.0f);
}

TEST(Communicator, ReduceElementsIntegersWrapInsteadOfOverflowing) {
  std::vector<std::int32_t> ints{std::numeric_limits<std::int32_t>::max(), -5};
  const std::vector<std::int32_t> ones{1, 2};
  ReductionProbe::reduce_elements(DataType::kInt32, ReduceOp::kSum, ints.data(), ones.data(), 2);
  EXPECT_EQ(ints[0], std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(ints[1], -3);
  std::vector<std::uint8_t> bytes{200, 7};
  const std::vector<std::uint8_t> more{100, 9};
  ReductionProbe::reduce_elements(DataType::kUInt8, ReduceOp::kSum, bytes.data(), more.data(), 2);
  EXPECT_EQ(bytes, (std::vector<std::uint8_t>{44, 16}));
  std::vector<std::int64_t> wide{-7, 1LL << 40};
  const std::vector<std::int64_t> other{-9, 3};
  ReductionProbe::reduce_elements(DataType::kInt64, ReduceOp::kMax, wide.data(), other.data(), 2);
  EXPECT_EQ(wide, (std::vector<std::int64_t>{-7, 1LL << 40}));
}

TEST(Communicator, DataTypes) {
  static_assert(data_type_of<float>() == DataType::kFloat32);
  static_assert(data_type_of<std::int64_t>() == DataType::kInt64);
  EXPECT_STREQ(data_type_name(DataType::kFloat64), "float64");
  EXPECT_EQ(data_type_size(DataType::kFloat64), 8u);
  EXPECT_EQ(data_type_size(DataType::kUInt8), 1u);
  EXPECT_EQ(data_type_size(DataType::kInt32), 4u);
}

// ---- launcher environment -------------------------------------------------------

using Environment = std::map<std::string, std::string>;

LaunchEnvironment parse(const Environment& variables) {
  return launch_environment_from([&](const char* name) -> const char* {
    const auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnvironment, NoVariablesMeansOneProcess) {
  const LaunchEnvironment e = parse({{"PATH", "/usr/bin"}});
  EXPECT_EQ(e.launcher, Launcher::kNone);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.describe(), "single process (no launcher variables)");
}

TEST(LaunchEnvironment, OpenMpi) {
  const LaunchEnvironment e =
      parse({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(e.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.describe(), "mpirun rank 5 of 8 (local rank 1)");
}

TEST(LaunchEnvironment, Slurm) {
  const LaunchEnvironment e = parse({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"}});
  EXPECT_EQ(e.launcher, Launcher::kSlurm);
  EXPECT_EQ(e.describe(), "srun rank 3 of 4 (local rank 3)");
}

TEST(LaunchEnvironment, Torchrun) {
  const LaunchEnvironment e = parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
  EXPECT_EQ(e.launcher, Launcher::kTorchrun);
  EXPECT_EQ(e.world_size, 2);
}

TEST(LaunchEnvironment, OpenMpiWinsOverTheSlurmAllocationAroundIt) {
  const LaunchEnvironment e = parse({{"SLURM_PROCID", "0"},
                                     {"SLURM_NTASKS", "1"},
                                     {"SLURM_LOCALID", "0"},
                                     {"OMPI_COMM_WORLD_RANK", "2"},
                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                     {"RANK", "9"}});
  EXPECT_EQ(e.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
}

TEST(LaunchEnvironment, SlurmWinsOverTorchrun) {
  const LaunchEnvironment e = parse({{"SLURM_PROCID", "1"},
                                     {"SLURM_NTASKS", "2"},
                                     {"SLURM_LOCALID", "1"},
                                     {"RANK", "0"},
                                     {"WORLD_SIZE", "1"},
                                     {"LOCAL_RANK", "0"}});
  EXPECT_EQ(e.launcher, Launcher::kSlurm);
  EXPECT_EQ(e.rank, 1);
}

TEST(LaunchEnvironment, RefusesPartialSets) {
  expect_error([] { parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}}); },
               {"environment variable LOCAL_RANK is not set", "RANK, WORLD_SIZE and LOCAL_RANK",
                "torchrun-style launch"});
  expect_error([] { parse({{"OMPI_COMM_WORLD_RANK", "0"}}); },
               {"OMPI_COMM_WORLD_SIZE is not set", "mpirun-style launch"});
  expect_error([] { parse({{"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}); }, {"SLURM_PROCID is not set"});
}

TEST(LaunchEnvironment, RefusesMalformedValues) {
  for (const std::string bad : {"", "abc", "3x", "-1", " 2", "+2", "99999999999999999999", "1.5"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { parse({{"RANK", bad}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}); },
                 {"environment variable RANK='" + bad + "' is not a non-negative decimal integer"});
  }
  expect_error([] { parse({{"RANK", "0"}, {"WORLD_SIZE", "four"}, {"LOCAL_RANK", "0"}}); },
               {"WORLD_SIZE='four'"});
}

TEST(LaunchEnvironment, RefusesInconsistentValues) {
  expect_error([] { parse({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "0"}}); },
               {"WORLD_SIZE=0 must be at least 1"});
  expect_error([] { parse({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}}); },
               {"SLURM_PROCID=4 is not below SLURM_NTASKS=4"});
  expect_error([] { parse({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}); },
               {"LOCAL_RANK=2 is not below WORLD_SIZE=2"});
}

TEST(LaunchEnvironment, LauncherNames) {
  EXPECT_STREQ(launcher_name(Launcher::kNone), "none");
  EXPECT_STREQ(launcher_name(Launcher::kOpenMpi), "mpirun");
  EXPECT_STREQ(launcher_name(Launcher::kSlurm), "srun");
  EXPECT_STREQ(launcher_name(Launcher::kTorchrun), "torchrun");
}

// ---- backend choice -------------------------------------------------------------

TEST(MakeCommunicator, SingleProcessWithoutLauncher) {
  auto comm = make_communicator(LaunchEnvironment{});
  EXPECT_EQ(comm->describe(), "single-process communicator 'world'");
}

TEST(MakeCommunicator, TorchrunWithOneProcessIsSingleProcess) {
  auto comm = make_communicator(LaunchEnvironment{Launcher::kTorchrun, 0, 1, 0});
  EXPECT_EQ(comm->size(), 1);
}

TEST(MakeCommunicator, TorchrunWithSeveralProcessesAsksForMpirun) {
  expect_error([] { make_communicator(LaunchEnvironment{Launcher::kTorchrun, 1, 4, 1}); },
               {"torchrun rank 1 of 4", "CPU backend exchanges data through MPI", "no TCP rendezvous backend",
                "mpirun -np 4", "srun -n 4"});
}

}  // namespace
}  // namespace dufu
