// The Communicator interface's argument checks and shared reduction, the
// single-process backend, and the factory that picks a backend from the launcher's
// environment. The MPI backend is in mpi_communicator.cc.
#include "dufu/common/communicator.h"

#include <chrono>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/common/log.h"

namespace dufu {

namespace {

constexpr int kMaxTag = 32767;  // the smallest MPI_TAG_UB the MPI standard allows

template <typename T>
void reduce_typed(ReduceOp op, void* accumulator, const void* input, std::size_t count) {
  T* out = static_cast<T*>(accumulator);
  const T* in = static_cast<const T*>(input);
  if (op == ReduceOp::kSum) {
    if constexpr (std::is_floating_point_v<T>) {
      for (std::size_t i = 0; i < count; ++i) out[i] += in[i];
    } else {  // integers wrap around instead of overflowing
      using U = std::make_unsigned_t<T>;
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<U>(out[i]) + static_cast<U>(in[i]));
    }
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(in[i]) || in[i] > out[i]) out[i] = in[i];  // NaN, once in, stays
    } else {
      out[i] = std::max(out[i], in[i]);
    }
  }
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto* a_begin = static_cast<const unsigned char*>(a);
  const auto* b_begin = static_cast<const unsigned char*>(b);
  return a_bytes != 0 && b_bytes != 0 && std::less<>()(a_begin, b_begin + b_bytes) &&
         std::less<>()(b_begin, a_begin + a_bytes);
}

// What a backend without a non-blocking transport returns: the collective already ran.
class CompletedCollective final : public PendingCollective {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class SingleProcessCommunicator final : public Communicator {
 public:
  explicit SingleProcessCommunicator(std::string name) : Communicator(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return str_cat("single-process communicator '", name(), "'"); }

 protected:
  void do_all_reduce(CommBuffer, ReduceOp) override {}
  void do_all_gather(ConstCommBuffer input, CommBuffer output) override {
    if (input.data != output.data) std::memcpy(output.data, input.data, input.count * data_type_size(input.type));
  }
  void do_reduce_scatter(ConstCommBuffer input, CommBuffer output) override {
    std::memmove(output.data, input.data, output.count * data_type_size(output.type));
  }
  // One rank's only chunk is the whole input, as in reduce_scatter.
  void do_reduce_scatter_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t>) override {
    do_reduce_scatter(input, output);
  }
  // One rank's only chunk is the whole output, as in all_gather.
  void do_all_gather_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t>) override {
    do_all_gather(input, output);
  }
  void do_broadcast(CommBuffer, int) override {}
  // check_peer refuses every peer of a group of one before these are reached.
  void do_send(ConstCommBuffer, int, int) override { DUFU_CHECK(false, "send in a group of one"); }
  void do_recv(CommBuffer, int, int) override { DUFU_CHECK(false, "recv in a group of one"); }
  void do_send_recv(ConstCommBuffer send_data, int, CommBuffer recv_data, int, int) override {
    std::memmove(recv_data.data, send_data.data, recv_data.count * data_type_size(recv_data.type));
  }
  void do_barrier() override {}
  std::unique_ptr<Communicator> do_split(int color, int, std::string name) override {
    if (color < 0) return nullptr;
    return std::make_unique<SingleProcessCommunicator>(std::move(name));
  }
};

}  // namespace

const char* data_type_name(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
  }
  return "unknown";
}

const char* memory_space_name(MemorySpace space) {
  switch (space) {
    case MemorySpace::kHost: return "host memory";
    case MemorySpace::kCudaDevice: return "CUDA device memory";
  }
  return "unknown memory";
}

std::size_t data_type_size(DataType type) {
  switch (type) {
    case DataType::kFloat32: return sizeof(float);
    case DataType::kFloat64: return sizeof(double);
    case DataType::kInt32: return sizeof(std::int32_t);
    case DataType::kInt64: return sizeof(std::int64_t);
    case DataType::kUInt8: return sizeof(std::uint8_t);
  }
  DUFU_FAIL("unknown data type ", static_cast<int>(type));
}

