// The module's NCCL entries (cuda_module.h's CudaNccl): thin wrappers of NCCL calls on
// a given stream, the streams and events that order them against the device's stream,
// and the fold kernel of the deterministic all-reduce. The order of the fold is
// collective_fold.h's, which the CPU tests check, so what runs here is only the launch.
//
// NCCL's library is opened with dlopen("libnccl.so.2") the first time a group of
// several GPUs asks for it, never linked: a run on one GPU, or on a machine without
// NCCL, needs none (tests/trainer/cuda_module_needs_test.py checks the module's
// DT_NEEDED). nccl.h is read at build time for the types only.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "device/cuda_module.h"
#include "dufu/common/error.h"
#include "device/collective_fold.h"
#include "nccl_entries.h"

namespace dufu::trainer::cuda {

void fail_nccl(const char* call, int status, const char* description, const char* last_error, const char* file,
               int line) {
  DUFU_FAIL("NCCL call ", call, " failed at ", file, ":", line, ": ", description, " (status ", status, ")",
            last_error != nullptr && *last_error != '\0' ? str_cat("; last error: ", last_error) : std::string());
}

namespace {

constexpr const char* kNcclLibrary = "libnccl.so.2";

// NCCL's functions, from the library dlopen found.
struct NcclLibrary {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
};

struct NcclLoad {
  NcclLibrary functions;
  std::string failure;  // empty when loaded
};

template <typename Function>
bool find(void* handle, const char* name, Function& function, std::string& failure) {
  function = reinterpret_cast<Function>(::dlsym(handle, name));
  if (function == nullptr && failure.empty()) {
    failure = str_cat("NCCL's library ", kNcclLibrary, " has no ", name, " (NCCL 2.13 or newer is needed)");
  }
  return function != nullptr;
}

const NcclLoad& nccl_load() {
  static const NcclLoad load = [] {
    NcclLoad result;
    // RTLD_LOCAL: NCCL's symbols stay out of the process's namespace.
    void* handle = ::dlopen(kNcclLibrary, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      result.failure = str_cat("cannot load NCCL's library ", kNcclLibrary, ": ", ::dlerror(),
                               "; HINT: install NCCL (libnccl2) or add its directory to LD_LIBRARY_PATH");
      return result;
    }
    NcclLibrary& f = result.functions;
    std::string& failure = result.failure;
    find(handle, "ncclGetUniqueId", f.get_unique_id, failure);
    find(handle, "ncclCommInitRank", f.comm_init_rank, failure);
    find(handle, "ncclCommDestroy", f.comm_destroy, failure);
    find(handle, "ncclCommAbort", f.comm_abort, failure);
    find(handle, "ncclCommGetAsyncError", f.comm_get_async_error, failure);
    find(handle, "ncclGroupStart", f.group_start, failure);
    find(handle, "ncclGroupEnd", f.group_end, failure);
    find(handle, "ncclSend", f.send, failure);
    find(handle, "ncclRecv", f.recv, failure);
    find(handle, "ncclAllGather", f.all_gather, failure);
    find(handle, "ncclBroadcast", f.broadcast, failure);
    find(handle, "ncclGetErrorString", f.get_error_string, failure);
    find(handle, "ncclGetLastError", f.get_last_error, failure);
    return result;
  }();
  return load;
}

DeviceAvailability library() {
  const NcclLoad& load = nccl_load();
  if (!load.failure.empty()) return {false, load.failure};
  return {true, ""};
}

// The loaded library; every entry but library() runs after nccl_availability said yes.
const NcclLibrary& nccl() {
  const NcclLoad& load = nccl_load();
  if (!load.failure.empty()) DUFU_FAIL(load.failure);
  return load.functions;
}

}  // namespace

}  // namespace dufu::trainer::cuda

// ncclGetErrorString's text of the status and ncclGetLastError's account of the last
// failure (thread-local, so the comm is not needed).
#define DUFU_NCCL_CHECK(call)                                                                          \
  do {                                                                                                 \
    const ncclResult_t dufu_nccl_status_ = (call);                                                     \
    if (dufu_nccl_status_ != ncclSuccess) {                                                            \
      ::dufu::trainer::cuda::fail_nccl(#call, static_cast<int>(dufu_nccl_status_),                     \
                                       nccl().get_error_string(dufu_nccl_status_),                     \
                                       nccl().get_last_error(nullptr), __FILE__, __LINE__);            \
    }                                                                                                  \
  } while (false)

namespace dufu::trainer::cuda {

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId changed size");

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
  }
  DUFU_FAIL("NCCL: unknown data type ", static_cast<int>(type));
}

