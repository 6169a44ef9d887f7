// Collective communication between the ranks of a parallel run, behind one interface
// with a backend per transport: single process (here) and MPI (mpi_communicator.cc;
// CPU ranks started by mpirun or srun). The trainer talks only to this interface, so
// one code path serves every layout; Topology (topology.h) says which ranks form each
// group and subgroup() turns such a list into a communicator.
//
// Rules every backend keeps:
// - Collectives are called by every rank of the group, in the same order, with the
//   same element counts (all_reduce, broadcast) or counts that the documented size
//   relation ties together (all_gather(_v), reduce_scatter(_v)). Arguments are checked before
//   any data moves, and the checks only involve values every rank agrees on, so a bad
//   call throws on every rank rather than leaving some waiting.
// - Deterministic sums: every element of an all_reduce or reduce_scatter(_v) sum is the
//   left fold over group ranks in rank order, ((x0 + x1) + x2) + ..., computed by one
//   rank and copied to the others. The result is bitwise identical on every rank,
//   independent of timing and of the MPI library's algorithm choice, and equal to the
//   same loop written out serially. Max propagates NaN.
// - Failures throw dufu::Error naming the operation, the group and the rank.
// - A Communicator is not thread-safe: use each from one thread at a time.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dufu/common/launch_environment.h"

namespace dufu {

enum class DataType { kFloat32, kFloat64, kInt32, kInt64, kUInt8 };

// Where the buffers a communicator's collectives take must live. The single-process
// and MPI backends move host memory, which is also the CPU device's memory; a GPU
// backend (NCCL) would move its device's memory. A model pairs a communicator only
// with a device whose memory it moves (trainer/include/dufu/trainer/device/device.h).
enum class MemorySpace { kHost, kCudaDevice };
const char* memory_space_name(MemorySpace space);  // "host memory", "CUDA device memory"
enum class ReduceOp { kSum, kMax };

const char* data_type_name(DataType type);  // "float32", ...
std::size_t data_type_size(DataType type);

// The element types that can travel: float, double, int32_t, int64_t, uint8_t.
template <typename T>
concept CommElement = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
                      std::same_as<T, std::int64_t> || std::same_as<T, std::uint8_t>;

template <CommElement T>
constexpr DataType data_type_of() {
  if constexpr (std::same_as<T, float>) return DataType::kFloat32;
  if constexpr (std::same_as<T, double>) return DataType::kFloat64;
  if constexpr (std::same_as<T, std::int32_t>) return DataType::kInt32;
  if constexpr (std::same_as<T, std::int64_t>) return DataType::kInt64;
  if constexpr (std::same_as<T, std::uint8_t>) return DataType::kUInt8;
}

// Any contiguous sized range of elements: std::vector, std::array, std::span, ...
template <typename R>
concept CommInput = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                    CommElement<std::ranges::range_value_t<R>>;
// ... whose elements can be written.
template <typename R>
concept CommOutput = CommInput<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

// Untyped views of the ranges above, as the backends see them.
struct CommBuffer {
  void* data;
  std::size_t count;
  DataType type;
};
struct ConstCommBuffer {
  const void* data;
  std::size_t count;
  DataType type;
};

// What this rank handed to other ranks through one communicator, for measuring
// communication volume: the payload each operation's algorithm must move out of this
// rank, which ring and tree implementations share - all-reduce 2(n-1)/n of the buffer,
// all-gather (n-1) copies of the input (this rank's chunk, equal or not), reduce-scatter
// the input less this rank's own chunk ((n-1)/n of it when the chunks are equal), a
// broadcast's root (n-1) copies, a send its bytes - not headers or what intermediate
// ranks forward.
// Seconds are wall time inside the operations (waiting for slower ranks included).
struct CommunicationTraffic {
  std::uint64_t all_reduce_bytes = 0;
  std::uint64_t all_gather_bytes = 0;
  std::uint64_t reduce_scatter_bytes = 0;
  std::uint64_t broadcast_bytes = 0;
  std::uint64_t point_to_point_bytes = 0;
  std::uint64_t operations = 0;
  double seconds = 0.0;
  std::uint64_t total_bytes() const {
    return all_reduce_bytes + all_gather_bytes + reduce_scatter_bytes + broadcast_bytes + point_to_point_bytes;
  }
};

// A collective started and not yet waited for (Communicator::start_reduce_scatter_v,
// start_all_gather_v).
// Destroying one that was never completed completes it first (blocking, logging rather
// than throwing what fails), so its buffers are never written after it is gone.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Blocks until the collective is complete and its output written. Idempotent: later
  // calls return at once (or throw again what the first one threw).
  virtual void wait() = 0;
  // Lets the backend make progress without blocking; true once complete (output
  // written, and wait() returns at once).
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // This process's rank in the group, and the number of ranks.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The memory its collectives read and write (every buffer passed to them).
  virtual MemorySpace memory_space() const { return MemorySpace::kHost; }
  // The name given at creation ("world", or split's/subgroup's name argument).
  const std::string& name() const { return name_; }
  // For messages: "MPI communicator 'tensor' (rank 1 of 2, world rank 3)".
  virtual std::string describe() const = 0;