void Communicator::reduce_elements(DataType type, ReduceOp op, void* accumulator, const void* input,
                                   std::size_t count) {
  switch (type) {
    case DataType::kFloat32: return reduce_typed<float>(op, accumulator, input, count);
    case DataType::kFloat64: return reduce_typed<double>(op, accumulator, input, count);
    case DataType::kInt32: return reduce_typed<std::int32_t>(op, accumulator, input, count);
    case DataType::kInt64: return reduce_typed<std::int64_t>(op, accumulator, input, count);
    case DataType::kUInt8: return reduce_typed<std::uint8_t>(op, accumulator, input, count);
  }
  DUFU_FAIL("unknown data type ", static_cast<int>(type));
}

void Communicator::check_peer(int peer, const char* operation, const char* role) const {
  if (peer < 0 || peer >= size()) {
    DUFU_FAIL(operation, " on ", describe(), ": ", role, " rank ", peer, " is not in [0, ", size(), ")");
  }
}

void Communicator::check_tag(int tag, const char* operation) const {
  if (tag < 0 || tag > kMaxTag) {
    DUFU_FAIL(operation, " on ", describe(), ": tag ", tag, " is not in [0, ", kMaxTag, "]");
  }
}

class Communicator::TrafficScope {
 public:
  TrafficScope(Communicator& communicator, std::uint64_t CommunicationTraffic::*counter, double bytes)
      : traffic_(communicator.traffic_), counter_(counter), bytes_(bytes), start_(std::chrono::steady_clock::now()) {}
  ~TrafficScope() {
    traffic_.*counter_ += static_cast<std::uint64_t>(bytes_);
    ++traffic_.operations;
    traffic_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  TrafficScope(const TrafficScope&) = delete;
  TrafficScope& operator=(const TrafficScope&) = delete;

 private:
  CommunicationTraffic& traffic_;
  std::uint64_t CommunicationTraffic::*counter_;
  double bytes_;
  std::chrono::steady_clock::time_point start_;
};

namespace {

double bytes_of(std::size_t count, DataType type) {
  return static_cast<double>(count) * static_cast<double>(data_type_size(type));
}

// A reduce-scatter sends every chunk of its input but its own.
double reduce_scatter_sent_bytes(ConstCommBuffer input, std::size_t own_count) {
  return bytes_of(input.count - own_count, input.type);
}

void check_same_type(ConstCommBuffer input, CommBuffer output, const char* operation, const Communicator& group) {
  if (input.type != output.type) {
    DUFU_FAIL(operation, " on ", group.describe(), ": input is ", data_type_name(input.type), " but output is ",
              data_type_name(output.type));
  }
}

// An uneven collective's counts: one per rank of the group, summing to the count of
// the whole buffer (whole: "input" or "output"), and counts[rank()] the count of the
// other (part). Returns the offset of this rank's chunk in the whole.
std::size_t check_uneven_counts(std::span<const std::size_t> counts, const char* whole, std::size_t whole_count,
                                const char* part, std::size_t part_count, const char* operation,
                                const Communicator& group) {
  if (counts.size() != static_cast<std::size_t>(group.size())) {
    DUFU_FAIL(operation, " on ", group.describe(), ": counts has ", counts.size(), " entries but the group has ",
              group.size(), " ranks");
  }
  std::size_t total = 0;
  std::size_t own_offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > std::numeric_limits<std::size_t>::max() - total) {
      DUFU_FAIL(operation, " on ", group.describe(), ": counts overflow std::size_t when summed");
    }
    if (r == static_cast<std::size_t>(group.rank())) own_offset = total;
    total += counts[r];
  }
  if (whole_count != total) {
    DUFU_FAIL(operation, " on ", group.describe(), ": ", whole, " has ", whole_count, " elements but counts sum to ",
              total);
  }
  const std::size_t own = counts[static_cast<std::size_t>(group.rank())];
  if (part_count != own) {
    DUFU_FAIL(operation, " on ", group.describe(), ": ", part, " has ", part_count, " elements but counts[",
              group.rank(), "] is ", own);
  }
  return own_offset;
}