ncclComm_t as_comm(void* comm) { return static_cast<ncclComm_t>(comm); }

// The communicators alive in this process, whose asynchronous errors every wait on the
// stream checks (cuda_kernels.h's wait_for_stream), and those aborted after one.
std::mutex comms_mutex;
std::vector<ncclComm_t> live_comms;
std::vector<ncclComm_t> aborted_comms;

// The stream watcher: a communicator with an asynchronous error (a peer rank died, a
// network failed) is aborted, so its kernels end and the stream can drain, and the
// wait throws.
void check_async_errors() {
  const std::lock_guard lock(comms_mutex);
  for (auto it = live_comms.begin(); it != live_comms.end(); ++it) {
    ncclResult_t async_error = ncclSuccess;
    DUFU_NCCL_CHECK(nccl().comm_get_async_error(*it, &async_error));
    if (async_error == ncclSuccess || async_error == ncclInProgress) continue;
    const std::string last_error = nccl().get_last_error(*it);
    nccl().comm_abort(*it);
    aborted_comms.push_back(*it);
    live_comms.erase(it);
    if (live_comms.empty()) set_stream_watcher(nullptr);
    DUFU_FAIL("an NCCL communicator failed while the device waited for it: ", nccl().get_error_string(async_error),
              last_error.empty() ? std::string() : str_cat(" (", last_error, ")"),
              "; it was aborted. HINT: another rank died or lost its network; its own log says why");
  }
}

// The collective timeout (set_timeout) and the setting the line names.
double timeout_seconds = 0;
std::string timeout_source = "dist.collective_timeout";

// Where a watched wait ends when the collective timeout passes: a stopped or hung peer
// raises no asynchronous error, and its partners' kernels would wait for it forever.
// Every live communicator is aborted, which ends their kernels, so the stream drains
// and the process can exit (the launcher's abort then ends the other ranks).
void abort_after_timeout(double waited_seconds) {
  std::size_t aborted = 0;
  {
    const std::lock_guard lock(comms_mutex);
    for (ncclComm_t comm : live_comms) {
      nccl().comm_abort(comm);
      aborted_comms.push_back(comm);
      ++aborted;
    }
    live_comms.clear();
    set_stream_watcher(nullptr);
  }
  DUFU_FAIL("the GPU waited ", waited_seconds, " s for NCCL collectives, past the collective timeout of ",
            timeout_seconds, " s (", timeout_source, "); ", aborted,
            " communicator(s) aborted. HINT: a rank stopped answering (a stopped process, a hung GPU) or is far "
            "slower than the others; raise ",
            timeout_source, " if a step, a checkpoint or an evaluation legitimately takes that long");
}

void set_timeout(double seconds, const char* source) {
  const std::lock_guard lock(comms_mutex);
  timeout_seconds = seconds;
  timeout_source = source;
  set_stream_wait_bound(seconds, abort_after_timeout);
}

void unique_id(unsigned char* id) {
  ncclUniqueId made;
  DUFU_NCCL_CHECK(nccl().get_unique_id(&made));
  std::memcpy(id, &made, sizeof(made));
}

void* init_rank(const unsigned char* id, int ranks, int rank) {
  ncclUniqueId received;
  std::memcpy(&received, id, sizeof(received));
  device();  // the stream and the GPU choice exist before NCCL binds to the current device
  ncclComm_t comm = nullptr;
  DUFU_NCCL_CHECK(nccl().comm_init_rank(&comm, ranks, received, rank));
  const std::lock_guard lock(comms_mutex);
  live_comms.push_back(comm);
  set_stream_watcher(check_async_errors);
  return comm;
}

void destroy(void* comm) noexcept {
  if (comm == nullptr) return;
  const std::lock_guard lock(comms_mutex);
  const auto aborted = std::find(aborted_comms.begin(), aborted_comms.end(), as_comm(comm));
  if (aborted != aborted_comms.end()) {  // ncclCommAbort freed it
    aborted_comms.erase(aborted);
    return;
  }
  live_comms.erase(std::remove(live_comms.begin(), live_comms.end(), as_comm(comm)), live_comms.end());
  if (live_comms.empty()) set_stream_watcher(nullptr);
  nccl().comm_destroy(as_comm(comm));
}

void group_start() { DUFU_NCCL_CHECK(nccl().group_start()); }
void group_end() { DUFU_NCCL_CHECK(nccl().group_end()); }

// A stream argument of nullptr is the device's own stream.
cudaStream_t as_stream(void* handle) { return handle == nullptr ? stream() : static_cast<cudaStream_t>(handle); }

