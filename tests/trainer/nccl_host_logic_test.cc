// The NCCL communicator's own logic without a GPU: the communicator of
// src/parallel/nccl_communicator.cc over host stand-ins of NCCL's calls (grouped sends
// and receives, all-gather and broadcast over MPI; the fold through collective_fold.h,
// the code the fold kernel runs) and the CPU device, under mpirun on 2 and 3 ranks.
// The stand-ins move bytes through the MPI communicator of the world (the tests make
// NCCL communicators over the whole world only).
// Every collective must give the MPI communicator's bits, blocking or started; and the
// stand-ins keep the stream discipline the communicator promises: every NCCL call and
// fold on its own stream, never the device's, the device's stream waiting for all of it
// when a blocking call returns, and for a started one only at its wait().
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "device/cuda_module.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "device/collective_fold.h"
#include "dufu/trainer/device/device.h"
#include "parallel/nccl_communicator_with.h"
#include "support/forwarding_cpu_device.h"
#include "support/mpi_world.h"
#include "support/uneven_counts.h"

namespace dufu::trainer {
namespace {

Communicator& world() { return dufu::testing::mpi_world(); }

// ---- the stand-ins ----

struct HostEvent {
  std::uint64_t seen = 0;        // the communicator-stream calls before its last record there
  std::uint64_t device_ops = 0;  // the device-stream operations before its last record there
};

// What the stand-ins saw: calls on the communicator's stream so far, how many of them
// the device's stream has waited for, and every call made on the device's stream.
// Also, with StreamCountingDevice, the device's own operations (zero, copy, fill) and
// how many of them the communicator's stream has waited for: a call on it before it
// waited for all of them could run beside them.
struct StreamLedger {
  std::uint64_t stream_calls = 0;
  std::uint64_t device_waited_for = 0;
  std::vector<std::string> on_device_stream;
  std::uint64_t device_ops = 0;
  std::uint64_t stream_waited_for_device = 0;
  std::vector<std::string> unordered_after_device;
};
StreamLedger ledger;

void on_stream(void* stream, const char* call) {
  if (stream == nullptr) ledger.on_device_stream.emplace_back(call);
  if (stream != nullptr && ledger.stream_waited_for_device < ledger.device_ops) {
    ledger.unordered_after_device.emplace_back(call);
  }
  ++ledger.stream_calls;
}

// The CPU device, counting what it is asked to do on its stream.
class StreamCountingDevice : public dufu::testing::ForwardingCpuDevice {
 public:
  void copy(void* to, const void* from, std::size_t bytes) override {
    ++ledger.device_ops;
    cpu().copy(to, from, bytes);
  }
  void fill(float* to, float value, std::size_t count) override {
    ++ledger.device_ops;
    cpu().fill(to, value, count);
  }
  void zero(void* to, std::size_t bytes) override {
    ++ledger.device_ops;
    cpu().zero(to, bytes);
  }
};

// Grouped sends and receives run at the group's end, as NCCL runs them: pairwise
// exchanges at every shift (send_recv), so no rank waits on another's order.
bool grouping = false;
struct PointToPoint {
  bool is_send;
  void* data;
  std::size_t bytes;
  int peer;
};
std::vector<PointToPoint> grouped;

std::span<unsigned char> bytes_of(const PointToPoint* call) {
  if (call == nullptr) return {};
  return {static_cast<unsigned char*>(call->data), call->bytes};
}

void run_point_to_point(const std::vector<PointToPoint>& calls) {
  const int ranks = world().size();
  const int me = world().rank();
  const auto find = [&](bool is_send, int peer) -> const PointToPoint* {
    for (const PointToPoint& call : calls) {
      if (call.is_send == is_send && call.peer == peer) return &call;
    }
    return nullptr;
  };
  for (int shift = 0; shift < ranks; ++shift) {
    const int destination = (me + shift) % ranks;
    const int source = (me + ranks - shift) % ranks;
    const std::span<unsigned char> out = bytes_of(find(true, destination));
    const std::span<unsigned char> in = bytes_of(find(false, source));
    if (shift == 0) {
      ASSERT_EQ(out.size(), in.size()) << "a send to itself of another size than the receive";
      if (!out.empty()) std::memcpy(in.data(), out.data(), out.size());
      continue;
    }
    world().send_recv(std::span<const unsigned char>(out), destination, in, source);
  }
}

void point_to_point(bool is_send, const void* data, std::size_t count, DataType type, int peer, void* stream) {
  on_stream(stream, is_send ? "send" : "recv");
  grouped.push_back({is_send, const_cast<void*>(data), count * data_type_size(type), peer});
  if (!grouping) {
    run_point_to_point(grouped);
    grouped.clear();
  }
}

template <typename T>
void fold_as(void* destination, const void* blocks, std::size_t stride, std::size_t count, int ranks, bool is_max) {
  for (std::size_t i = 0; i < count; ++i) {
    static_cast<T*>(destination)[i] = fold_element(static_cast<const T*>(blocks), stride, ranks, i, is_max);
  }
}

// What the communicator handed the stand-in's set_timeout.
struct TimeoutHandedOver {
  double seconds = 0;
  std::string source;
};
TimeoutHandedOver timeout_handed_over;

const CudaNccl& host_nccl() {
  static const CudaNccl entries{
      .library = []() { return DeviceAvailability{true, ""}; },
      .unique_id = [](unsigned char* id) { std::memset(id, 7, kNcclUniqueIdBytes); },
      .set_timeout = [](double seconds, const char* source) { timeout_handed_over = {seconds, source}; },
      .init_rank =
          [](const unsigned char*, int ranks, int) -> void* {
            DUFU_CHECK(ranks == world().size(), "host NCCL stand-in: a group of ", ranks, " ranks");
            return new int(0);
          },
      .destroy = [](void* comm) noexcept { delete static_cast<int*>(comm); },
      .group_start =
          []() {
            grouping = true;
            grouped.clear();
          },
      .group_end =
          []() {
            grouping = false;
            run_point_to_point(grouped);
            grouped.clear();
          },
      .send = [](void*, const void* data, std::size_t count, DataType type, int peer,
                 void* stream) { point_to_point(true, data, count, type, peer, stream); },
      .recv = [](void*, void* data, std::size_t count, DataType type, int peer,
                 void* stream) { point_to_point(false, data, count, type, peer, stream); },
      .all_gather =
          [](void*, const void* input, void* output, std::size_t count, DataType type, void* stream) {
            on_stream(stream, "all_gather");
            const std::size_t bytes = count * data_type_size(type);
            // Through a copy: the input may be this rank's slice of the output.
            const auto* first = static_cast<const unsigned char*>(input);
            const std::vector<unsigned char> mine(first, first + bytes);
            world().all_gather(mine, std::span<unsigned char>(static_cast<unsigned char*>(output),
                                                               bytes * static_cast<std::size_t>(world().size())));
          },
      .broadcast =
          [](void*, void* data, std::size_t count, DataType type, int root, void* stream) {
            on_stream(stream, "broadcast");
            world().broadcast(std::span<unsigned char>(static_cast<unsigned char*>(data), count * data_type_size(type)),
                              root);
          },
      .fold =
          [](void* destination, const void* blocks, std::size_t stride, std::size_t count, int ranks, DataType type,
             ReduceOp op, void* stream) {
            on_stream(stream, "fold");
            const bool is_max = op == ReduceOp::kMax;
            switch (type) {
              case DataType::kFloat32: return fold_as<float>(destination, blocks, stride, count, ranks, is_max);
              case DataType::kFloat64: return fold_as<double>(destination, blocks, stride, count, ranks, is_max);
              case DataType::kInt32: return fold_as<std::int32_t>(destination, blocks, stride, count, ranks, is_max);
              case DataType::kInt64: return fold_as<std::int64_t>(destination, blocks, stride, count, ranks, is_max);
              case DataType::kUInt8: return fold_as<std::uint8_t>(destination, blocks, stride, count, ranks, is_max);
            }
          },
      .make_stream = []() -> void* { return new int(0); },
      .destroy_stream = [](void* stream) noexcept { delete static_cast<int*>(stream); },
      .make_event = []() -> void* { return new HostEvent; },
      .destroy_event = [](void* event) noexcept { delete static_cast<HostEvent*>(event); },
      .record =
          [](void* event, void* stream) {
            // A record on the device's stream marks no communicator-stream call, and
            // one on the communicator's no device operation.
            static_cast<HostEvent*>(event)->seen = stream == nullptr ? 0 : ledger.stream_calls;
            static_cast<HostEvent*>(event)->device_ops = stream == nullptr ? ledger.device_ops : 0;
          },
      .stream_wait =
          [](void* waiting, void* event) {
            const HostEvent& marks = *static_cast<HostEvent*>(event);
            if (waiting == nullptr) {
              ledger.device_waited_for = std::max(ledger.device_waited_for, marks.seen);
            } else {
              ledger.stream_waited_for_device = std::max(ledger.stream_waited_for_device, marks.device_ops);
            }
          },
      .event_done = [](void*) { return true; },
  };
  return entries;
}

// ---- the tests ----

class NcclHostLogicTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ledger = StreamLedger{};
    nccl_ = make_nccl_communicator_with(world().split(0, world().rank(), "nccl"), host_nccl(),
                                        [](const void*) { return true; }, device_of_kind(DeviceKind::kCpu));
  }
  void TearDown() override {
    EXPECT_TRUE(ledger.on_device_stream.empty())
        << "an NCCL call on the device's stream: " << ledger.on_device_stream.front();
  }