// A gather's input may be the output's chunk of this rank (own_offset elements in), and
// must not overlap the output otherwise.
void check_gather_overlap(ConstCommBuffer input, CommBuffer output, std::size_t own_offset, const char* operation,
                          const Communicator& group) {
  const std::size_t element = data_type_size(input.type);
  const void* own_chunk = static_cast<const unsigned char*>(output.data) + own_offset * element;
  if (input.data != own_chunk && overlaps(input.data, input.count * element, output.data, output.count * element)) {
    DUFU_FAIL(operation, " on ", group.describe(), ": input overlaps output other than as this rank's chunk");
  }
}

}  // namespace

void Communicator::all_reduce_buffer(CommBuffer data, ReduceOp op) {
  if (data.count == 0 || size() == 1) return;  // a fold over one rank is the identity
  const double n = size();
  TrafficScope scope(*this, &CommunicationTraffic::all_reduce_bytes, 2.0 * (n - 1) / n * bytes_of(data.count, data.type));
  do_all_reduce(data, op);
}

void Communicator::all_gather_buffer(ConstCommBuffer input, CommBuffer output) {
  check_same_type(input, output, "all_gather", *this);
  if (output.count != input.count * static_cast<std::size_t>(size())) {
    DUFU_FAIL("all_gather on ", describe(), ": output has ", output.count, " elements but ", size(),
              " ranks x ", input.count, " input elements need ", input.count * static_cast<std::size_t>(size()));
  }
  check_gather_overlap(input, output, static_cast<std::size_t>(rank()) * input.count, "all_gather", *this);
  if (output.count == 0) return;
  TrafficScope scope(*this, &CommunicationTraffic::all_gather_bytes, (size() - 1) * bytes_of(input.count, input.type));
  do_all_gather(input, output);
}

void Communicator::all_gather_v_buffer(ConstCommBuffer input, CommBuffer output,
                                       std::span<const std::size_t> counts) {
  check_same_type(input, output, "all_gather_v", *this);
  const std::size_t own_offset =
      check_uneven_counts(counts, "output", output.count, "input", input.count, "all_gather_v", *this);
  check_gather_overlap(input, output, own_offset, "all_gather_v", *this);
  if (output.count == 0) return;
  // This rank's input goes to every other rank, as in all_gather (where it is equal).
  TrafficScope scope(*this, &CommunicationTraffic::all_gather_bytes, (size() - 1) * bytes_of(input.count, input.type));
  do_all_gather_v(input, output, counts);
}

void Communicator::reduce_scatter_buffer(ConstCommBuffer input, CommBuffer output) {
  check_same_type(input, output, "reduce_scatter", *this);
  if (input.count != output.count * static_cast<std::size_t>(size())) {
    DUFU_FAIL("reduce_scatter on ", describe(), ": input has ", input.count, " elements but ", size(),
              " ranks x ", output.count, " output elements need ", output.count * static_cast<std::size_t>(size()));
  }
  if (input.count == 0) return;
  TrafficScope scope(*this, &CommunicationTraffic::reduce_scatter_bytes,
                     reduce_scatter_sent_bytes(input, output.count));
  do_reduce_scatter(input, output);
}

void Communicator::reduce_scatter_v_buffer(ConstCommBuffer input, CommBuffer output,
                                           std::span<const std::size_t> counts) {
  check_same_type(input, output, "reduce_scatter_v", *this);
  check_uneven_counts(counts, "input", input.count, "output", output.count, "reduce_scatter_v", *this);
  if (input.count == 0) return;
  TrafficScope scope(*this, &CommunicationTraffic::reduce_scatter_bytes,
                     reduce_scatter_sent_bytes(input, output.count));
  do_reduce_scatter_v(input, output, counts);
}