void send(void* comm, const void* data, std::size_t count, DataType type, int peer, void* on_stream) {
  DUFU_NCCL_CHECK(nccl().send(data, count, nccl_type(type), peer, as_comm(comm), as_stream(on_stream)));
}

void recv(void* comm, void* data, std::size_t count, DataType type, int peer, void* on_stream) {
  DUFU_NCCL_CHECK(nccl().recv(data, count, nccl_type(type), peer, as_comm(comm), as_stream(on_stream)));
}

void all_gather(void* comm, const void* input, void* output, std::size_t count, DataType type, void* on_stream) {
  DUFU_NCCL_CHECK(nccl().all_gather(input, output, count, nccl_type(type), as_comm(comm), as_stream(on_stream)));
}

void broadcast(void* comm, void* data, std::size_t count, DataType type, int root, void* on_stream) {
  DUFU_NCCL_CHECK(nccl().broadcast(data, data, count, nccl_type(type), root, as_comm(comm), as_stream(on_stream)));
}

void* make_stream() {
  device();  // on the process's GPU
  cudaStream_t made = nullptr;
  DUFU_CUDA_CHECK(cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking));
  return made;
}

void destroy_stream(void* handle) noexcept {
  if (handle != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(handle));
}

void* make_event() {
  cudaEvent_t made = nullptr;
  DUFU_CUDA_CHECK(cudaEventCreateWithFlags(&made, cudaEventDisableTiming));
  return made;
}

// cudaEventDestroy of an event whose work is pending is allowed: its resources go
// when the work completes.
void destroy_event(void* event) noexcept {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void record(void* event, void* on_stream) {
  DUFU_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), as_stream(on_stream)));
}

void stream_wait(void* waiting, void* event) {
  DUFU_CUDA_CHECK(cudaStreamWaitEvent(as_stream(waiting), static_cast<cudaEvent_t>(event), 0));
}

bool event_done(void* event) { return DUFU_CUDA_QUERY_DONE(cudaEventQuery(static_cast<cudaEvent_t>(event))); }

template <typename T>
__global__ void fold_kernel(T* destination, const T* blocks, std::size_t stride, std::size_t count, int ranks,
                            bool is_max) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
    destination[i] = fold_element(blocks, stride, ranks, i, is_max);
  }
}

template <typename T>
void launch_fold(void* destination, const void* blocks, std::size_t stride, std::size_t count, int ranks,
                 bool is_max, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  constexpr std::size_t kMaxBlocks = 4096;  // grid-stride beyond: enough to fill any GPU
  const std::size_t wanted = (count + kThreads - 1) / kThreads;
  const unsigned blocks_in_grid = static_cast<unsigned>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
  fold_kernel<T><<<blocks_in_grid, kThreads, 0, stream>>>(static_cast<T*>(destination),
                                                            static_cast<const T*>(blocks), stride, count, ranks,
                                                            is_max);
  DUFU_CUDA_CHECK_LAUNCH();
}

void fold(void* destination, const void* blocks, std::size_t stride, std::size_t count, int ranks, DataType type,
          ReduceOp op, void* on_stream) {
  if (count == 0) return;
  const bool is_max = op == ReduceOp::kMax;
  const cudaStream_t on = as_stream(on_stream);
  switch (type) {
    case DataType::kFloat32: return launch_fold<float>(destination, blocks, stride, count, ranks, is_max, on);
    case DataType::kFloat64: return launch_fold<double>(destination, blocks, stride, count, ranks, is_max, on);
    case DataType::kInt32: return launch_fold<std::int32_t>(destination, blocks, stride, count, ranks, is_max, on);
    case DataType::kInt64: return launch_fold<std::int64_t>(destination, blocks, stride, count, ranks, is_max, on);
    case DataType::kUInt8: return launch_fold<std::uint8_t>(destination, blocks, stride, count, ranks, is_max, on);
  }
  DUFU_FAIL("NCCL fold: unknown data type ", static_cast<int>(type));
}

}  // namespace

const CudaNccl* nccl_entries() {
  static const CudaNccl entries{.library = library,
                                .unique_id = unique_id,
                                .set_timeout = set_timeout,
                                .init_rank = init_rank,
                                .destroy = destroy,
                                .group_start = group_start,
                                .group_end = group_end,
                                .send = send,
                                .recv = recv,
                                .all_gather = all_gather,
                                .broadcast = broadcast,
                                .fold = fold,
                                .make_stream = make_stream,
                                .destroy_stream = destroy_stream,
                                .make_event = make_event,
                                .destroy_event = destroy_event,
                                .record = record,
                                .stream_wait = stream_wait,
                                .event_done = event_done};
  return &entries;
}

}  // namespace dufu::trainer::cuda
