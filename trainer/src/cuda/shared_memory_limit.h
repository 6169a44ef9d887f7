// Dynamic shared memory past the 48 KB default is opted into per kernel, up to a limit
// of the GPU's: 163 KB on an A100, 227 KB on an H100, but 99 KB on sm_86 and sm_89
// cards (A10, L4, RTX 30xx and 40xx), which run this build's sm_80 code too. A kernel
// asking for more than the limit gets "invalid argument" from cudaFuncSetAttribute;
// this says instead which kernel, how much, and what to do. Host logic, tested on the
// CPU.
#pragma once

#include <string>

#include "dufu/common/error.h"

namespace dufu::trainer::cuda {

// Empty when `bytes` fit `limit` (the GPU's cudaDevAttrMaxSharedMemoryPerBlockOptin),
// else the refusal in words.
inline std::string shared_memory_refusal(const char* kernel, int head_size, int bytes, int limit) {
  if (bytes <= limit) return {};
  return str_cat(kernel, " for a head size padded to ", head_size, " needs ", bytes,
                 " bytes of shared memory per block; this GPU allows ", limit,
                 " (cudaDevAttrMaxSharedMemoryPerBlockOptin); HINT: a model with a smaller head size (d_model / ",
                 "n_head; the kernels pad it to 32, 64 or 128), or a GPU with more shared memory per block ",
                 "(A100, H100)");
}

// The attention kernels run one block row per sequence and head (grid.y = B x heads),
// and CUDA allows at most 65,535 rows: more would fail the launch with "invalid
// configuration argument". Empty when `rows` fit, else the refusal in words.
constexpr long long kMaxGridRows = 65535;
inline std::string grid_rows_refusal(const char* kernel, long long rows) {
  if (rows <= kMaxGridRows) return {};
  return str_cat(kernel, " launches one block row per sequence and head: ", rows, " rows, over CUDA's ",
                 kMaxGridRows, "; HINT: a smaller train.micro_batch (or fewer heads)");
}

}  // namespace dufu::trainer::cuda
