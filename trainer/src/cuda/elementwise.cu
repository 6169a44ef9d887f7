// CUDA element-wise ops, the deterministic column sums and vector reductions: GELU,
// AdamW (one launch over every weight-decay segment), the residual add, scaling, the
// sum of squares, the mean loss. The per-element formulas come from kernel_math.h, the
// same the CPU kernels use.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "device/adamw_segments.h"
#include "device/kernel_math.h"
#include "device/kernel_partition.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr unsigned kBlock = 256;
// Values per partial sum of sum_of_squares, as on the CPU.

__global__ void fill_kernel(float* out, float value, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = value;
}

__global__ void add_kernel(TensorOut out, const float* a, const float* b, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) keep_store(out, i, a[i] + b[i]);
}

__global__ void scale_kernel(float* values, float scale, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) values[i] *= scale;
}

__global__ void bias_gelu_forward_kernel(float* out, float* pre, const float* x, const float* bias, int N, int C) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(N) * C) return;
  const float p = x[i] + bias[i % C];
  pre[i] = p;
  out[i] = gelu_tanh(p);
}

__global__ void gelu_grad_kernel(float* d, const float* pre, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) d[i] *= gelu_tanh_grad(pre[i]);
}

// Every parameter of one segment table (adamw_segments.h); the table stays in the
// kernel's parameter space (__grid_constant__), read by the binary search without a copy.
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v,
                             const __grid_constant__ AdamWSegmentTable table, AdamWStep step, float grad_scale) {
  const std::size_t i = table.begin + blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= table.end[table.count - 1]) return;
  step.decay = table.decay[adamw_segment_of(table, i)];
  adamw_element(params[i], grads[i] * grad_scale, m[i], v[i], step);
}

// Partial sums over one chunk of rows, for each column: thread (chunk, column). The
// loads of kColumnSumRowsInFlight rows are issued together (independent of the sum, so
// they overlap in memory), then added in row order: the same bits as one row at a time.
__global__ void __launch_bounds__(kColumnSumTile) column_partials_kernel(double* partial, const float* x, int N, int C,
                                                                          int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  const int end = row_chunk_begin(N, chunks, chunk + 1);
  const float* column = x + c;
  double sum = 0.0;
  int n = row_chunk_begin(N, chunks, chunk);
  for (; n + kColumnSumRowsInFlight <= end; n += kColumnSumRowsInFlight) {
    float values[kColumnSumRowsInFlight];
#pragma unroll
    for (int k = 0; k < kColumnSumRowsInFlight; ++k) values[k] = column[static_cast<std::size_t>(n + k) * C];
#pragma unroll
    for (int k = 0; k < kColumnSumRowsInFlight; ++k) sum += values[k];
  }
  for (; n < end; ++n) sum += column[static_cast<std::size_t>(n) * C];
  partial[static_cast<std::size_t>(chunk) * C + c] = sum;
}

__global__ void column_finish_kernel(float* out, const double* partial, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double sum = 0.0;
  for (int chunk = 0; chunk < chunks; ++chunk) sum += partial[static_cast<std::size_t>(chunk) * C + c];
  out[c] += static_cast<float>(sum);
}

