// NcclCommunicator: the Communicator contract over the module's NCCL entries.
//
// Sums are not ncclAllReduce: NCCL's ring and tree algorithms add in an order that
// depends on the algorithm and the topology, and the contract wants the left fold over
// ranks in rank order, bitwise equal to the MPI backend's. So all_reduce is what the
// MPI backend does (common/src/mpi_communicator.cc): an all-to-all (grouped ncclSend /
// ncclRecv) hands rank k chunk k of every rank's data, a device kernel folds those
// blocks in rank order (collective_fold.h), and ncclAllGather shares the folded
// chunks: the bytes per rank of a ring all-reduce. reduce_scatter and reduce_scatter_v
// (chunks of the caller's sizes) stop after the fold. all_gather_v is ncclAllGather
// when the chunks are equal, and otherwise grouped ncclSend / ncclRecv of each rank's
// chunk (ncclAllGather wants equal ones).
// NCCL has no tags: messages between two ranks arrive in the order they were sent,
// which is what the callers' tags would give. NCCL cannot tell how much a receive got,
// so a count mismatch is the caller's to avoid (the host backends detect it).
//
// NCCL moves only GPU memory. Host buffers given to this communicator (a step's loss,
// a gradient norm, the host-staged pieces of a checkpoint) go through its control plane,
// the MPI communicator of the same ranks, so the trainer's host-side collectives work
// unchanged on CUDA; which memory a buffer is in is asked of the driver per call.
//
// Every NCCL call and fold of a communicator runs on a stream of its own, in program
// order, so its collectives keep one order on every rank whichever of them overlap
// computation (two streams under one communicator could interleave differently on two
// ranks, and NCCL's kernels wait for their peers: a hang). A blocking collective's
// stream waits for the device's stream, and the device's stream for it: the call only
// enqueues, so traffic seconds measure the enqueueing, not the transfer. A started one
// (start_reduce_scatter_v, start_all_gather_v) records an event instead, and its wait()
// makes the device's stream wait for that event: the reduction of a ZeRO bucket runs
// beside the backward's kernels, on the GPU's copy and compute units at once.
#include "dufu/trainer/parallel/nccl_communicator.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda_module.h"
#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "device/collective_fold.h"
#include "parallel/nccl_communicator_with.h"

namespace dufu::trainer {

namespace {

// The module's NCCL entries once NCCL's library is loaded and this process has a GPU
// of its own, or nullptr with the reason.
const CudaNccl* nccl_or_reason(std::string* reason) {
  const GpuChoice gpu = gpu_for_this_process();
  if (gpu.ordinal < 0) {
    *reason = gpu.refusal;
    return nullptr;
  }
  const CudaModule* module = loaded_cuda_module(reason);
  if (module == nullptr) return nullptr;
  if (module->nccl == nullptr) {
    *reason = "this build's CUDA device module has no NCCL (nccl.h was not found in the CUDA toolkit at configure "
              "time)";
    return nullptr;
  }
  const DeviceAvailability library = module->nccl->library();
  if (!library.available) {
    *reason = library.reason;
    return nullptr;
  }
  return module->nccl;
}

// A collective enqueued on a communicator's stream: wait() makes the device's stream
// wait for its event (the host does not block: what follows on the device reads the
// output), test() asks the event. Dropped unwaited, it is waited for, so no later device
// work reads its buffers early.
class StartedCollective final : public PendingCollective {
 public:
  StartedCollective(const CudaNccl& nccl, void* event, std::string description)
      : nccl_(nccl), event_(event), description_(std::move(description)) {}
  StartedCollective(const StartedCollective&) = delete;
  StartedCollective& operator=(const StartedCollective&) = delete;
  ~StartedCollective() override {
    try {
      wait();
    } catch (const std::exception& error) {
      log_message(LogLevel::kError, "COMM", str_cat(description_, " dropped before its wait failed: ", error.what()));
    }
    nccl_.destroy_event(event_);
  }

  void wait() override {
    if (waited_) return;
    waited_ = true;
    nccl_.stream_wait(nullptr, event_);
  }

  bool test() override {
    if (!waited_ && !nccl_.event_done(event_)) return false;
    waited_ = true;
    return true;
  }