  // In place: every rank ends with the element-wise sum (or max) over the group.
  template <CommOutput R>
  void all_reduce(R&& data, ReduceOp op = ReduceOp::kSum) {
    all_reduce_buffer(output_buffer(data), op);
  }
  // One value, in host memory whatever memory_space() says: returns the sum (or max)
  // over the group, through the host control plane (below).
  template <CommElement T>
  T all_reduce_value(T value, ReduceOp op = ReduceOp::kSum) {
    control_plane().all_reduce_buffer(CommBuffer{&value, 1, data_type_of<T>()}, op);
    return value;
  }
  // output = the inputs of ranks 0, 1, ..., size()-1 one after another; every input
  // has n elements and output size() * n. The input may be output's own slice
  // (input == output + rank() * n); other overlaps are refused.
  template <CommInput In, CommOutput Out>
    requires std::same_as<std::ranges::range_value_t<In>, std::ranges::range_value_t<Out>>
  void all_gather(In&& input, Out&& output) {
    all_gather_buffer(input_buffer(input), output_buffer(output));
  }
  // input has size() * n elements; output (n elements) on rank r = the sum over the
  // group of every rank's input chunk r, i.e. input[r*n, (r+1)*n).
  template <CommInput In, CommOutput Out>
    requires std::same_as<std::ranges::range_value_t<In>, std::ranges::range_value_t<Out>>
  void reduce_scatter(In&& input, Out&& output) {
    reduce_scatter_buffer(input_buffer(input), output_buffer(output));
  }
  // Uneven reduce_scatter (ZeRO-2's gradient shards): input holds sum(counts)
  // elements, chunk r (counts[r] elements) after chunks 0..r-1; output (counts[rank()]
  // elements) on rank r = the sum over the group of every rank's chunk r, the same
  // rank-ordered left fold as all_reduce and reduce_scatter (bitwise equal to them for
  // the same elements). counts has size() entries, the same on every rank; zeros are
  // allowed (that rank gets nothing).
  template <CommInput In, CommOutput Out>
    requires std::same_as<std::ranges::range_value_t<In>, std::ranges::range_value_t<Out>>
  void reduce_scatter_v(In&& input, Out&& output, std::span<const std::size_t> counts) {
    reduce_scatter_v_buffer(input_buffer(input), output_buffer(output), counts);
  }
  // reduce_scatter_v started (same arguments, same checks, same result bits) and left
  // to run while the caller works: it returns at once, and the output is written when
  // the handle's wait() returns or its test() gives true. input and output must stay
  // valid, and input unmodified, until then; counts is copied. Several may be
  // outstanding on one communicator, waited for in any order, with blocking collectives
  // in between; every rank must start and call them all in the same order (MPI's rule
  // for non-blocking collectives). The traffic is counted when started (its seconds
  // are the start's, not the wait's). Backends without a non-blocking transport run it
  // to completion here and return a completed handle. The handle must not outlive
  // this communicator.
  template <CommInput In, CommOutput Out>
    requires std::same_as<std::ranges::range_value_t<In>, std::ranges::range_value_t<Out>>
  std::unique_ptr<PendingCollective> start_reduce_scatter_v(In&& input, Out&& output,
                                                            std::span<const std::size_t> counts) {
    return start_reduce_scatter_v_buffer(input_buffer(input), output_buffer(output), counts);
  }
  // Uneven all_gather (ZeRO's parameter shards), the counterpart of reduce_scatter_v:
  // output holds sum(counts) elements, chunk r (counts[r] elements) after chunks
  // 0..r-1; every rank ends with every rank's input (counts[rank()] elements) in its
  // chunk. counts has size() entries, the same on every rank; zeros are allowed (that
  // rank gives nothing). The input may be output's own chunk (in place: input ==
  // output + the offset of chunk rank()); other overlaps are refused.
  template <CommInput In, CommOutput Out>
    requires std::same_as<std::ranges::range_value_t<In>, std::ranges::range_value_t<Out>>
  void all_gather_v(In&& input, Out&& output, std::span<const std::size_t> counts) {
    all_gather_v_buffer(input_buffer(input), output_buffer(output), counts);
  }
  // all_gather_v started (same arguments, same checks, same result bits), on the terms
  // of start_reduce_scatter_v above: output written when wait() returns or test() gives
  // true, input and output valid and untouched until then (in place included), counts
  // copied, several outstanding (of either kind) waited in any order, every rank
  // starting them in the same order, traffic counted at the start, and a completed
  // handle from backends without a non-blocking transport.
  template <CommInput In, CommOutput Out>
    requires std::same_as<std::ranges::range_value_t<In>, std::ranges::range_value_t<Out>>
  std::unique_ptr<PendingCollective> start_all_gather_v(In&& input, Out&& output,
                                                        std::span<const std::size_t> counts) {
    return start_all_gather_v_buffer(input_buffer(input), output_buffer(output), counts);
  }
  // Every rank ends with root's data.
  template <CommOutput R>
  void broadcast(R&& data, int root) {
    broadcast_buffer(output_buffer(data), root);
  }
  // Point to point with another rank of this group; the receiver names the exact
  // count. Blocking: two ranks that send to each other at once may deadlock for large
  // messages, so pair exchanges use send_recv. A rank cannot send to itself (use
  // send_recv). tag is in [0, 32767] and must match on both sides.
  template <CommInput R>
  void send(R&& data, int peer, int tag = 0) {
    send_buffer(input_buffer(data), peer, tag);
  }
  template <CommOutput R>
  void recv(R&& data, int peer, int tag = 0) {
    recv_buffer(output_buffer(data), peer, tag);
  }
  // Sends to destination and receives from source at once (either may be this rank).
  template <CommInput In, CommOutput Out>
  void send_recv(In&& send_data, int destination, Out&& recv_data, int source, int tag = 0) {
    send_recv_buffer(input_buffer(send_data), destination, output_buffer(recv_data), source, tag);
  }
  void barrier();

