// The MPI backend of Communicator (Open MPI from Debian; CPU ranks started by mpirun
// or srun), MPI's lazy start and guarded finalisation, and abort_all.
//
// Sums do not use MPI_SUM: Open MPI picks its reduction algorithm by message size, group
// size and tuning parameters, and the standard promises no order. all_reduce is
// instead an Alltoallv that hands rank k chunk k of every rank's data, a left fold in
// rank order on rank k, and an Allgatherv of the folded chunks: the same amount of
// data per rank as a ring all-reduce, and results that are a fixed function of the
// inputs (see communicator.h). reduce_scatter_v is the first two of those steps with
// the caller's chunks, and reduce_scatter is reduce_scatter_v with equal chunks;
// all_gather_v is the Allgatherv with the caller's chunks, and all_gather it with equal
// ones (the same data as MPI_Allgather moves). start_reduce_scatter_v is reduce_scatter_v
// with an Ialltoallv, folded by the same code when the request completes, and
// start_all_gather_v all_gather_v with an Iallgatherv.
//
// Every other MPI call that waits for other ranks is its non-blocking form too
// (Ialltoallv, Iallgatherv, Ibcast, Ibarrier, Isend, Irecv), moving the same data, and
// is completed within the collective timeout (mpi_collective_timeout.h).

// The C API only: included from C++, mpi.h otherwise pulls in the deprecated C++
// bindings, which live in a library MPI::MPI_C does not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/environment_seconds.h"
#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "mpi_collective_timeout.h"

namespace dufu {

namespace {

constexpr double kDefaultExitTimeoutSeconds = 120.0;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return str_cat("MPI error code ", code);
  return std::string(text, static_cast<std::size_t>(length));
}

int world_rank_or_minus_one() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = -1;
  if (initialized != 0 && finalized == 0) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Every MPI call goes through DUFU_MPI_CHECK(communicator or nullptr, dufu operation,
// MPI function, arguments...), which throws dufu::Error naming all three and the rank.
void check_mpi(int code, const char* function, const char* operation, const Communicator* communicator) {
  if (code == MPI_SUCCESS) return;
  if (communicator != nullptr) {
    DUFU_FAIL(function, " failed in ", operation, " on ", communicator->describe(), ": ", mpi_error_string(code));
  }
  DUFU_FAIL(function, " failed in ", operation, " (world rank ", world_rank_or_minus_one(), "): ",
            mpi_error_string(code));
}

#define DUFU_MPI_CHECK(communicator, operation, function, ...) \
  check_mpi(function(__VA_ARGS__), #function, operation, communicator)

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kUInt8: return MPI_UINT8_T;
  }
  DUFU_FAIL("unknown data type ", static_cast<int>(type));
}

// The process-wide MPI runtime, when this file started it.
struct Runtime {
  double exit_timeout_seconds = kDefaultExitTimeoutSeconds;
  MPI_Comm exit_comm = MPI_COMM_NULL;  // private to the exit handshake
  pid_t pid = 0;                       // of the process that started MPI
};

Runtime& runtime() {
  static Runtime state;
  return state;
}

double exit_timeout_from_environment() {
  return positive_seconds_from_environment("DUFU_MPI_EXIT_TIMEOUT", kDefaultExitTimeoutSeconds);
}

// Registered with atexit once MPI is up: waits (bounded) for every rank to arrive,
// then finalises; a rank still alone after the timeout aborts the job instead of
// hanging inside MPI_Finalize.
void finalize_at_exit() {
  // A child forked after MPI started inherits this handler but not the MPI job.
  if (::getpid() != runtime().pid) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return;
  Runtime& state = runtime();
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(state.exit_comm, &request) == MPI_SUCCESS) {
    const mpi_wait::Backoff backoff;
    int done = 0;
    while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done == 0) {
      if (backoff.elapsed_seconds() > state.exit_timeout_seconds) {
        log_message(LogLevel::kError, "COMM",
                    str_cat("rank ", world_rank_or_minus_one(), " is exiting but the other ranks did not reach exit "
                            "within ", state.exit_timeout_seconds, " s (DUFU_MPI_EXIT_TIMEOUT); aborting all ranks "
                            "so none is left waiting"));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      backoff.pause();
    }
  }
  MPI_Comm_free(&state.exit_comm);
  mpi_wait::close_probe_channel();
  MPI_Finalize();
}