// The same checks and traffic as reduce_scatter_v_buffer; the checks throw before
// anything starts, so a bad call leaves nothing outstanding on any rank.
std::unique_ptr<PendingCollective> Communicator::start_reduce_scatter_v_buffer(ConstCommBuffer input,
                                                                               CommBuffer output,
                                                                               std::span<const std::size_t> counts) {
  check_same_type(input, output, "reduce_scatter_v", *this);
  check_uneven_counts(counts, "input", input.count, "output", output.count, "reduce_scatter_v", *this);
  if (input.count == 0) return std::make_unique<CompletedCollective>();
  TrafficScope scope(*this, &CommunicationTraffic::reduce_scatter_bytes,
                     reduce_scatter_sent_bytes(input, output.count));
  return do_start_reduce_scatter_v(input, output, counts);
}

// The same checks and traffic as all_gather_v_buffer, all before anything starts.
std::unique_ptr<PendingCollective> Communicator::start_all_gather_v_buffer(ConstCommBuffer input, CommBuffer output,
                                                                           std::span<const std::size_t> counts) {
  check_same_type(input, output, "all_gather_v", *this);
  const std::size_t own_offset =
      check_uneven_counts(counts, "output", output.count, "input", input.count, "all_gather_v", *this);
  check_gather_overlap(input, output, own_offset, "all_gather_v", *this);
  if (output.count == 0) return std::make_unique<CompletedCollective>();
  TrafficScope scope(*this, &CommunicationTraffic::all_gather_bytes, (size() - 1) * bytes_of(input.count, input.type));
  return do_start_all_gather_v(input, output, counts);
}

std::unique_ptr<PendingCollective> Communicator::do_start_all_gather_v(ConstCommBuffer input, CommBuffer output,
                                                                       std::span<const std::size_t> counts) {
  do_all_gather_v(input, output, counts);
  return std::make_unique<CompletedCollective>();
}

std::unique_ptr<PendingCollective> Communicator::do_start_reduce_scatter_v(ConstCommBuffer input, CommBuffer output,
                                                                           std::span<const std::size_t> counts) {
  do_reduce_scatter_v(input, output, counts);
  return std::make_unique<CompletedCollective>();
}

void Communicator::broadcast_buffer(CommBuffer data, int root) {
  check_peer(root, "broadcast", "root");
  if (size() == 1 || data.count == 0) return;
  TrafficScope scope(*this, &CommunicationTraffic::broadcast_bytes,
                     rank() == root ? (size() - 1) * bytes_of(data.count, data.type) : 0.0);
  do_broadcast(data, root);
}

void Communicator::send_buffer(ConstCommBuffer data, int peer, int tag) {
  check_peer(peer, "send", "destination");
  check_tag(tag, "send");
  if (peer == rank()) DUFU_FAIL("send on ", describe(), ": a rank cannot send to itself (use send_recv)");
  TrafficScope scope(*this, &CommunicationTraffic::point_to_point_bytes, bytes_of(data.count, data.type));
  do_send(data, peer, tag);
}

void Communicator::recv_buffer(CommBuffer data, int peer, int tag) {
  check_peer(peer, "recv", "source");
  check_tag(tag, "recv");
  if (peer == rank()) DUFU_FAIL("recv on ", describe(), ": a rank cannot receive from itself (use send_recv)");
  TrafficScope scope(*this, &CommunicationTraffic::point_to_point_bytes, 0.0);
  do_recv(data, peer, tag);
}

void Communicator::send_recv_buffer(ConstCommBuffer send_data, int destination, CommBuffer recv_data, int source,
                                    int tag) {
  check_peer(destination, "send_recv", "destination");
  check_peer(source, "send_recv", "source");
  check_tag(tag, "send_recv");
  if (send_data.type != recv_data.type) {
    DUFU_FAIL("send_recv on ", describe(), ": sends ", data_type_name(send_data.type), " but receives ",
              data_type_name(recv_data.type));
  }
  if (destination == rank() && source == rank() && send_data.count != recv_data.count) {
    DUFU_FAIL("send_recv on ", describe(), ": exchange with itself of ", send_data.count, " elements into ",
              recv_data.count);
  }
  TrafficScope scope(*this, &CommunicationTraffic::point_to_point_bytes,
                     destination == rank() ? 0.0 : bytes_of(send_data.count, send_data.type));
  do_send_recv(send_data, destination, recv_data, source, tag);
}

