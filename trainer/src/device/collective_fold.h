// The per-element math of a deterministic reduction: the left fold over ranks in rank
// order, ((x0 op x1) op x2) ..., that every Communicator backend computes for its sums
// and maxima (common/include/dufu/common/communicator.h). The MPI backend folds on the
// CPU (Communicator::reduce_elements); the NCCL backend folds the blocks its all-to-all
// gathered with a device kernel (src/cuda/nccl_collectives.cu) that calls these
// functions, so a CPU test holds them against a naive loop and against the MPI
// backend's results, bit for bit. Only inline, dependency-free functions belong here.
#pragma once

#include <cstddef>
#include <type_traits>

#include "device/kernel_math.h"  // DUFU_HOST_DEVICE

namespace dufu::trainer {

// accumulator + x; integers wrap around (through unsigned arithmetic) instead of
// overflowing, as the CPU backends do.
template <typename T>
DUFU_HOST_DEVICE inline T fold_sum(T accumulator, T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return accumulator + x;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(accumulator) + static_cast<U>(x)));
  }
}

// The larger of the two; a NaN operand wins, and once the accumulator is NaN it stays
// (x != x is NaN's test that needs no <cmath> on the device). The same branch as the
// CPU backends' reduction, so even the NaN that survives is the same one.
template <typename T>
DUFU_HOST_DEVICE inline T fold_max(T accumulator, T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return (x != x || x > accumulator) ? x : accumulator;
  } else {
    return x > accumulator ? x : accumulator;
  }
}

// Element i of the fold over `ranks` blocks laid one after another, `stride` elements
// apart: blocks[i] op blocks[stride + i] op ... op blocks[(ranks - 1) * stride + i].
template <typename T>
DUFU_HOST_DEVICE inline T fold_element(const T* blocks, std::size_t stride, int ranks, std::size_t i, bool is_max) {
  T accumulator = blocks[i];
  for (int r = 1; r < ranks; ++r) {
    const T x = blocks[static_cast<std::size_t>(r) * stride + i];
    accumulator = is_max ? fold_max(accumulator, x) : fold_sum(accumulator, x);
  }
  return accumulator;
}

// The chunk of rank r when n elements are cut into `ranks` equal chunks of
// ceil(n / ranks) (the last ones shorter or empty): the NCCL all-reduce hands rank r
// chunk r of every rank's data to fold, then gathers the folded chunks.
struct FoldChunk {
  std::size_t begin;
  std::size_t count;
};
DUFU_HOST_DEVICE inline std::size_t fold_chunk_stride(std::size_t n, int ranks) {
  return (n + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
}
DUFU_HOST_DEVICE inline FoldChunk fold_chunk(std::size_t n, int ranks, int r) {
  const std::size_t stride = fold_chunk_stride(n, ranks);
  const std::size_t begin = static_cast<std::size_t>(r) * stride;
  if (begin >= n) return {n, 0};
  return {begin, n - begin < stride ? n - begin : stride};
}

}  // namespace dufu::trainer
