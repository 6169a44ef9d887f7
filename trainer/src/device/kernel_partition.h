// How the kernels cut work into pieces whose order fixes the result: the row chunks of
// the deterministic column sums (LayerNorm's dweight and dbias, a matmul's dbias) and
// the launch geometry of the CUDA kernels. Pure integer arithmetic, host and device
// (DUFU_HOST_DEVICE), so the CPU tests check the same functions the GPU launches use.
#pragma once

#include <cstddef>

#include "device/kernel_math.h"

namespace dufu::trainer {

// Column sums over N rows are taken per chunk of rows, each chunk summed in row
// order, and the chunks added in chunk order: the result depends on the chunk count,
// never on how threads or blocks are scheduled. At most kMaxRowChunks chunks, at most
// one per row.
inline constexpr int kMaxRowChunks = 32;

DUFU_HOST_DEVICE constexpr int row_chunk_count(int N) { return N < 1 ? 1 : (N < kMaxRowChunks ? N : kMaxRowChunks); }

// The first row of chunk `chunk` of `chunks` over N rows; chunk == chunks gives N.
// Chunks differ in size by at most one row and none is empty when chunks <= N.
DUFU_HOST_DEVICE constexpr int row_chunk_begin(int N, int chunks, int chunk) {
  return static_cast<int>(static_cast<long long>(N) * chunk / chunks);
}

// Blocks of `block` threads that cover `count` items.
DUFU_HOST_DEVICE constexpr unsigned blocks_for(std::size_t count, unsigned block) {
  return static_cast<unsigned>((count + block - 1) / block);
}

// The CUDA column sums (a matmul's dbias) give each block kColumnSumTile columns of one
// row chunk: narrow tiles so that even C = 768 over 32 chunks makes 384 blocks, more
// than two per SM of an H100's 132 (256-column tiles made 96). Each thread still sums
// its column of its chunk in row order, so the tile width changes no bit.
inline constexpr unsigned kColumnSumTile = 64;
// Rows whose loads one thread issues together before adding them in order.
inline constexpr int kColumnSumRowsInFlight = 8;
DUFU_HOST_DEVICE constexpr unsigned column_sum_tiles(int C) {
  return C < 1 ? 0u : blocks_for(static_cast<std::size_t>(C), kColumnSumTile);
}
DUFU_HOST_DEVICE constexpr std::size_t column_sum_blocks(int N, int C) {
  return static_cast<std::size_t>(column_sum_tiles(C)) * static_cast<std::size_t>(row_chunk_count(N));
}

// The tree of a block reduction over `threads` (a power of two) slots: the partner of
// slot i at step `stride` is i + stride for i < stride. Written out so that the CPU
// test can replay the order in which a block combines its values.
DUFU_HOST_DEVICE constexpr bool reduces_at(int slot, int stride) { return slot < stride; }

}  // namespace dufu::trainer