  // The device's stream has waited for every call made on the communicator's.
  void expect_device_caught_up() const {
    EXPECT_EQ(ledger.device_waited_for, ledger.stream_calls) << "the device's stream did not wait for the collective";
  }

  std::unique_ptr<Communicator> nccl_;
};

std::vector<float> rank_floats(std::size_t n, std::uint32_t salt) {
  std::mt19937 engine(static_cast<std::uint32_t>(11 + 31 * world().rank()) + salt);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> values(n);
  for (float& x : values) x = mantissa(engine) * std::pow(10.0f, static_cast<float>(exponent(engine)));
  return values;
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(expected[i])) << "element " << i;
  }
}

std::vector<std::vector<std::size_t>> uneven_counts() {
  return dufu::testing::uneven_count_patterns(static_cast<std::size_t>(world().size()), 100);
}

std::size_t sum_of(const std::vector<std::size_t>& counts) {
  std::size_t total = 0;
  for (const std::size_t count : counts) total += count;
  return total;
}

// The device's waits on NCCL are bounded by the collective timeout in force when the
// communicator is made (the module aborts the communicators when it passes): a stopped
// peer raises no asynchronous error, so nothing else would end the wait.
TEST(NcclCollectiveTimeout, TheCommunicatorHandsTheModuleTheTimeoutInForce) {
  const CollectiveTimeout before = collective_timeout();
  set_collective_timeout(37.5, "dist.collective_timeout");
  {
    const std::unique_ptr<Communicator> nccl =
        make_nccl_communicator_with(world().split(0, world().rank(), "nccl"), host_nccl(),
                                    [](const void*) { return true; }, device_of_kind(DeviceKind::kCpu));
    EXPECT_EQ(timeout_handed_over.seconds, 37.5);
    EXPECT_EQ(timeout_handed_over.source, "dist.collective_timeout");
  }
  set_collective_timeout(before.seconds, before.source);
}

