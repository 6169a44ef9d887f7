// The CUDA device's own memory beyond the tensors it is given: cuBLASLt's workspace
// (cuBLAS is handed the same one, as both run on the device's one stream) and the
// grow-only scratch its kernels share (block_reduce.cuh's scratch()). The kernels ask
// scratch() for these sizes and CudaDevice::scratch_bytes reports their maximum over
// a step to the memory plan, from the same functions, so the two cannot drift apart.
// Host arithmetic only, so the CPU tests check it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "device/buffer_carver.h"
#include "dufu/trainer/device/device.h"
#include "device/embedding_buckets.h"
#include "device/kernel_partition.h"

namespace dufu::trainer::cuda {

// cuBLASLt's recommended workspace for Hopper, allocated once with the device's handles.
inline constexpr std::size_t kMatmulWorkspaceBytes = std::size_t{32} << 20;

// sum_of_squares adds its values in chunks of this many, then the chunks in order.
inline constexpr std::size_t kSquaresChunk = std::size_t{1} << 16;

// The partial column sums of a bias gradient over N rows of C columns.
constexpr std::size_t column_sum_scratch_bytes(int N, int C) {
  return static_cast<std::size_t>(row_chunk_count(N)) * static_cast<std::size_t>(C) * sizeof(double);
}
// LayerNorm's dweight and dbias partials over N rows of C.
constexpr std::size_t layernorm_scratch_bytes(int N, int C) { return 2 * column_sum_scratch_bytes(N, C); }
constexpr std::size_t squares_chunk_count(std::size_t n) { return (n + kSquaresChunk - 1) / kSquaresChunk; }
// sum_of_squares's chunk sums and their total.
constexpr std::size_t sum_of_squares_scratch_bytes(std::size_t n) {
  return (squares_chunk_count(n) + 1) * sizeof(double);
}
// The bf16 copy of a bf16-recipe backward's output gradient of `count` elements, for a
// caller that kept no bits of it (the model keeps them: not in a step's plan), or of a
// bias: it precedes the same backward's bias partials in the scratch, which overwrite
// it once the GEMMs reading it are done (stream order).
constexpr std::size_t bf16_copy_scratch_bytes(std::size_t count) {
  return detail::aligned_count<std::uint16_t>(count) * sizeof(std::uint16_t);
}

// The bf16 attention backward's D = dout . out of each row and head ([B, NH, T]
// floats), which its dq kernel writes and its dk/dv kernel reads.
constexpr std::size_t attention_row_dots_scratch_bytes(std::size_t row_heads) {
  return detail::aligned_count<float>(row_heads) * sizeof(float);
}

// The scratch a training step of `shapes` grows to: the largest single request. Under
// bf16 the backward GEMMs read the bits the model kept of their dout, so no copy of it
// is made; a bias's bf16 copy is smaller than its gradient's column sums.
inline std::size_t step_scratch_bytes(const StepShapes& shapes) {
  const int N = static_cast<int>(shapes.rows);
  const auto row_heads = static_cast<std::size_t>(shapes.attention_row_heads);
  std::size_t largest = std::max({layernorm_scratch_bytes(N, static_cast<int>(shapes.width)),
                                  sum_of_squares_scratch_bytes(static_cast<std::size_t>(shapes.parameters)),
                                  embedding_backward_scratch_bytes(static_cast<std::size_t>(shapes.rows)),
                                  attention_row_dots_scratch_bytes(row_heads)});
  for (const MatmulShape& m : shapes.matmuls) {
    const int rows = static_cast<int>(m.rows);
    if (m.bias) largest = std::max(largest, column_sum_scratch_bytes(rows, static_cast<int>(m.outputs)));
  }
  return largest;
}

// All of the device's own memory for a step: the workspace and the scratch.
inline double device_scratch_bytes(const StepShapes& shapes) {
  return static_cast<double>(kMatmulWorkspaceBytes) + static_cast<double>(step_scratch_bytes(shapes));
}

}  // namespace dufu::trainer::cuda
