// CPU matmul (the linear layers) on OpenBLAS sgemm.
//
// Threading: OpenBLAS is single-threaded (cpu_backend.h) and each product is cut
// into per-thread blocks of output rows or columns that OpenMP threads hand to
// sgemm, so one pool owns the cores. Results are bitwise repeatable for a given
// thread count; across thread counts they can differ in rounding, since OpenBLAS
// picks its kernel (e.g. a small-matrix one) from the block size.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>

#include "cpu_kernels.h"

namespace dufu::trainer::cpu {

void use_single_threaded_blas() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

namespace {

// The granularity of a block cut: a multiple of OpenBLAS's sgemm micro-tiles, so a
// split adds no ragged edge that would run below full speed.
constexpr int kBlockAlign = 16;
// dbias is a column sum; threads own blocks of columns (see embedding.cc).
constexpr int kColumnBlock = 64;

// C's rows [row_begin, row_end), columns [col_begin, col_end), as `kept` keeps them.
void keep_block(TensorOut kept, int ldc, int row_begin, int row_end, int col_begin, int col_end) {
  if (!kept.bf16()) return;
  for (int m = row_begin; m < row_end; ++m) {
    keep_row(kept, static_cast<std::size_t>(m) * ldc + col_begin, col_end - col_begin);
  }
}

// Row-major C[M, N] = alpha · op(A)[M, K] · op(B)[K, N] + beta · C, split over the
// larger output dimension across the OpenMP threads. A bf16-kept C (kept.values is
// C) is rounded block by block, each thread its own block right after its product.
void parallel_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc, TensorOut kept = {}) {
  use_single_threaded_blas();
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  const bool split_rows = M >= N;
  const int extent = split_rows ? M : N;
  const int max_parts = (extent + kBlockAlign - 1) / kBlockAlign;
  const int parts = std::max(1, std::min(omp_get_max_threads(), max_parts));
  if (parts == 1) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    keep_block(kept, ldc, 0, M, 0, N);
    return;
  }
  const int units = max_parts;  // in blocks of kBlockAlign
#pragma omp parallel for num_threads(parts) schedule(static)
  for (int part = 0; part < parts; ++part) {
    const int begin = std::min(extent, static_cast<int>(static_cast<long long>(units) * part / parts) * kBlockAlign);
    const int end =
        std::min(extent, static_cast<int>(static_cast<long long>(units) * (part + 1) / parts) * kBlockAlign);
    if (begin >= end) continue;
    if (split_rows) {
      // Rows of C are rows of op(A).
      const float* a = trans_a ? A + begin : A + static_cast<std::size_t>(begin) * lda;
      cblas_sgemm(CblasRowMajor, ta, tb, end - begin, N, K, alpha, a, lda, B, ldb, beta,
                  C + static_cast<std::size_t>(begin) * ldc, ldc);
      keep_block(kept, ldc, begin, end, 0, N);
    } else {
      // Columns of C are columns of op(B).
      const float* b = trans_b ? B + static_cast<std::size_t>(begin) * ldb : B + begin;
      cblas_sgemm(CblasRowMajor, ta, tb, M, end - begin, K, alpha, A, lda, b, ldb, beta, C + begin, ldc);
      keep_block(kept, ldc, 0, M, begin, end);
    }
  }
}

}  // namespace

void matmul_forward(TensorOut kept, TensorIn x_in, TensorIn weight_in, const float* bias, int N, int C, int OC) {
  float* out = kept.values;
  const FloatOperands operands("matmul_forward", x_in, weight_in, N, C, OC);
  float beta = 0.0f;
  if (bias != nullptr) {
    // Start from the bias and let sgemm add onto it: one pass over out instead of two.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + static_cast<std::size_t>(n) * OC);
    beta = 1.0f;
  }
  parallel_sgemm(false, true, N, OC, C, 1.0f, operands.x, C, operands.weight, C, beta, out, OC, kept);
}

// dout's values: exact under bf16 too (bf16 bits stand for these floats), so its bits
// are not read.
void matmul_backward(TensorOut dx, float* dweight, float* dbias, KeptIn kept_dout, TensorIn x_in, TensorIn weight_in,
                     int N, int C, int OC) {
  const float* dout = kept_dout.values;
  const FloatOperands operands("matmul_backward", x_in, weight_in, N, C, OC);
  if (dx.values != nullptr) {
    parallel_sgemm(false, false, N, C, OC, 1.0f, dout, OC, operands.weight, C, 0.0f, dx.values, C, dx);
  }
  parallel_sgemm(true, false, OC, C, N, 1.0f, dout, OC, operands.x, C, 1.0f, dweight, C);
  if (dbias != nullptr) {
    const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; ++block) {
      const int o0 = block * kColumnBlock;
      const int width = std::min(kColumnBlock, OC - o0);
      double sum[kColumnBlock] = {};
      for (int n = 0; n < N; ++n) {
        const float* d = dout + static_cast<std::size_t>(n) * OC + o0;
        for (int j = 0; j < width; ++j) sum[j] += d[j];
      }
      for (int j = 0; j < width; ++j) dbias[o0 + j] += static_cast<float>(sum[j]);
    }
  }
}

}  // namespace dufu::trainer::cpu