TEST_F(NcclHostLogicTest, AllReduceSumAndMaxAreTheMpiFolds) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{1000}, std::size_t{1001}}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<float> expected = rank_floats(n, 1);
      std::vector<float> got = expected;
      world().all_reduce(expected, op);
      nccl_->all_reduce(got, op);
      expect_bitwise(got, expected);
      expect_device_caught_up();
    }
  }
  std::vector<std::int64_t> wrapping(5, std::numeric_limits<std::int64_t>::max() - world().rank());
  std::vector<std::int64_t> expected = wrapping;
  world().all_reduce(expected);
  nccl_->all_reduce(wrapping);
  EXPECT_EQ(wrapping, expected);
}

TEST_F(NcclHostLogicTest, ReduceScatterAndAllGatherAreMpis) {
  const auto ranks = static_cast<std::size_t>(world().size());
  const std::vector<float> input = rank_floats(ranks * 129, 2);
  std::vector<float> expected(129), got(129);
  world().reduce_scatter(input, expected);
  nccl_->reduce_scatter(input, got);
  expect_bitwise(got, expected);
  expect_device_caught_up();
  std::vector<float> gathered(ranks * 129), expected_gather(ranks * 129);
  world().all_gather(got, expected_gather);
  nccl_->all_gather(got, gathered);
  expect_bitwise(gathered, expected_gather);
  expect_device_caught_up();
}