__global__ void squares_partials_kernel(double* partial, const float* values, std::size_t n) {
  __shared__ double shared[kBlock];
  const std::size_t begin = blockIdx.x * kSquaresChunk;
  const std::size_t end = begin + kSquaresChunk < n ? begin + kSquaresChunk : n;
  double sum = 0.0;
  for (std::size_t i = begin + threadIdx.x; i < end; i += kBlock) sum += static_cast<double>(values[i]) * values[i];
  sum = block_sum<kBlock>(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void ordered_sum_kernel(double* result, const double* partial, std::size_t count) {
  double sum = 0.0;
  for (std::size_t i = 0; i < count; ++i) sum += partial[i];
  *result = sum;
}

__global__ void masked_mean_loss_kernel(float* mean_out, const float* losses, const std::int32_t* targets, int N) {
  __shared__ double sums[kBlock];
  __shared__ double counts[kBlock];
  double sum = 0.0;
  double counted = 0.0;
  for (int i = threadIdx.x; i < N; i += kBlock) {
    if (targets[i] == -1) continue;
    sum += losses[i];
    counted += 1.0;
  }
  sum = block_sum<kBlock>(sum, sums);
  counted = block_sum<kBlock>(counted, counts);
  if (threadIdx.x == 0) *mean_out = counted == 0.0 ? 0.0f : static_cast<float>(sum / counted);
}

}  // namespace

namespace {
void* scratch_memory = nullptr;
std::size_t scratch_bytes_held = 0;
}  // namespace

void* scratch(std::size_t bytes) {
  if (bytes > scratch_bytes_held) {
    wait_for_stream();  // the old scratch may still be in use
    if (scratch_memory != nullptr) DUFU_CUDA_CHECK(cudaFree(scratch_memory));
    scratch_memory = nullptr;
    scratch_bytes_held = 0;
    DUFU_CUDA_CHECK(cudaMalloc(&scratch_memory, bytes));
    scratch_bytes_held = bytes;
  }
  return scratch_memory;
}

std::size_t scratch_capacity() { return scratch_bytes_held; }

void accumulate_column_sums(float* out, const float* x, int N, int C, double* partial) {
  const int chunks = row_chunk_count(N);
  if (C < 1) return;  // nothing to sum (and no grid of zero blocks)
  const dim3 grid(column_sum_tiles(C), static_cast<unsigned>(chunks));
  column_partials_kernel<<<grid, kColumnSumTile, 0, stream()>>>(partial, x, N, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
  column_finish_kernel<<<blocks_for(static_cast<std::size_t>(C), kBlock), kBlock, 0, stream()>>>(out, partial, C,
                                                                                                    chunks);
  DUFU_CUDA_CHECK_LAUNCH();
}

void fill(float* destination, float value, std::size_t count) {
  if (count == 0) return;
  fill_kernel<<<blocks_for(count, kBlock), kBlock, 0, stream()>>>(destination, value, count);
  DUFU_CUDA_CHECK_LAUNCH();
}

void add(TensorOut out, const float* a, const float* b, std::size_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(out, a, b, n);
  DUFU_CUDA_CHECK_LAUNCH();
}

void scale_in_place(float* values, float scale, std::size_t n) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(values, scale, n);
  DUFU_CUDA_CHECK_LAUNCH();
}

void bias_gelu_forward(float* out, float* pre, const float* x, const float* bias, int N, int C) {
  const std::size_t n = static_cast<std::size_t>(N) * C;
  if (n == 0) return;
  bias_gelu_forward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(out, pre, x, bias, N, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

void multiply_by_gelu_grad(float* d, const float* pre, std::size_t n) {
  if (n == 0) return;
  gelu_grad_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(d, pre, n);
  DUFU_CUDA_CHECK_LAUNCH();
}

void adamw_update(float* params, const float* grads, float* m, float* v, std::span<const AdamWSegment> segments,
                  float lr, float beta1, float beta2, float eps, int t, float grad_scale) {
  DUFU_CHECK(t >= 1, "AdamW steps count from 1, got ", t);
  for (std::size_t s = 1; s < segments.size(); ++s) {
    DUFU_CHECK(segments[s - 1].end <= segments[s].end, "adamw_update: segment ", s, " ends at ", segments[s].end,
               ", before the previous one (", segments[s - 1].end, ")");
  }
  // One launch per table of kAdamWTableSegments segments (was one per segment).
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, 0.0f, t);  // decay: per segment
  for (const AdamWSegmentTable& table : adamw_segment_tables(segments, lr, beta1, beta2, eps, t)) {
    const std::size_t count = table.end[table.count - 1] - table.begin;
    adamw_kernel<<<blocks_for(count, kBlock), kBlock, 0, stream()>>>(params, grads, m, v, table, step, grad_scale);
    DUFU_CUDA_CHECK_LAUNCH();
  }
}

double sum_of_squares(const float* values, std::size_t n) {
  if (n == 0) return 0.0;
  const std::size_t chunks = squares_chunk_count(n);
  auto* partial = static_cast<double*>(scratch(sum_of_squares_scratch_bytes(n)));
  squares_partials_kernel<<<static_cast<unsigned>(chunks), kBlock, 0, stream()>>>(partial, values, n);
  DUFU_CUDA_CHECK_LAUNCH();
  ordered_sum_kernel<<<1, 1, 0, stream()>>>(partial + chunks, partial, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  wait_for_stream();  // a pageable copy would wait for the stream without watching it
  DUFU_CUDA_CHECK(cudaMemcpyAsync(&result, partial + chunks, sizeof(double), cudaMemcpyDeviceToHost, stream()));
  wait_for_stream();
  return result;
}

void masked_mean_loss(float* mean_out, const float* losses, const std::int32_t* targets, int N) {
  masked_mean_loss_kernel<<<1, kBlock, 0, stream()>>>(mean_out, losses, targets, N);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