 private:
  const CudaNccl& nccl_;
  void* event_;  // cudaEvent_t
  std::string description_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> host, const CudaNccl& nccl, bool (*is_device_memory)(const void*),
                   Device& device)
      : Communicator(host->name()),
        host_(std::move(host)),
        nccl_(nccl),
        is_device_memory_(is_device_memory),
        device_(device) {
    const CollectiveTimeout timeout = collective_timeout();
    nccl_.set_timeout(timeout.seconds, timeout.source.c_str());
    std::vector<std::uint8_t> id(kNcclUniqueIdBytes);
    if (host_->rank() == 0) nccl_.unique_id(id.data());
    host_->broadcast(id, 0);
    comm_ = nccl_.init_rank(id.data(), host_->size(), host_->rank());
    comm_stream_ = nccl_.make_stream();
    device_ready_ = nccl_.make_event();
    comm_done_ = nccl_.make_event();
  }
  ~NcclCommunicator() override {
    // The communicator's work ends before its stream and events go (a dropped started
    // collective has already made the device's stream wait for it).
    try {
      nccl_.record(comm_done_, comm_stream_);
      nccl_.stream_wait(nullptr, comm_done_);
      device_.synchronize();
    } catch (const std::exception& error) {
      log_message(LogLevel::kError, "COMM", str_cat(describe(), ": its last collectives failed: ", error.what()));
    }
    nccl_.destroy_event(comm_done_);
    nccl_.destroy_event(device_ready_);
    nccl_.destroy_stream(comm_stream_);
    nccl_.destroy(comm_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  MemorySpace memory_space() const override { return MemorySpace::kCudaDevice; }
  std::string describe() const override {
    return str_cat("NCCL communicator '", name(), "' on ", device_.describe(), " over ", host_->describe());
  }

 protected:
  Communicator& control_plane() override { return *host_; }

  void do_all_reduce(CommBuffer data, ReduceOp op) override {
    if (on_host(data.data, data.data, "all_reduce")) return host_->all_reduce_buffer(data, op);
    const std::size_t element = data_type_size(data.type);
    const std::size_t stride = fold_chunk_stride(data.count, size());
    // scratch: this rank's chunk of every rank's data (blocks `stride` apart), then the
    // folded chunks of every rank, gathered.
    unsigned char* blocks = scratch(2 * stride * static_cast<std::size_t>(size()) * element);
    unsigned char* gathered = blocks + stride * static_cast<std::size_t>(size()) * element;
    // fold_chunk's chunks lie one after another, so their counts place them.
    lay_out_chunks([&](int r) { return fold_chunk(data.count, size(), r).count; });
    follow_device();
    all_to_all(static_cast<const unsigned char*>(data.data), stride, data.type, blocks);
    unsigned char* own_slot = gathered + static_cast<std::size_t>(rank()) * stride * element;
    nccl_.fold(own_slot, blocks, stride, chunks_[static_cast<std::size_t>(rank())].count, size(), data.type, op,
               comm_stream_);
    nccl_.all_gather(comm_, own_slot, gathered, stride, data.type, comm_stream_);
    device_follows();
    device_.copy(data.data, gathered, data.count * element);
  }

  void do_reduce_scatter(ConstCommBuffer input, CommBuffer output) override {
    if (on_host(input.data, output.data, "reduce_scatter")) return host_->reduce_scatter_buffer(input, output);
    lay_out_chunks([&](int) { return output.count; });
    follow_device();
    scatter_and_fold(input, output);
    device_follows();
  }

  void do_reduce_scatter_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts) override {
    if (reduce_scatter_v_on_host(input, output)) return host_->reduce_scatter_v_buffer(input, output, counts);
    lay_out_chunks([&](int r) { return counts[static_cast<std::size_t>(r)]; });
    follow_device();
    scatter_and_fold(input, output);
    device_follows();
  }

  std::unique_ptr<PendingCollective> do_start_reduce_scatter_v(ConstCommBuffer input, CommBuffer output,
                                                               std::span<const std::size_t> counts) override {
    if (reduce_scatter_v_on_host(input, output)) return Communicator::do_start_reduce_scatter_v(input, output, counts);
    lay_out_chunks([&](int r) { return counts[static_cast<std::size_t>(r)]; });
    follow_device();
    scatter_and_fold(input, output);
    return started("reduce_scatter_v");
  }

  void do_all_gather(ConstCommBuffer input, CommBuffer output) override {
    if (on_host(input.data, output.data, "all_gather")) return host_->all_gather_buffer(input, output);
    follow_device();
    nccl_.all_gather(comm_, input.data, output.data, input.count, input.type, comm_stream_);
    device_follows();
  }

  void do_all_gather_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts) override {
    if (all_gather_v_on_host(input, output)) return host_->all_gather_v_buffer(input, output, counts);
    gather_chunks(input, output, counts);
    device_follows();
  }

  std::unique_ptr<PendingCollective> do_start_all_gather_v(ConstCommBuffer input, CommBuffer output,
                                                           std::span<const std::size_t> counts) override {
    if (all_gather_v_on_host(input, output)) return Communicator::do_start_all_gather_v(input, output, counts);
    gather_chunks(input, output, counts);
    return started("all_gather_v");
  }

  void do_broadcast(CommBuffer data, int root) override {
    if (on_host(data.data, data.data, "broadcast")) return host_->broadcast_buffer(data, root);
    follow_device();
    nccl_.broadcast(comm_, data.data, data.count, data.type, root, comm_stream_);
    device_follows();
  }

