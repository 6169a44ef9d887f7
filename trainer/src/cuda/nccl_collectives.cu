// The module's NCCL entries (cuda_module.h's CudaNccl): thin wrappers of NCCL calls on
// the device's stream, and the fold kernel of the deterministic all-reduce. The order
// of the fold is collective_fold.h's, which the CPU tests check, so what runs here is
// only the launch. Compiled and linked; no GPU has run this file.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_module.h"
#include "dufu/common/error.h"
#include "dufu/trainer/collective_fold.h"
#include "nccl_entries.h"

namespace dufu::trainer::cuda {

void fail_nccl(const char* call, int status, const char* description, const char* last_error, const char* file,
               int line) {
  DUFU_FAIL("NCCL call ", call, " failed at ", file, ":", line, ": ", description, " (status ", status, ")",
            last_error != nullptr && *last_error != '\0' ? str_cat("; last error: ", last_error) : std::string());
}

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

void unique_id(unsigned char* id) {
  ncclUniqueId made;
  DUFU_NCCL_CHECK(ncclGetUniqueId(&made));
  std::memcpy(id, &made, sizeof(made));
}

void* init_rank(const unsigned char* id, int ranks, int rank) {
  ncclUniqueId received;
  std::memcpy(&received, id, sizeof(received));
  device();  // the stream and the GPU choice exist before NCCL binds to the current device
  ncclComm_t comm = nullptr;
  DUFU_NCCL_CHECK(ncclCommInitRank(&comm, ranks, received, rank));
  return comm;
}

void destroy(void* comm) noexcept {
  if (comm != nullptr) ncclCommDestroy(as_comm(comm));
}

void group_start() { DUFU_NCCL_CHECK(ncclGroupStart()); }
void group_end() { DUFU_NCCL_CHECK(ncclGroupEnd()); }

void send(void* comm, const void* data, std::size_t count, DataType type, int peer) {
  DUFU_NCCL_CHECK(ncclSend(data, count, nccl_type(type), peer, as_comm(comm), stream()));
}

void recv(void* comm, void* data, std::size_t count, DataType type, int peer) {
  DUFU_NCCL_CHECK(ncclRecv(data, count, nccl_type(type), peer, as_comm(comm), stream()));
}

void all_gather(void* comm, const void* input, void* output, std::size_t count, DataType type) {
  DUFU_NCCL_CHECK(ncclAllGather(input, output, count, nccl_type(type), as_comm(comm), stream()));
}

void broadcast(void* comm, void* data, std::size_t count, DataType type, int root) {
  DUFU_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(type), root, as_comm(comm), stream()));
}

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
                 bool is_max) {
  constexpr unsigned kThreads = 256;
  constexpr std::size_t kMaxBlocks = 4096;  // grid-stride beyond: enough to fill any GPU
  const std::size_t wanted = (count + kThreads - 1) / kThreads;
  const unsigned blocks_in_grid = static_cast<unsigned>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
  fold_kernel<T><<<blocks_in_grid, kThreads, 0, stream()>>>(static_cast<T*>(destination),
                                                            static_cast<const T*>(blocks), stride, count, ranks,
                                                            is_max);
  DUFU_CUDA_CHECK_LAUNCH();
}

void fold(void* destination, const void* blocks, std::size_t stride, std::size_t count, int ranks, DataType type,
          ReduceOp op) {
  if (count == 0) return;
  const bool is_max = op == ReduceOp::kMax;
  switch (type) {
    case DataType::kFloat32: return launch_fold<float>(destination, blocks, stride, count, ranks, is_max);
    case DataType::kFloat64: return launch_fold<double>(destination, blocks, stride, count, ranks, is_max);
    case DataType::kInt32: return launch_fold<std::int32_t>(destination, blocks, stride, count, ranks, is_max);
    case DataType::kInt64: return launch_fold<std::int64_t>(destination, blocks, stride, count, ranks, is_max);
    case DataType::kUInt8: return launch_fold<std::uint8_t>(destination, blocks, stride, count, ranks, is_max);
  }
  DUFU_FAIL("NCCL fold: unknown data type ", static_cast<int>(type));
}

}  // namespace

const CudaNccl* nccl_entries() {
  static const CudaNccl entries{unique_id, init_rank, destroy,   group_start, group_end,
                                send,      recv,      all_gather, broadcast,  fold};
  return &entries;
}

}  // namespace dufu::trainer::cuda
