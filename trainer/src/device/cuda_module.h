// The entry point of the CUDA device module (libdufu_cuda.so), which dufu_trainer
// loads with dlopen the first time a CUDA device is asked for. Both sides compile this
// header, so the struct is the contract between them.
#pragma once

#include <cstddef>

#include "dufu/common/communicator.h"  // DataType, ReduceOp: plain enums, no code of dufu_common
#include "dufu/common/log.h"           // LogLevel
#include "dufu/trainer/device/device.h"

namespace dufu::trainer {

// --- NCCL (src/cuda/nccl_collectives.cu): plain functions, because the module does not
// link dufu_common and so cannot hold a Communicator; NcclCommunicator
// (src/parallel/nccl_communicator.cc, in dufu_trainer) is built on them. Every call enqueues on
// the CUDA device's stream, so collectives are ordered with the kernels, and returns;
// failures throw dufu::Error naming the NCCL call (DUFU_NCCL_CHECK). NCCL's library is
// not linked: library() loads it (dlopen "libnccl.so.2") the first time a group of
// several GPUs asks, and every other entry needs it loaded.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;  // sizeof(ncclUniqueId), checked in the module
struct CudaNccl {
  // Whether NCCL's library loads here, or why not (naming the library); loads it once.
  DeviceAvailability (*library)();
  // A fresh ncclUniqueId, written as kNcclUniqueIdBytes bytes (made on one rank, sent to the others).
  void (*unique_id)(unsigned char* id);
  // Bounds every wait of the device on its stream while communicators exist: after
  // `seconds` every communicator is aborted and the wait throws, naming `source` (the
  // setting to raise). A silent peer (stopped, its GPU hung) raises no asynchronous
  // error, so without it the wait would never end.
  void (*set_timeout)(double seconds, const char* source);
  // ncclCommInitRank on the CUDA device; returns the ncclComm_t. While communicators
  // exist, every wait of the device on its stream checks their asynchronous errors
  // (ncclCommGetAsyncError): one that failed (a peer died) is aborted and the wait
  // throws naming NCCL's error, instead of waiting forever.
  void* (*init_rank)(const unsigned char* id, int ranks, int rank);
  void (*destroy)(void* comm) noexcept;
  // ncclGroupStart / ncclGroupEnd around grouped sends and receives.
  void (*group_start)();
  void (*group_end)();
  // The calls below enqueue on `stream` (from make_stream), or on the device's own
  // stream when it is nullptr.
  void (*send)(void* comm, const void* data, std::size_t count, DataType type, int peer, void* stream);
  void (*recv)(void* comm, void* data, std::size_t count, DataType type, int peer, void* stream);
  // ncclAllGather of `count` elements per rank (in place when input is output's slice).
  void (*all_gather)(void* comm, const void* input, void* output, std::size_t count, DataType type, void* stream);
  void (*broadcast)(void* comm, void* data, std::size_t count, DataType type, int root, void* stream);
  // destination[i] = blocks[i] op blocks[stride + i] op ... over `ranks` blocks, the
  // left fold of collective_fold.h, for i < count, by a device kernel.
  void (*fold)(void* destination, const void* blocks, std::size_t stride, std::size_t count, int ranks,
               DataType type, ReduceOp op, void* stream);
  // A stream of its own on the process's GPU (cudaStreamNonBlocking), and its end.
  void* (*make_stream)();
  void (*destroy_stream)(void* stream) noexcept;
  // Events (cudaEvent_t, no timing): record marks the work enqueued on `stream` so far;
  // stream_wait makes the work enqueued on `waiting` from now on start after the
  // event's last record (nullptr: the device's stream, for both); event_done says
  // whether that work has finished (cudaEventQuery), without blocking.
  void* (*make_event)();
  void (*destroy_event)(void* event) noexcept;
  void (*record)(void* event, void* stream);
  void (*stream_wait)(void* waiting, void* event);
  bool (*event_done)(void* event);
};
// --- end NCCL

struct CudaModule {
  // Whether a CUDA device can be used here (the driver answers and has a GPU).
  DeviceAvailability (*availability)();
  // The process's CUDA device; only after availability() said yes.
  Device& (*device)();
  // GPUs the driver sees; only after availability() said yes.
  int (*device_count)();
  // Makes `ordinal` (device.h's choose_gpu) the process's GPU; before device() is first
  // used, or again with the same ordinal. Throws dufu::Error naming both ordinals when
  // another was chosen.
  void (*select_device)(int ordinal);
  // The NCCL entries, or nullptr when the module was built without NCCL.
  const CudaNccl* nccl;
  // For MFU on a GPU: FLOP/s of a bf16 GEMM [rows, inner] x [inner, cols] through
  // cuBLASLt, measured over about `seconds`.
  double (*bf16_gemm_flops)(int rows, int inner, int cols, double seconds);
  // Whether `pointer` is GPU memory (cudaMalloc'ed or managed) rather than the host's.
  bool (*is_device_memory)(const void* pointer);
  // Where the module's own lines go (device.cc passes this process's log at load).
  void (*set_log)(void (*log)(LogLevel level, const char* subsystem, const char* message));
};

using CudaModuleEntry = const CudaModule* (*)();
inline constexpr const char* kCudaModuleEntry = "dufu_cuda_module";

// dufu_trainer's side (device.cc): the loaded module, or nullptr with the reason.
const CudaModule* loaded_cuda_module(std::string* reason);

}  // namespace dufu::trainer
