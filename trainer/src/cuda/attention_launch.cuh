// The launch glue of the CUDA attention kernels, shared by attention.cu (fp32 on the
// CUDA cores) and attention_bf16.cu (bf16 products on the tensor cores): the tile of
// query rows (or keys) a block owns, the head sizes the kernels are compiled for, and
// the launch that refuses, in words, what the GPU would refuse with a bare error.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/common/error.h"
#include "shared_memory_limit.h"

namespace dufu::trainer::cuda {

// Query rows (or keys) a block of either kernel owns, and rows of every tile it walks.
constexpr int kAttentionTile = 64;

// The largest head size the kernels are compiled for: a head size is padded up to
// 32, 64 or 128 (with_head_size).
constexpr int kMaxHeadSize = 128;

// The tiles of kAttentionTile rows that cover T rows.
inline int tiles_of(int T) { return (T + kAttentionTile - 1) / kAttentionTile; }

// Launches kernel on kThreads threads a block with `bytes` of dynamic shared memory,
// after the refusals in words (shared_memory_limit.h): more shared memory than the GPU
// allows a block, more grid rows than CUDA allows. Raises the kernel's limit past the
// default 48 KB first (a per-device setting: set at every launch, a host call of about
// a microsecond).
template <int kThreads, typename Kernel, typename... Args>
void launch_tiles(const char* what, int dims, Kernel kernel, dim3 grid, int bytes, Args... args) {
  require_shared_memory(what, dims, bytes);
  if (const std::string refusal = grid_rows_refusal(what, grid.y); !refusal.empty()) DUFU_FAIL(refusal);
  DUFU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<grid, kThreads, bytes, stream()>>>(args...);
  DUFU_CUDA_CHECK_LAUNCH();
}

// Calls launch.template operator()<kDims>() with the padded head size kDims: hs up to
// 32, 64 or kMaxHeadSize; a larger hs is refused.
template <typename Launch>
void with_head_size(int hs, Launch launch) {
  DUFU_CHECK(hs <= kMaxHeadSize, "CUDA attention supports head sizes up to ", kMaxHeadSize, ", not ", hs);
  if (hs <= 32) {
    launch.template operator()<32>();
  } else if (hs <= 64) {
    launch.template operator()<64>();
  } else {
    launch.template operator()<kMaxHeadSize>();
  }
}

}  // namespace dufu::trainer::cuda
