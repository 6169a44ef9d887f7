// The GEMMs of causal attention, in cuBLAS's column-major terms: the CUDA attention
// (llm.c's recipe: batched GEMMs for the scores and the weighted values, one fused
// kernel per row for the masked softmax) issues exactly these, so the part of it that
// is easy to get wrong, the transposes, leading dimensions, offsets and batch strides,
// is plain host arithmetic that a CPU test replays with a naive GEMM against the
// reference attention.
//
// Layouts (row-major, as the kernel table has them): qkv [B, T, 3C] with q, k, v of
// head h in columns h hs .. h hs + hs - 1 of each C-wide part; out and dout [B, T, C];
// att and the scratch [B, NH, T, T]. A row-major [rows, cols] matrix with row stride
// ld is, to cuBLAS, a column-major [cols, rows] matrix with leading dimension ld, so a
// row-major product X = A B is issued as X^T = B^T A^T. Each GEMM covers the NH heads
// of one sequence b (the heads of q are hs apart, the sequences T 3C apart: no single
// batch stride spans both), so a call is one strided-batched GEMM per sequence.
#pragma once

#include <cmath>
#include <cstddef>

namespace dufu::trainer {

// Which of the attention's buffers a GEMM operand lives in.
enum class AttentionBuffer { kQkv, kAtt, kOut, kDout, kScratch, kDqkv };

struct GemmOperand {
  AttentionBuffer buffer;
  std::size_t offset;  // in floats, from the buffer's start, of batch entry 0
  int ld;              // leading dimension (column-major)
  long long stride;    // floats between batch entries
};

// C = alpha op(A) op(B) + beta C, column-major, op(X) = X^T when transposed: the
// arguments of cublasSgemmStridedBatched.
struct StridedBatchedGemm {
  bool transpose_a;
  bool transpose_b;
  int m, n, k;
  float alpha, beta;
  GemmOperand a, b, c;
  int batch_count;
};

struct AttentionShape {
  int T, C, NH;
  int head_size() const { return C / NH; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_size())); }
  // Where head 0 of q (part 0), k (1) or v (2) of sequence b starts in qkv or dqkv.
  std::size_t qkv_offset(int b, int part) const {
    return static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(part) * C;
  }
  std::size_t out_offset(int b) const { return static_cast<std::size_t>(b) * T * C; }
  std::size_t att_offset(int b) const { return static_cast<std::size_t>(b) * NH * T * T; }
};

namespace attention_gemm_detail {
inline GemmOperand qkv_part(AttentionBuffer buffer, const AttentionShape& s, int b, int part) {
  return {.buffer = buffer, .offset = s.qkv_offset(b, part), .ld = 3 * s.C, .stride = s.head_size()};
}
inline GemmOperand rows_of_c(AttentionBuffer buffer, const AttentionShape& s, int b) {
  return {.buffer = buffer, .offset = s.out_offset(b), .ld = s.C, .stride = s.head_size()};
}
inline GemmOperand square(AttentionBuffer buffer, const AttentionShape& s, int b) {
  return {.buffer = buffer, .offset = s.att_offset(b), .ld = s.T, .stride = static_cast<long long>(s.T) * s.T};
}
}  // namespace attention_gemm_detail

// att[t, j] = scale q_t · k_j for every (t, j), the masked half included (the softmax
// kernel then masks): att^T = K Q^T, i.e. m = n = T, k = hs, A = K' transposed.
inline StridedBatchedGemm attention_scores_gemm(const AttentionShape& s, int b) {
  using namespace attention_gemm_detail;
  return {.transpose_a = true,
          .transpose_b = false,
          .m = s.T,
          .n = s.T,
          .k = s.head_size(),
          .alpha = s.scale(),
          .beta = 0.0f,
          .a = qkv_part(AttentionBuffer::kQkv, s, b, 1),
          .b = qkv_part(AttentionBuffer::kQkv, s, b, 0),
          .c = square(AttentionBuffer::kAtt, s, b),
          .batch_count = s.NH};
}

// out = att V (att zero above the diagonal): out^T = V^T att^T.
inline StridedBatchedGemm attention_values_gemm(const AttentionShape& s, int b) {
  using namespace attention_gemm_detail;
  return {.transpose_a = false,
          .transpose_b = false,
          .m = s.head_size(),
          .n = s.T,
          .k = s.T,
          .alpha = 1.0f,
          .beta = 0.0f,
          .a = qkv_part(AttentionBuffer::kQkv, s, b, 2),
          .b = square(AttentionBuffer::kAtt, s, b),
          .c = rows_of_c(AttentionBuffer::kOut, s, b),
          .batch_count = s.NH};
}

// Backward, into the scratch: datt = dout V^T; datt^T = V dout^T.
inline StridedBatchedGemm attention_datt_gemm(const AttentionShape& s, int b) {
  using namespace attention_gemm_detail;
  return {.transpose_a = true,
          .transpose_b = false,
          .m = s.T,
          .n = s.T,
          .k = s.head_size(),
          .alpha = 1.0f,
          .beta = 0.0f,
          .a = qkv_part(AttentionBuffer::kQkv, s, b, 2),
          .b = rows_of_c(AttentionBuffer::kDout, s, b),
          .c = square(AttentionBuffer::kScratch, s, b),
          .batch_count = s.NH};
}

// dv = att^T dout; dv^T = dout^T att.
inline StridedBatchedGemm attention_dv_gemm(const AttentionShape& s, int b) {
  using namespace attention_gemm_detail;
  return {.transpose_a = false,
          .transpose_b = true,
          .m = s.head_size(),
          .n = s.T,
          .k = s.T,
          .alpha = 1.0f,
          .beta = 0.0f,
          .a = rows_of_c(AttentionBuffer::kDout, s, b),
          .b = square(AttentionBuffer::kAtt, s, b),
          .c = qkv_part(AttentionBuffer::kDqkv, s, b, 2),
          .batch_count = s.NH};
}

// The scratch holds dscores (the softmax backward's output, zero above the diagonal):
// dq = scale dscores K; dq^T = K^T dscores^T.
inline StridedBatchedGemm attention_dq_gemm(const AttentionShape& s, int b) {
  using namespace attention_gemm_detail;
  return {.transpose_a = false,
          .transpose_b = false,
          .m = s.head_size(),
          .n = s.T,
          .k = s.T,
          .alpha = s.scale(),
          .beta = 0.0f,
          .a = qkv_part(AttentionBuffer::kQkv, s, b, 1),
          .b = square(AttentionBuffer::kScratch, s, b),
          .c = qkv_part(AttentionBuffer::kDqkv, s, b, 0),
          .batch_count = s.NH};
}

// dk = scale dscores^T Q; dk^T = Q^T dscores.
inline StridedBatchedGemm attention_dk_gemm(const AttentionShape& s, int b) {
  using namespace attention_gemm_detail;
  return {.transpose_a = false,
          .transpose_b = true,
          .m = s.head_size(),
          .n = s.T,
          .k = s.T,
          .alpha = s.scale(),
          .beta = 0.0f,
          .a = qkv_part(AttentionBuffer::kQkv, s, b, 0),
          .b = square(AttentionBuffer::kScratch, s, b),
          .c = qkv_part(AttentionBuffer::kDqkv, s, b, 1),
          .batch_count = s.NH};
}

}  // namespace dufu::trainer