  // Counted since creation or the last reset_traffic().
  const CommunicationTraffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = {}; }

  // Collective over this group: ranks passing the same color >= 0 form one new group,
  // ordered by key then by rank here; a rank passing a negative color joins none and
  // gets nullptr.
  std::unique_ptr<Communicator> split(int color, int key, std::string name = "split");
  // Collective over this group: every rank passes the member list (ranks of this
  // group, in the order they get in the new one) of the group it joins, or an empty
  // list to join none (nullptr). The lists must partition the ranks that pass one,
  // e.g. Topology::group(kind); members check that they agree and throw otherwise.
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks, std::string name = "subgroup");

  // The untyped entry points behind the templates, checked the same way.
  void all_reduce_buffer(CommBuffer data, ReduceOp op);
  void all_gather_buffer(ConstCommBuffer input, CommBuffer output);
  void all_gather_v_buffer(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts);
  std::unique_ptr<PendingCollective> start_all_gather_v_buffer(ConstCommBuffer input, CommBuffer output,
                                                               std::span<const std::size_t> counts);
  void reduce_scatter_buffer(ConstCommBuffer input, CommBuffer output);
  void reduce_scatter_v_buffer(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts);
  std::unique_ptr<PendingCollective> start_reduce_scatter_v_buffer(ConstCommBuffer input, CommBuffer output,
                                                                   std::span<const std::size_t> counts);
  void broadcast_buffer(CommBuffer data, int root);
  void send_buffer(ConstCommBuffer data, int peer, int tag);
  void recv_buffer(CommBuffer data, int peer, int tag);
  void send_recv_buffer(ConstCommBuffer send_data, int destination, CommBuffer recv_data, int source, int tag);

 protected:
  explicit Communicator(std::string name) : name_(std::move(name)) {}

  // The communicator over the same ranks, in the same order, whose collectives move
  // host memory: this one for host backends; a device backend (NCCL) keeps the host
  // communicator it was made from and returns it. Small host values
  // (all_reduce_value, subgroup's agreement) travel through it.
  virtual Communicator& control_plane() { return *this; }

  // Backend hooks, called after the checks above (types match, sizes agree, ranks in
  // range, and not a no-op on one rank where that is obvious).
  virtual void do_all_reduce(CommBuffer data, ReduceOp op) = 0;
  virtual void do_all_gather(ConstCommBuffer input, CommBuffer output) = 0;
  virtual void do_all_gather_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts) = 0;
  virtual void do_reduce_scatter(ConstCommBuffer input, CommBuffer output) = 0;
  virtual void do_reduce_scatter_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts) = 0;
  virtual void do_broadcast(CommBuffer data, int root) = 0;
  virtual void do_send(ConstCommBuffer data, int peer, int tag) = 0;
  virtual void do_recv(CommBuffer data, int peer, int tag) = 0;
  virtual void do_send_recv(ConstCommBuffer send_data, int destination, CommBuffer recv_data, int source,
                            int tag) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, std::string name) = 0;
  // Starts do_reduce_scatter_v's work (same checks done, input not empty). The default
  // runs do_reduce_scatter_v to completion and returns a completed handle, which every
  // backend can keep; MPI overrides it with a non-blocking exchange.
  virtual std::unique_ptr<PendingCollective> do_start_reduce_scatter_v(ConstCommBuffer input, CommBuffer output,
                                                                       std::span<const std::size_t> counts);
  // Starts do_all_gather_v's work (same checks done, output not empty); the default runs
  // do_all_gather_v to completion, MPI overrides it with a non-blocking gather.
  virtual std::unique_ptr<PendingCollective> do_start_all_gather_v(ConstCommBuffer input, CommBuffer output,
                                                                   std::span<const std::size_t> counts);

  // accumulator[i] = accumulator[i] op input[i]: the one element-wise reduction every
  // CPU backend uses, so all of them fold the same way.
  static void reduce_elements(DataType type, ReduceOp op, void* accumulator, const void* input, std::size_t count);

 private:
  template <typename R>
  static ConstCommBuffer input_buffer(R& range) {
    using T = std::ranges::range_value_t<R>;
    return ConstCommBuffer{std::ranges::data(range), std::ranges::size(range), data_type_of<T>()};
  }
  template <typename R>
  static CommBuffer output_buffer(R& range) {
    using T = std::ranges::range_value_t<R>;
    return CommBuffer{std::ranges::data(range), std::ranges::size(range), data_type_of<T>()};
  }
  void check_peer(int peer, const char* operation, const char* role) const;
  void check_tag(int tag, const char* operation) const;

  // Adds one operation to traffic_ when destroyed: its bytes and its duration.
  class TrafficScope;

  std::string name_;
  CommunicationTraffic traffic_;
};