void Communicator::barrier() {
  if (size() > 1) do_barrier();
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  return do_split(color < 0 ? -1 : color, key, std::move(name));
}

std::unique_ptr<Communicator> Communicator::subgroup(const std::vector<int>& ranks, std::string name) {
  int color = -1;
  int key = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    check_peer(ranks[i], "subgroup", "member");
    if (std::count(ranks.begin(), ranks.end(), ranks[i]) != 1) {
      DUFU_FAIL("subgroup '", name, "' on ", describe(), ": rank ", ranks[i], " is listed twice");
    }
    if (ranks[i] == rank()) key = static_cast<int>(i);
  }
  if (!ranks.empty()) {
    if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end()) {
      DUFU_FAIL("subgroup '", name, "' on ", describe(), ": the member list does not contain this rank ", rank());
    }
    // Groups partition the ranks taking part, so the smallest member names a group.
    color = *std::min_element(ranks.begin(), ranks.end());
  }
  // The checks above only fail on every rank alike when the lists are consistent (as
  // from one Topology); a rank whose own list is malformed throws alone, and the
  // others wait in the split until its abort_all ends the job.
  std::unique_ptr<Communicator> group = split(color, key, name);
  if (group == nullptr) return nullptr;
  // Each member checks that the group it landed in is the one it listed; all of them
  // learn of any disagreement so that they throw together.
  // Host values: on the group's host control plane (the group itself for host backends).
  Communicator& agreement = group->control_plane();
  std::vector<std::int32_t> members(static_cast<std::size_t>(group->size()));
  const std::int32_t own = rank();
  agreement.all_gather(std::span<const std::int32_t>(&own, 1), members);
  const bool agrees = std::equal(members.begin(), members.end(), ranks.begin(), ranks.end());
  if (agreement.all_reduce_value<std::int32_t>(agrees ? 0 : 1, ReduceOp::kMax) != 0) {
    std::string listed;
    for (int member : ranks) listed += str_cat(listed.empty() ? "" : ",", member);
    DUFU_FAIL("subgroup '", name, "' on ", describe(), ": the members disagree about the group (this rank listed [",
              listed, "]); every member must pass the same list and lists must not overlap");
  }
  return group;
}

std::unique_ptr<Communicator> make_single_process_communicator(std::string name) {
  return std::make_unique<SingleProcessCommunicator>(std::move(name));
}

std::unique_ptr<Communicator> make_communicator(const LaunchEnvironment& environment) {
  switch (environment.launcher) {
    case Launcher::kNone:
      return make_single_process_communicator();
    case Launcher::kTorchrun:
      if (environment.world_size == 1) return make_single_process_communicator();
      DUFU_FAIL("launched as ", environment.describe(),
                " by a torchrun-style launcher (RANK/WORLD_SIZE), but the CPU backend exchanges data through MPI "
                "and there is no TCP rendezvous backend; HINT: launch with mpirun -np ",
                environment.world_size, " or srun -n ", environment.world_size);
    case Launcher::kOpenMpi:
    case Launcher::kSlurm: {
      std::unique_ptr<Communicator> world = make_mpi_world_communicator();
      if (world->size() != environment.world_size || world->rank() != environment.rank) {
        DUFU_FAIL("the launcher announced ", environment.describe(), " but MPI sees rank ", world->rank(), " of ",
                  world->size(),
                  "; HINT: under srun, pick Open MPI's PMI support (srun --mpi=pmix); inside a batch script, start "
                  "the ranks with srun or mpirun instead of running the program directly");
      }
      set_log_rank(world->rank(), world->size());
      return world;
    }
  }
  DUFU_FAIL("unknown launcher ", static_cast<int>(environment.launcher));
}

std::unique_ptr<Communicator> make_communicator() { return make_communicator(detect_launch_environment()); }

}  // namespace dufu