  void do_send(ConstCommBuffer data, int peer, int tag) override {
    if (on_host(data.data, data.data, "send")) return host_->send_buffer(data, peer, tag);
    follow_device();
    nccl_.send(comm_, data.data, data.count, data.type, peer, comm_stream_);
    device_follows();
  }

  void do_recv(CommBuffer data, int peer, int tag) override {
    if (on_host(data.data, data.data, "recv")) return host_->recv_buffer(data, peer, tag);
    follow_device();
    nccl_.recv(comm_, data.data, data.count, data.type, peer, comm_stream_);
    device_follows();
  }

  void do_send_recv(ConstCommBuffer send_data, int destination, CommBuffer recv_data, int source, int tag) override {
    if (on_host(send_data.data, recv_data.data, "send_recv")) {
      return host_->send_recv_buffer(send_data, destination, recv_data, source, tag);
    }
    if (destination == rank() && source == rank()) {
      device_.copy(recv_data.data, send_data.data, recv_data.count * data_type_size(recv_data.type));
      return;
    }
    follow_device();
    nccl_.group_start();
    nccl_.send(comm_, send_data.data, send_data.count, send_data.type, destination, comm_stream_);
    nccl_.recv(comm_, recv_data.data, recv_data.count, recv_data.type, source, comm_stream_);
    nccl_.group_end();
    device_follows();
  }

  void do_barrier() override {
    // Work enqueued before the barrier is finished before any rank leaves it.
    device_follows();
    device_.synchronize();
    host_->barrier();
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    std::unique_ptr<Communicator> host_group = host_->split(color, key, std::move(name));
    if (host_group == nullptr) return nullptr;
    return std::make_unique<NcclCommunicator>(std::move(host_group), nccl_, is_device_memory_, device_);
  }

 private:
  // Whether an operation's buffers are host memory (then the control plane moves them)
  // rather than the GPU's; a host buffer paired with a GPU one is refused.
  bool on_host(const void* first, const void* second, const char* operation) const {
    const bool first_on_host = !is_device_memory_(first);
    if (first_on_host != !is_device_memory_(second)) {
      DUFU_FAIL(operation, " on ", describe(), ": one buffer is host memory and the other GPU memory");
    }
    return first_on_host;
  }

  // A rank that gets nothing may pass an empty output without an address; the input
  // (never empty here) then says where the data lives.
  bool reduce_scatter_v_on_host(ConstCommBuffer input, CommBuffer output) const {
    return on_host(input.data, output.count == 0 ? input.data : output.data, "reduce_scatter_v");
  }

  // A rank that gives nothing may pass an empty input without an address; the output
  // (never empty here) then says where the data lives.
  bool all_gather_v_on_host(ConstCommBuffer input, CommBuffer output) const {
    return on_host(input.count == 0 ? output.data : input.data, output.data, "all_gather_v");
  }

  // The communicator's stream starts what is enqueued on it next after the work the
  // device's stream has now, and the other way round.
  void follow_device() {
    nccl_.record(device_ready_, nullptr);
    nccl_.stream_wait(comm_stream_, device_ready_);
  }
  void device_follows() {
    nccl_.record(comm_done_, comm_stream_);
    nccl_.stream_wait(nullptr, comm_done_);
  }

  // The handle of what was just enqueued on the communicator's stream: an event of its
  // own, which its wait() makes the device's stream wait for.
  std::unique_ptr<PendingCollective> started(const char* operation) {
    void* event = nccl_.make_event();
    try {
      nccl_.record(event, comm_stream_);
    } catch (...) {
      nccl_.destroy_event(event);
      throw;
    }
    return std::make_unique<StartedCollective>(nccl_, event, str_cat(operation, " on ", describe()));
  }

  // all_gather_v's enqueueing: ncclAllGather when the chunks are equal (NCCL's own
  // algorithm), and otherwise this rank's chunk copied into place and grouped ncclSend /
  // ncclRecv of every rank's.
  void gather_chunks(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts) {
    if (std::all_of(counts.begin(), counts.end(), [&](std::size_t count) { return count == counts[0]; })) {
      follow_device();
      nccl_.all_gather(comm_, input.data, output.data, input.count, input.type, comm_stream_);
      return;
    }
    lay_out_chunks([&](int r) { return counts[static_cast<std::size_t>(r)]; });
    const std::size_t element = data_type_size(input.type);
    auto* gathered = static_cast<unsigned char*>(output.data);
    unsigned char* own_chunk = gathered + chunks_[static_cast<std::size_t>(rank())].begin * element;
    if (input.data != own_chunk && input.count > 0) device_.copy(own_chunk, input.data, input.count * element);
    follow_device();
    nccl_.group_start();
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      const FoldChunk chunk = chunks_[static_cast<std::size_t>(peer)];
      if (input.count > 0) nccl_.send(comm_, input.data, input.count, input.type, peer, comm_stream_);
      if (chunk.count > 0) {
        nccl_.recv(comm_, gathered + chunk.begin * element, chunk.count, input.type, peer, comm_stream_);
      }
    }
    nccl_.group_end();
  }