// A group of one: rank 0 of size 1. Collectives copy; send/recv have no peer.
std::unique_ptr<Communicator> make_single_process_communicator(std::string name = "world");

// A communicator over all processes of the MPI job (a duplicate of MPI_COMM_WORLD).
// Initialises MPI on first use (MPI_THREAD_SERIALIZED) unless the program already
// did, and then finalises it at exit. Failures of MPI calls throw dufu::Error
// (MPI_ERRORS_RETURN), never abort.
//
// At exit every rank waits for the others before MPI_Finalize, at most
// DUFU_MPI_EXIT_TIMEOUT seconds (default 120): a rank that leaves while others still
// wait in a collective would otherwise hang forever inside MPI_Finalize. After the
// timeout it logs that it is leaving early and calls MPI_Abort, so the job ends.
std::unique_ptr<Communicator> make_mpi_world_communicator();

// How long an operation of the MPI backend waits for the ranks it needs (every rank
// of the group for a collective, the peer for a send or receive) before deciding that
// one has stopped answering (SIGSTOP, a stuck device). Waiting ranks sleep between
// polls, at most 1 ms, rather than spin. At the timeout a waiting rank finds out which
// ranks are not waiting too, logs one line through abort_all, e.g. "collective
// all_reduce on 'world' timed out after 600 s: rank 1 did not answer
// (DUFU_COLLECTIVE_TIMEOUT)", and ends the job with exit status 1. The default is
// DUFU_COLLECTIVE_TIMEOUT seconds (read when MPI starts) or else 600, as PyTorch's NCCL
// watchdog waits; this call replaces it, before or after MPI starts, for every wait
// that begins afterwards, and `source` is what the line tells the user to raise (train
// passes "dist.collective_timeout"). Throws for a value that is not a positive number.
void set_collective_timeout(double seconds, std::string source);