TEST_F(NcclHostLogicTest, UnevenCollectivesAreMpis) {
  const std::size_t own_index = static_cast<std::size_t>(world().rank());
  for (const std::vector<std::size_t>& counts : uneven_counts()) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    const std::size_t total = sum_of(counts);
    const std::vector<float> input = rank_floats(total, 3);
    std::vector<float> expected(counts[own_index]), got(counts[own_index]);
    world().reduce_scatter_v(input, expected, counts);
    nccl_->reduce_scatter_v(input, got, counts);
    expect_bitwise(got, expected);
    expect_device_caught_up();

    const std::vector<float> piece = rank_floats(counts[own_index], 4);
    std::vector<float> gathered(total), expected_gather(total);
    world().all_gather_v(piece, expected_gather, counts);
    nccl_->all_gather_v(piece, gathered, counts);
    expect_bitwise(gathered, expected_gather);
    expect_device_caught_up();
    // In place: the input is this rank's chunk of the output.
    std::size_t begin = 0;
    for (std::size_t k = 0; k < own_index; ++k) begin += counts[k];
    std::vector<float> in_place(total, -1.0f);
    std::copy(piece.begin(), piece.end(), in_place.begin() + static_cast<std::ptrdiff_t>(begin));
    nccl_->all_gather_v(std::span<const float>(in_place.data() + begin, piece.size()), in_place, counts);
    expect_bitwise(in_place, expected_gather);
  }
}

TEST_F(NcclHostLogicTest, BroadcastAndSendRecvAreMpis) {
  std::vector<float> data = rank_floats(77, 5);
  std::vector<float> expected = data;
  world().broadcast(expected, 1);
  nccl_->broadcast(data, 1);
  expect_bitwise(data, expected);
  expect_device_caught_up();
  // A ring: each rank sends to the next and receives from the previous.
  const int ranks = world().size();
  const int next = (world().rank() + 1) % ranks;
  const int previous = (world().rank() + ranks - 1) % ranks;
  const std::vector<float> mine = rank_floats(33, 6);
  std::vector<float> received(33), expected_received(33);
  world().send_recv(mine, next, expected_received, previous);
  nccl_->send_recv(mine, next, received, previous);
  expect_bitwise(received, expected_received);
  expect_device_caught_up();
}