void ensure_mpi_started() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized != 0) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) DUFU_FAIL("MPI was already finalised; a communicator cannot be created after that");
    return;
  }
  Runtime& state = runtime();
  state.exit_timeout_seconds = exit_timeout_from_environment();
  mpi_wait::default_collective_timeout_from_environment();
  int provided = 0;
  DUFU_MPI_CHECK(nullptr, "start", MPI_Init_thread, nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  DUFU_MPI_CHECK(nullptr, "start", MPI_Comm_set_errhandler, MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  DUFU_MPI_CHECK(nullptr, "start", MPI_Comm_dup, MPI_COMM_WORLD, &state.exit_comm);
  state.pid = ::getpid();
  std::atexit(finalize_at_exit);
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm.
  MpiCommunicator(MPI_Comm comm, std::string name) : Communicator(std::move(name)), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    world_rank_ = world_rank_or_minus_one();
    DUFU_MPI_CHECK(this, "create", MPI_Comm_set_errhandler, comm_, MPI_ERRORS_RETURN);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return str_cat("MPI communicator '", name(), "' (rank ", rank_, " of ", size_, ", world rank ", world_rank_, ")");
  }

 protected:
  void do_all_reduce(CommBuffer data, ReduceOp op) override {
    // Chunk r: n / size elements, one more for the first n % size ranks.
    const std::size_t whole = data.count / static_cast<std::size_t>(size_);
    const std::size_t rest = data.count % static_cast<std::size_t>(size_);
    const Chunks& chunks = chunks_of([&](int r) { return whole + (static_cast<std::size_t>(r) < rest ? 1 : 0); },
                                     "all_reduce");
    void* own_chunk = static_cast<unsigned char*>(data.data) +
                      static_cast<std::size_t>(chunks.offsets[static_cast<std::size_t>(rank_)]) *
                          data_type_size(data.type);
    exchange_and_fold(data.data, data.type, op, own_chunk, "all_reduce");
    MPI_Request request = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, "all_reduce", MPI_Iallgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data,
                   chunks.counts.data(), chunks.offsets.data(), mpi_type(data.type), comm_, &request);
    complete_collective(request, "all_reduce");
  }

  void do_all_gather(ConstCommBuffer input, CommBuffer output) override {
    chunks_of([&](int) { return input.count; }, "all_gather");
    gather_chunks(input, output, "all_gather");
  }

  void do_all_gather_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts) override {
    chunks_of([&](int r) { return counts[static_cast<std::size_t>(r)]; }, "all_gather_v");
    gather_chunks(input, output, "all_gather_v");
  }

  void do_reduce_scatter(ConstCommBuffer input, CommBuffer output) override {
    chunks_of([&](int) { return output.count; }, "reduce_scatter");
    exchange_and_fold(input.data, input.type, ReduceOp::kSum, output.data, "reduce_scatter");
  }

  void do_reduce_scatter_v(ConstCommBuffer input, CommBuffer output, std::span<const std::size_t> counts) override {
    chunks_of([&](int r) { return counts[static_cast<std::size_t>(r)]; }, "reduce_scatter_v");
    exchange_and_fold(input.data, input.type, ReduceOp::kSum, output.data, "reduce_scatter_v");
  }

  std::unique_ptr<PendingCollective> do_start_reduce_scatter_v(ConstCommBuffer input, CommBuffer output,
                                                               std::span<const std::size_t> counts) override {
    chunks_of([&](int r) { return counts[static_cast<std::size_t>(r)]; }, "reduce_scatter_v");
    return std::make_unique<PendingReduceScatter>(*this, input, output, "reduce_scatter_v");
  }

  std::unique_ptr<PendingCollective> do_start_all_gather_v(ConstCommBuffer input, CommBuffer output,
                                                           std::span<const std::size_t> counts) override {
    chunks_of([&](int r) { return counts[static_cast<std::size_t>(r)]; }, "all_gather_v");
    return std::make_unique<PendingAllGather>(*this, input, output, "all_gather_v");
  }

  void do_broadcast(CommBuffer data, int root) override {
    MPI_Request request = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, "broadcast", MPI_Ibcast, data.data, checked_count(data.count, "broadcast"),
                   mpi_type(data.type), root, comm_, &request);
    complete_collective(request, "broadcast");
  }

  void do_send(ConstCommBuffer data, int peer, int tag) override {
    MPI_Request request = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, "send", MPI_Isend, data.data, checked_count(data.count, "send"), mpi_type(data.type), peer,
                   tag, comm_, &request);
    const int peers[] = {peer};
    complete({&request, 1}, nullptr, "send", peers);
  }

  void do_recv(CommBuffer data, int peer, int tag) override {
    MPI_Request request = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, "recv", MPI_Irecv, data.data, checked_count(data.count, "recv"), mpi_type(data.type), peer,
                   tag, comm_, &request);
    MPI_Status status;
    const int peers[] = {peer};
    complete({&request, 1}, &status, "recv", peers);
    check_received(status, data, peer, "recv");
  }

  // The receive is posted first, as MPI_Sendrecv does, so an exchange with itself works.
  void do_send_recv(ConstCommBuffer send_data, int destination, CommBuffer recv_data, int source, int tag) override {
    MPI_Request requests[] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    DUFU_MPI_CHECK(this, "send_recv", MPI_Irecv, recv_data.data, checked_count(recv_data.count, "send_recv"),
                   mpi_type(recv_data.type), source, tag, comm_, &requests[0]);
    DUFU_MPI_CHECK(this, "send_recv", MPI_Isend, send_data.data, checked_count(send_data.count, "send_recv"),
                   mpi_type(send_data.type), destination, tag, comm_, &requests[1]);
    MPI_Status statuses[2];
    const int peers[] = {source, destination};
    complete(requests, statuses, "send_recv", peers);
    check_received(statuses[0], recv_data, source, "send_recv");
  }

  void do_barrier() override {
    MPI_Request request = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, "barrier", MPI_Ibarrier, comm_, &request);
    complete_collective(request, "barrier");
  }

  // MPI has no non-blocking split: a bounded barrier first, so that a rank that never
  // comes is found there rather than leaving the others inside MPI_Comm_split.
  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    MPI_Request arrived = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, "split", MPI_Ibarrier, comm_, &arrived);
    complete_collective(arrived, "split");
    MPI_Comm group = MPI_COMM_NULL;
    DUFU_MPI_CHECK(this, "split", MPI_Comm_split, comm_, color < 0 ? MPI_UNDEFINED : color, key, &group);
    if (group == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(group, std::move(name));
  }

 private:
  struct Chunks {
    std::vector<int> counts;
    std::vector<int> offsets;
  };

  // Completes this group's requests within the collective timeout; a point-to-point
  // operation names the peers it waits for (group ranks), a collective waits for all.
  void complete(std::span<MPI_Request> requests, MPI_Status* statuses, const char* operation,
                std::span<const int> peers) const {
    const mpi_wait::WaitSubject subject{comm_, name(), operation, false, peers};
    check_mpi(mpi_wait::complete_or_abort(requests, statuses, subject), "MPI_Test", operation, this);
  }
  void complete_collective(MPI_Request& request, const char* operation) const {
    const mpi_wait::WaitSubject subject{comm_, name(), operation, true, {}};
    check_mpi(mpi_wait::complete_or_abort({&request, 1}, nullptr, subject), "MPI_Test", operation, this);
  }

  int checked_count(std::size_t count, const char* operation) const {
    if (count > static_cast<std::size_t>(INT_MAX)) {
      DUFU_FAIL(operation, " on ", describe(), ": ", count, " elements exceed the MPI count limit of ", INT_MAX);
    }
    return static_cast<int>(count);
  }

  void check_received(const MPI_Status& status, CommBuffer data, int peer, const char* operation) const {
    int received = 0;
    DUFU_MPI_CHECK(this, operation, MPI_Get_count, &status, mpi_type(data.type), &received);
    if (received != static_cast<int>(data.count)) {
      DUFU_FAIL(operation, " on ", describe(), ": expected ", data.count, " elements from rank ", peer, " but got ",
                received);
    }
  }

  // chunks_ = the counts count_of(r) of ranks r = 0, 1, ..., size_-1, one after
  // another, checked against MPI's int counts and offsets.
  template <typename CountOf>
  const Chunks& chunks_of(CountOf count_of, const char* operation) {
    chunks_.counts.resize(static_cast<std::size_t>(size_));
    chunks_.offsets.resize(static_cast<std::size_t>(size_));
    std::size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      const std::size_t count = count_of(r);
      chunks_.offsets[static_cast<std::size_t>(r)] = checked_count(offset, operation);
      chunks_.counts[static_cast<std::size_t>(r)] = checked_count(count, operation);
      offset += count;
      checked_count(offset, operation);
    }
    return chunks_;
  }

  // What a gather sends: MPI_IN_PLACE when input is this rank's chunk (chunks_) of output.
  const void* gather_send_buffer(ConstCommBuffer input, CommBuffer output) const {
    const std::size_t own_offset = static_cast<std::size_t>(chunks_.offsets[static_cast<std::size_t>(rank_)]);
    const bool in_place =
        input.data == static_cast<const unsigned char*>(output.data) + own_offset * data_type_size(input.type);
    return in_place ? MPI_IN_PLACE : input.data;
  }

  // output's chunk r (chunks_) = rank r's input.
  void gather_chunks(ConstCommBuffer input, CommBuffer output, const char* operation) {
    const MPI_Datatype type = mpi_type(input.type);
    MPI_Request request = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, operation, MPI_Iallgatherv, gather_send_buffer(input, output),
                   chunks_.counts[static_cast<std::size_t>(rank_)], type, output.data, chunks_.counts.data(),
                   chunks_.offsets.data(), type, comm_, &request);
    complete_collective(request, operation);
  }

  // The receiving side of the exchange below: this rank's chunk (chunks_.counts[rank_]
  // elements) from every rank, rank after rank in blocks; returns that count.
  int plan_receive(DataType type, std::vector<unsigned char>& blocks, std::vector<int>& counts,
                   std::vector<int>& offsets, const char* operation) const {
    const int own = chunks_.counts[static_cast<std::size_t>(rank_)];
    checked_count(static_cast<std::size_t>(own) * static_cast<std::size_t>(size_), operation);
    blocks.resize(static_cast<std::size_t>(own) * static_cast<std::size_t>(size_) * data_type_size(type));
    counts.assign(static_cast<std::size_t>(size_), own);
    offsets.resize(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) offsets[static_cast<std::size_t>(r)] = r * own;
    return own;
  }

  // Hands rank k chunk k (chunks_) of every rank's input, rank after rank in scratch_,
  // and folds them into destination (this rank's chunk, chunks_.counts[rank_] elements).
  // destination may be part of input: the exchange has read input by then.
  void exchange_and_fold(const void* input, DataType type, ReduceOp op, void* destination, const char* operation) {
    const int own = plan_receive(type, scratch_, scratch_counts_, scratch_offsets_, operation);
    const MPI_Datatype mpi = mpi_type(type);
    MPI_Request request = MPI_REQUEST_NULL;
    DUFU_MPI_CHECK(this, operation, MPI_Ialltoallv, input, chunks_.counts.data(), chunks_.offsets.data(), mpi,
                   scratch_.data(), scratch_counts_.data(), scratch_offsets_.data(), mpi, comm_, &request);
    complete_collective(request, operation);
    fold_blocks(type, op, destination, static_cast<std::size_t>(own), scratch_.data(), size_);
  }

  // destination = block 0 op block 1 op ... op block ranks-1 (count elements each, one
  // after another in blocks), left to right: the one fold of the blocking and the
  // non-blocking exchange, so both give the same bits.
  static void fold_blocks(DataType type, ReduceOp op, void* destination, std::size_t count,
                          const unsigned char* blocks, int ranks) {
    const std::size_t block_bytes = count * data_type_size(type);
    if (block_bytes == 0) return;
    std::memcpy(destination, blocks, block_bytes);
    for (int r = 1; r < ranks; ++r) {
      reduce_elements(type, op, destination, blocks + static_cast<std::size_t>(r) * block_bytes, count);
    }
  }

  // What every non-blocking handle shares: one MPI request, ended once by wait() (within
  // the collective timeout) or a test() that finds it done, after which finish() does
  // the completion's own work. A failure is kept for every later wait and test, as the
  // request is gone either way. It keeps the group's description, name and MPI handle
  // rather than the group, for its messages and the timeout's probe.
  class PendingRequest : public PendingCollective {
   public:
    PendingRequest(const PendingRequest&) = delete;
    PendingRequest& operator=(const PendingRequest&) = delete;

    void wait() override {
      if (!complete_) {
        const mpi_wait::WaitSubject subject{comm_, group_name_, operation_, true, {}};
        complete(mpi_wait::complete_or_abort({&request_, 1}, nullptr, subject), "MPI_Test");
      }
      if (!failure_.empty()) throw Error(failure_);
    }

    bool test() override {
      if (!complete_) {
        int done = 0;
        const int code = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
        if (code == MPI_SUCCESS && done == 0) return false;
        complete(code, "MPI_Test");
      }
      if (!failure_.empty()) throw Error(failure_);
      return true;
    }

   protected:
    PendingRequest(const MpiCommunicator& group, const char* operation)
        : operation_(operation), comm_(group.comm_), group_name_(group.name()), description_(group.describe()) {}

    // For subclasses' destructors, while the buffers MPI uses are still alive (this
    // class's own destructor runs too late for that). Destructors must not throw: a
    // failure is logged, and the request is still never freed while pending (MPI could
    // write the buffers after they are gone).
    void wait_if_dropped() noexcept {
      if (complete_) return;
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized != 0) return;  // MPI ended every request with itself
      try {
        wait();
      } catch (const std::exception& error) {
        log_message(LogLevel::kError, "COMM",
                    str_cat(operation_, " dropped before its wait failed: ", error.what()));
      }
    }

    virtual void finish() {}

    const char* operation_;
    MPI_Request request_ = MPI_REQUEST_NULL;

   private:
    MPI_Comm comm_;
    std::string group_name_;
    void complete(int code, const char* function) {
      complete_ = true;
      if (code != MPI_SUCCESS) {
        failure_ = str_cat(function, " failed in ", operation_, " on ", description_, ": ", mpi_error_string(code));
        return;
      }
      finish();
    }

    std::string description_;
    bool complete_ = false;
    std::string failure_;
  };

  // exchange_and_fold split in two: the constructor starts the exchange (MPI_Ialltoallv
  // into blocks the handle owns, with its own copies of the counts and offsets, which
  // MPI reads until completion) and completion folds into the output. Each start
  // allocates its blocks, as several may be outstanding where the blocking call reuses
  // scratch_.
  class PendingReduceScatter final : public PendingRequest {
   public:
    // After chunks_of: chunks_ holds the caller's chunks.
    PendingReduceScatter(const MpiCommunicator& group, ConstCommBuffer input, CommBuffer output,
                         const char* operation)
        : PendingRequest(group, operation),
          type_(output.type),
          destination_(output.data),
          ranks_(group.size_),
          send_counts_(group.chunks_.counts),
          send_offsets_(group.chunks_.offsets) {
      count_ = static_cast<std::size_t>(
          group.plan_receive(type_, blocks_, receive_counts_, receive_offsets_, operation));
      const MPI_Datatype mpi = mpi_type(type_);
      DUFU_MPI_CHECK(&group, operation, MPI_Ialltoallv, input.data, send_counts_.data(), send_offsets_.data(), mpi,
                     blocks_.data(), receive_counts_.data(), receive_offsets_.data(), mpi, group.comm_, &request_);
    }

    ~PendingReduceScatter() override { wait_if_dropped(); }

   private:
    void finish() override { fold_blocks(type_, ReduceOp::kSum, destination_, count_, blocks_.data(), ranks_); }

    DataType type_;
    void* destination_;
    int ranks_;
    std::size_t count_ = 0;
    std::vector<int> send_counts_;
    std::vector<int> send_offsets_;
    std::vector<int> receive_counts_;
    std::vector<int> receive_offsets_;
    std::vector<unsigned char> blocks_;
  };

  // gather_chunks started: MPI_Iallgatherv straight into the output (in place as the
  // blocking call is), with the handle's own copies of the counts and offsets, which MPI
  // reads until completion. Nothing is left to do when it completes.
  class PendingAllGather final : public PendingRequest {
   public:
    // After chunks_of: chunks_ holds the caller's chunks.
    PendingAllGather(const MpiCommunicator& group, ConstCommBuffer input, CommBuffer output, const char* operation)
        : PendingRequest(group, operation), counts_(group.chunks_.counts), offsets_(group.chunks_.offsets) {
      const MPI_Datatype type = mpi_type(input.type);
      DUFU_MPI_CHECK(&group, operation, MPI_Iallgatherv, group.gather_send_buffer(input, output),
                     counts_[static_cast<std::size_t>(group.rank_)], type, output.data, counts_.data(),
                     offsets_.data(), type, group.comm_, &request_);
    }

    ~PendingAllGather() override { wait_if_dropped(); }

   private:
    std::vector<int> counts_;
    std::vector<int> offsets_;
  };

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = -1;
  // Reused between calls so a training step does not allocate.
  std::vector<unsigned char> scratch_;
  std::vector<int> scratch_counts_;
  std::vector<int> scratch_offsets_;
  Chunks chunks_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  ensure_mpi_started();
  mpi_wait::open_probe_channel();
  MPI_Comm world = MPI_COMM_NULL;
  DUFU_MPI_CHECK(nullptr, "make_mpi_world_communicator", MPI_Comm_dup, MPI_COMM_WORLD, &world);
  return std::make_unique<MpiCommunicator>(world, "world");
}

void abort_all(std::string_view message, int exit_code) {
  const int rank = world_rank_or_minus_one();
  if (rank < 0) return;  // MPI not running: the caller exits on its own
  log_message(LogLevel::kError, "COMM", str_cat("rank ", rank, " is aborting all ranks: ", message));
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace dufu