// The collective timeout now in force and the setting that chose it (for backends whose
// waits are bounded elsewhere: the NCCL communicator's device waits).
struct CollectiveTimeout {
  double seconds = 0;
  std::string source;
};
CollectiveTimeout collective_timeout();

// The backend the launcher implies: MPI for mpirun and srun (checking that MPI sees
// the rank and world size the environment announced), single process when there is no
// launcher or a torchrun-style launch of one process. A torchrun-style launch of
// several processes is refused: the CPU backend exchanges data through MPI, and there
// is no TCP rendezvous backend. Also sets the log rank prefix.
std::unique_ptr<Communicator> make_communicator(const LaunchEnvironment& environment);
std::unique_ptr<Communicator> make_communicator();  // from detect_launch_environment()

// For a tool's top-level error handler: when MPI is running, logs "rank R is aborting
// all ranks: <message>" and calls MPI_Abort(MPI_COMM_WORLD, exit_code), which ends
// every rank of the job. Returns when MPI was never initialised, so the caller exits
// as usual.
//
// Launcher behaviour this relies on (tested with Open MPI's mpirun in
// mpi_communicator_test): when a rank calls MPI_Abort, dies from a signal, or exits
// non-zero without having finalised MPI, mpirun kills the remaining ranks, names the
// failing rank and exits non-zero. A rank that exits after finalising while the others
// still wait is not noticed by mpirun; the exit timeout above covers that case. Under
// srun, MPI_Abort ends the job step; plain non-zero exits end it only with
// --kill-on-bad-exit (untested here: no Slurm on the build machines).
void abort_all(std::string_view message, int exit_code = 1);

}  // namespace dufu