// Started ones: the device's stream does not wait for them until their wait() (the
// host never blocks); several outstanding, a blocking one among them, waited out of
// order or polled, or dropped unwaited, each gives the blocking call's bits.
TEST_F(NcclHostLogicTest, StartedCollectivesWaitOnlyAtTheirWaitAndGiveTheBlockingBits) {
  const std::size_t own_index = static_cast<std::size_t>(world().rank());
  for (const std::vector<std::size_t>& counts : uneven_counts()) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    const std::size_t total = sum_of(counts);
    const std::vector<float> scatter_input = rank_floats(total, 7);
    std::vector<float> scattered(counts[own_index]), expected_scattered(counts[own_index]);
    world().reduce_scatter_v(scatter_input, expected_scattered, counts);
    const std::vector<float> piece = rank_floats(counts[own_index], 8);
    std::vector<float> gathered(total), expected_gathered(total);
    world().all_gather_v(piece, expected_gathered, counts);
    std::vector<float> summed = rank_floats(300, 9);
    std::vector<float> expected_summed = summed;
    world().all_reduce(expected_summed);

    const std::uint64_t waited_before = ledger.device_waited_for;
    auto scatter = nccl_->start_reduce_scatter_v(scatter_input, scattered, counts);
    EXPECT_EQ(ledger.device_waited_for, waited_before) << "starting made the device's stream wait";
    auto gather = nccl_->start_all_gather_v(piece, gathered, counts);
    nccl_->all_reduce(summed);
    gather->wait();
    EXPECT_TRUE(scatter->test());
    scatter->wait();
    expect_device_caught_up();
    expect_bitwise(scattered, expected_scattered);
    expect_bitwise(gathered, expected_gathered);
    expect_bitwise(summed, expected_summed);

    std::vector<float> dropped(counts[own_index]);
    const std::uint64_t calls_before = ledger.stream_calls;
    nccl_->start_reduce_scatter_v(scatter_input, dropped, counts).reset();
    if (total > 0) {  // nothing at all moves nothing
      EXPECT_GT(ledger.stream_calls, calls_before);
    }
    expect_device_caught_up();
    expect_bitwise(dropped, expected_scattered);
  }
}

// The communicator's scratch grows with the largest collective, and a new one is zeroed
// on the device's stream: the NCCL calls that write into it come after that on the
// communicator's stream, as after everything else the device was asked to do first.
TEST_F(NcclHostLogicTest, TheCommunicatorsStreamFollowsTheDevicesWorkBeforeIt) {
  StreamCountingDevice device;
  const std::unique_ptr<Communicator> nccl = make_nccl_communicator_with(
      world().split(0, world().rank(), "nccl counted"), host_nccl(), [](const void*) { return true; }, device);
  const auto ranks = static_cast<std::size_t>(world().size());
  const std::size_t own_index = static_cast<std::size_t>(world().rank());
  for (const std::size_t n : {std::size_t{10}, std::size_t{1000}, std::size_t{5000}}) {
    SCOPED_TRACE(n);
    const std::vector<float> input = rank_floats(ranks * n, 10);
    std::vector<float> expected(n), got(n);
    world().reduce_scatter(input, expected);
    nccl->reduce_scatter(input, got);  // the scratch grows first for this one
    expect_bitwise(got, expected);
    std::vector<std::size_t> counts(ranks, n);
    counts[0] = 2 * n;
    const std::vector<float> uneven_input = rank_floats(sum_of(counts), 11);
    std::vector<float> uneven(counts[own_index]), uneven_expected(counts[own_index]);
    world().reduce_scatter_v(uneven_input, uneven_expected, counts);
    nccl->start_reduce_scatter_v(uneven_input, uneven, counts)->wait();
    expect_bitwise(uneven, uneven_expected);
    std::vector<float> summed = rank_floats(3 * ranks * n, 12);
    std::vector<float> summed_expected = summed;
    world().all_reduce(summed_expected);
    nccl->all_reduce(summed);
    expect_bitwise(summed, summed_expected);
  }
  EXPECT_GT(ledger.device_ops, 0u) << "the counting device saw nothing: the check could not fail";
  EXPECT_TRUE(ledger.unordered_after_device.empty())
      << ledger.unordered_after_device.size() << " calls on the communicator's stream were not ordered after the "
      << "device's work before them, the first: " << ledger.unordered_after_device.front();
}

}  // namespace
}  // namespace dufu::trainer
