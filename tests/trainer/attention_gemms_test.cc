// The CUDA attention's GEMM arguments (attention_gemms.h), replayed on the CPU: a naive
// column-major strided-batched GEMM with cuBLAS's semantics runs each planned GEMM, a
// naive masked softmax (and its backward) runs between them in the order the CUDA
// attention issues them, and the result must be the double-precision reference
// attention (kernel_reference.h). A wrong transpose, leading dimension, offset or
// batch stride in the plans shows up here, without a GPU.
#include "dufu/trainer/device/attention_gemms.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <vector>

#include "kernel_reference.h"

namespace dufu::trainer {
namespace {

using Vec = std::vector<double>;

struct Buffers {
  Vec qkv, att, out, dout, scratch, dqkv;
  Vec& operator[](AttentionBuffer buffer) {
    switch (buffer) {
      case AttentionBuffer::kQkv:
        return qkv;
      case AttentionBuffer::kAtt:
        return att;
      case AttentionBuffer::kOut:
        return out;
      case AttentionBuffer::kDout:
        return dout;
      case AttentionBuffer::kScratch:
        return scratch;
      case AttentionBuffer::kDqkv:
        return dqkv;
    }
    return qkv;
  }
};

// cublasSgemmStridedBatched, naively: for each batch entry p, C_p = alpha op(A_p)
// op(B_p) + beta C_p with column-major X(i, j) = X[i + j ld]. Every element it touches
// is bounds-checked, so a plan reaching past its buffer fails the test too.
void strided_batched_gemm(const StridedBatchedGemm& g, Buffers& buffers) {
  const Vec& a = buffers[g.a.buffer];
  const Vec& b = buffers[g.b.buffer];
  Vec& c = buffers[g.c.buffer];
  auto element = [](const Vec& x, const GemmOperand& operand, int p, int row, int col) {
    const std::size_t index = operand.offset + static_cast<std::size_t>(p) * operand.stride +
                              static_cast<std::size_t>(row) + static_cast<std::size_t>(col) * operand.ld;
    EXPECT_LT(index, x.size());
    return index < x.size() ? x[index] : 0.0;
  };
  for (int p = 0; p < g.batch_count; ++p)
    for (int i = 0; i < g.m; ++i)
      for (int j = 0; j < g.n; ++j) {
        double sum = 0.0;
        for (int l = 0; l < g.k; ++l) {
          const double op_a = g.transpose_a ? element(a, g.a, p, l, i) : element(a, g.a, p, i, l);
          const double op_b = g.transpose_b ? element(b, g.b, p, j, l) : element(b, g.b, p, l, j);
          sum += op_a * op_b;
        }
        const std::size_t index = g.c.offset + static_cast<std::size_t>(p) * g.c.stride + static_cast<std::size_t>(i) +
                                  static_cast<std::size_t>(j) * g.c.ld;
        ASSERT_LT(index, c.size());
        // As in BLAS, beta == 0 means C is not read (it may hold NaN).
        c[index] = g.alpha * sum + (g.beta == 0.0f ? 0.0 : g.beta * c[index]);
      }
}

// What the CUDA row kernels do, one row of T at a time: softmax over 0..t, zeros after.
void causal_softmax_rows(Vec& att, int rows, int T) {
  for (int r = 0; r < rows; ++r) {
    const int t = r % T;
    double* row = &att[static_cast<std::size_t>(r) * T];
    const double max_score = *std::max_element(row, row + t + 1);
    double sum = 0.0;
    for (int j = 0; j <= t; ++j) sum += row[j] = std::exp(row[j] - max_score);
    for (int j = 0; j < T; ++j) row[j] = j <= t ? row[j] / sum : 0.0;
  }
}

void causal_softmax_backward_rows(Vec& dscores, const Vec& att, int rows, int T) {
  for (int r = 0; r < rows; ++r) {
    const int t = r % T;
    const double* row = &att[static_cast<std::size_t>(r) * T];
    double* drow = &dscores[static_cast<std::size_t>(r) * T];
    double total = 0.0;
    for (int j = 0; j <= t; ++j) total += row[j] * drow[j];
    for (int j = 0; j < T; ++j) drow[j] = j <= t ? row[j] * (drow[j] - total) : 0.0;
  }
}

Vec random_values(std::size_t count, std::uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Vec values(count);
  for (double& value : values) value = normal(generator);
  return values;
}

// Garbage where the plans must write everything (NaN propagates through any element
// a GEMM reads before it is written).
Vec poisoned(std::size_t count) { return Vec(count, std::nan("")); }

struct Case {
  int B, T, C, NH;
};

class AttentionGemmsTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGemmsTest, PlannedGemmsComputeTheReferenceAttentionAndItsGradient) {
  const Case s = GetParam();
  const AttentionShape shape{s.T, s.C, s.NH};
  const std::size_t rows = static_cast<std::size_t>(s.B) * s.T;
  Buffers buffers;
  buffers.qkv = random_values(rows * 3 * s.C, 7);
  buffers.dout = random_values(rows * s.C, 11);
  buffers.att = poisoned(rows * s.NH * s.T);
  buffers.out = poisoned(rows * s.C);
  buffers.scratch = poisoned(rows * s.NH * s.T);
  buffers.dqkv = poisoned(rows * 3 * s.C);

  // Forward, in the CUDA attention's order.
  for (int b = 0; b < s.B; ++b) strided_batched_gemm(attention_scores_gemm(shape, b), buffers);
  causal_softmax_rows(buffers.att, s.B * s.NH * s.T, s.T);
  for (int b = 0; b < s.B; ++b) strided_batched_gemm(attention_values_gemm(shape, b), buffers);
  // Backward.
  for (int b = 0; b < s.B; ++b) {
    strided_batched_gemm(attention_datt_gemm(shape, b), buffers);
    strided_batched_gemm(attention_dv_gemm(shape, b), buffers);
  }
  causal_softmax_backward_rows(buffers.scratch, buffers.att, s.B * s.NH * s.T, s.T);
  for (int b = 0; b < s.B; ++b) {
    strided_batched_gemm(attention_dq_gemm(shape, b), buffers);
    strided_batched_gemm(attention_dk_gemm(shape, b), buffers);
  }

  Vec out, att, dqkv;
  reference::attention_forward(out, att, buffers.qkv, s.B, s.T, s.C, s.NH);
  reference::attention_backward(dqkv, buffers.dout, buffers.qkv, s.B, s.T, s.C, s.NH);
  // The plans carry the scale as a float (what cuBLAS gets); 1e-6 covers its rounding.
  auto expect_near = [](const Vec& actual, const Vec& expected, const char* what) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    for (std::size_t i = 0; i < actual.size(); ++i) {
      ASSERT_NEAR(actual[i], expected[i], 1e-6 * (1.0 + std::fabs(expected[i]))) << what << " [" << i << "]";
    }
  };
  expect_near(buffers.att, att, "att");
  expect_near(buffers.out, out, "out");
  expect_near(buffers.dqkv, dqkv, "dqkv");
}

// One sequence and one head; several of each with T > head size; T = 1; T < head
// size; heads of size 1.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGemmsTest,
                         ::testing::Values(Case{1, 4, 4, 1}, Case{3, 7, 12, 3}, Case{2, 1, 8, 2}, Case{2, 3, 16, 2},
                                           Case{2, 5, 4, 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           std::ostringstream name;  // not string +: GCC 12's -Wrestrict misfires on it
                           name << "B" << c.B << "_T" << c.T << "_C" << c.C << "_NH" << c.NH;
                           return name.str();
                         });

}  // namespace
}  // namespace dufu::trainer