  // chunks_ = the counts count_of(r) of ranks r = 0, 1, ..., size()-1, one after another.
  template <typename CountOf>
  void lay_out_chunks(CountOf count_of) {
    chunks_.resize(static_cast<std::size_t>(size()));
    std::size_t begin = 0;
    for (int r = 0; r < size(); ++r) {
      chunks_[static_cast<std::size_t>(r)] = FoldChunk{begin, count_of(r)};
      begin += chunks_[static_cast<std::size_t>(r)].count;
    }
  }

  // Chunk k (chunks_[k]) of every rank's data goes to rank k, which puts rank r's into
  // block r of `blocks` (blocks `stride` elements apart).
  void all_to_all(const unsigned char* data, std::size_t stride, DataType type, unsigned char* blocks) {
    const std::size_t element = data_type_size(type);
    const std::size_t own = chunks_[static_cast<std::size_t>(rank())].count;
    nccl_.group_start();
    for (int peer = 0; peer < size(); ++peer) {
      const FoldChunk chunk = chunks_[static_cast<std::size_t>(peer)];
      if (chunk.count > 0) nccl_.send(comm_, data + chunk.begin * element, chunk.count, type, peer, comm_stream_);
      if (own > 0) {
        nccl_.recv(comm_, blocks + static_cast<std::size_t>(peer) * stride * element, own, type, peer, comm_stream_);
      }
    }
    nccl_.group_end();
  }

  // output = the sum over ranks of every rank's chunk rank() (chunks_) of input,
  // enqueued on the communicator's stream (after follow_device).
  void scatter_and_fold(ConstCommBuffer input, CommBuffer output) {
    unsigned char* blocks = scratch(output.count * static_cast<std::size_t>(size()) * data_type_size(input.type));
    all_to_all(static_cast<const unsigned char*>(input.data), output.count, input.type, blocks);
    nccl_.fold(output.data, blocks, output.count, output.count, size(), output.type, ReduceOp::kSum, comm_stream_);
  }

  // Device scratch of at least `bytes`, kept between calls and grown, never shrunk, so
  // a training step does not allocate. Only the communicator's stream uses it, one
  // collective after another, so started collectives share it; a smaller one is freed
  // only once the work that reads it is done.
  unsigned char* scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) {
      device_follows();
      device_.synchronize();
      scratch_ = DeviceBuffer<unsigned char>(device_, bytes);
      // The new buffer is zeroed on the device's stream: the communicator's stream
      // writes into it only after that (a caller may have followed the device already).
      follow_device();
    }
    return scratch_.data();
  }

  std::unique_ptr<Communicator> host_;
  const CudaNccl& nccl_;
  bool (*is_device_memory_)(const void*);  // the CUDA module's: GPU memory rather than the host's
  Device& device_;
  void* comm_ = nullptr;          // ncclComm_t
  void* comm_stream_ = nullptr;   // cudaStream_t: every NCCL call and fold of this communicator
  void* device_ready_ = nullptr;  // cudaEvent_t: follow_device's
  void* comm_done_ = nullptr;     // cudaEvent_t: device_follows'
  DeviceBuffer<unsigned char> scratch_;
  std::vector<FoldChunk> chunks_;  // of the running collective, kept so a step does not allocate
};

}  // namespace

DeviceAvailability nccl_availability() {
  std::string reason;
  if (nccl_or_reason(&reason) == nullptr) return {false, reason};
  return {true, ""};
}

DeviceAvailability nccl_availability(Communicator& ranks) { return agree_on_availability(ranks, nccl_availability()); }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host) {
  DUFU_CHECK(host != nullptr && host->memory_space() == MemorySpace::kHost,
             "make_nccl_communicator: the control plane must be a host communicator");
  std::string reason;
  const CudaNccl* nccl = nccl_or_reason(&reason);
  if (nccl == nullptr) DUFU_FAIL("NCCL communicator '", host->name(), "': ", reason);
  return make_nccl_communicator_with(std::move(host), *nccl, loaded_cuda_module(&reason)->is_device_memory,
                                     device_of_kind(DeviceKind::kCuda));
}

std::unique_ptr<Communicator> make_nccl_communicator_with(std::unique_ptr<Communicator> host, const CudaNccl& nccl,
                                                          bool (*is_device_memory)(const void*), Device& device) {
  return std::make_unique<NcclCommunicator>(std::move(host), nccl, is_device_memory, device);
}

}  // namespace dufu::trainer
