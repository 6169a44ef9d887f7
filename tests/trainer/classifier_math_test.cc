// The one-pass row statistics of the CUDA classifier (device/classifier_math.h) on the
// host: the online maximum and sum of exponentials folded tile by tile and merged part
// by part, against a naive two-pass computation in double (the maximum, then the sum),
// and the whole classifier as the CUDA kernel orders it (256 threads reading 4 logits
// at a time, warp butterflies, warps merged in order) against the double reference
// at GPT-2's vocabulary.
#include "device/classifier_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "kernel_reference.h"
#include "kernel_test_support.h"

namespace dufu::trainer {
namespace {

using testing::random_floats;
using testing::widen;

struct Exact {
  double max, sum;
};

// The two passes the online recurrence replaces: the maximum, then sum exp(x - max).
Exact two_pass(const std::vector<float>& row) {
  const double max = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (const float x : row) sum += std::exp(static_cast<double>(x) - max);
  return {max, sum};
}

OnlineSoftmax fold_tiles(const std::vector<float>& row, std::size_t tile) {
  OnlineSoftmax state = online_softmax_start();
  for (std::size_t begin = 0; begin < row.size(); begin += tile) {
    const std::size_t count = std::min(tile, row.size() - begin);
    online_softmax_add_tile(state, row.data() + begin, static_cast<int>(count));
  }
  return state;
}

// The same fold with the rescale left out: the sum keeps each tile's weights relative
// to the maximum of its own time. What the tests below must tell apart.
OnlineSoftmax fold_tiles_without_rescale(const std::vector<float>& row, std::size_t tile) {
  OnlineSoftmax state = online_softmax_start();
  for (std::size_t begin = 0; begin < row.size(); begin += tile) {
    const std::size_t end = std::min(row.size(), begin + tile);
    state.max = std::max(state.max, *std::max_element(row.begin() + begin, row.begin() + end));
    for (std::size_t j = begin; j < end; ++j) state.sum += exp_approx(row[j] - state.max);
  }
  return state;
}

// The same maximum exactly, the sum and log(sum) + max (the loss's part) to float
// precision over the row's length.
void expect_matches(const OnlineSoftmax& got, const Exact& want, const char* what) {
  EXPECT_EQ(got.max, static_cast<float>(want.max)) << what;
  EXPECT_NEAR(got.sum, want.sum, 2e-6 * want.sum) << what;
  EXPECT_NEAR(std::log(static_cast<double>(got.sum)) + got.max, std::log(want.sum) + want.max, 2e-6) << what;
}

// Each tile's maximum is larger than every earlier one (the logits rise by 5 per
// tile): every tile must shrink the sum so far by exp(m_old - m_new).
TEST(ClassifierOnlineSoftmax, FoldsTilesWhoseMaximumGrows) {
  const std::size_t tile = 4;
  std::vector<float> row = random_floats(64, 11, -1.0f, 1.0f);
  for (std::size_t j = 0; j < row.size(); ++j) row[j] += 5.0f * static_cast<float>(j / tile);
  const Exact want = two_pass(row);
  expect_matches(fold_tiles(row, tile), want, "rising tiles");
  expect_matches(fold_tiles(row, 1), want, "one logit per tile");
  expect_matches(fold_tiles(row, 7), want, "tiles across the steps, a ragged last one");
  std::vector<float> falling(row.rbegin(), row.rend());
  expect_matches(fold_tiles(falling, tile), two_pass(falling), "falling tiles (the first holds the maximum)");
  // Without the rescale every earlier tile keeps weights relative to its own maximum
  // (up to e^75 too large), and the sum comes out over 10 times too large.
  const OnlineSoftmax unscaled = fold_tiles_without_rescale(row, tile);
  EXPECT_GT(unscaled.sum - want.sum, 10.0 * want.sum);
}

// A larger maximum in a middle tile only, after and before smaller ones: the rescale
// happens once, and a dropped one is off by far more than the tolerance.
TEST(ClassifierOnlineSoftmax, FoldsALateLargerMaximum) {
  std::vector<float> row = random_floats(40, 12, -2.0f, 2.0f);
  row[21] = 6.0f;
  const Exact want = two_pass(row);
  for (const std::size_t tile : {1, 4, 8, 40}) expect_matches(fold_tiles(row, tile), want, "late maximum");
  EXPECT_GT(std::abs(fold_tiles_without_rescale(row, 4).sum - want.sum), 0.1 * want.sum);
}

TEST(ClassifierOnlineSoftmax, FoldsARowOfEqualLogits) {
  for (const float value : {0.0f, -3.5f, 17.25f}) {
    const std::vector<float> row(1001, value);
    const OnlineSoftmax state = fold_tiles(row, 4);
    EXPECT_EQ(state.max, value);
    EXPECT_EQ(state.sum, 1001.0f);  // every weight exp_approx(0) = 1, every partial sum exact
    EXPECT_NEAR(classifier_loss(state, value), std::log(1001.0), 1e-6);
  }
}

TEST(ClassifierOnlineSoftmax, MergesPartsInEitherOrderToTheSameBits) {
  const std::vector<float> row = random_floats(300, 13, -8.0f, 8.0f);
  const Exact want = two_pass(row);
  for (const std::size_t split : {1, 77, 150, 299}) {
    const OnlineSoftmax a = fold_tiles({row.begin(), row.begin() + split}, 4);
    const OnlineSoftmax b = fold_tiles({row.begin() + split, row.end()}, 4);
    const OnlineSoftmax ab = online_softmax_merge(a, b);
    const OnlineSoftmax ba = online_softmax_merge(b, a);
    expect_matches(ab, want, "two parts merged");
    EXPECT_EQ(std::bit_cast<std::uint32_t>(ab.sum), std::bit_cast<std::uint32_t>(ba.sum)) << split;
    EXPECT_EQ(ab.max, ba.max);
  }
  // A part that saw nothing (a thread past the row's end) changes nothing, either side.
  const OnlineSoftmax whole = fold_tiles(row, 4);
  const OnlineSoftmax empty = online_softmax_start();
  EXPECT_EQ(online_softmax_merge(whole, empty).sum, whole.sum);
  EXPECT_EQ(online_softmax_merge(empty, whole).sum, whole.sum);
  EXPECT_EQ(online_softmax_merge(empty, whole).max, whole.max);
  EXPECT_EQ(online_softmax_merge(empty, empty).sum, 0.0f);
}

// ---- the CUDA kernel's order, replayed on the host ----------------------------------

constexpr int kThreads = 256;  // classifier.cu's kBlock
constexpr int kWarp = 32;
constexpr int kGroup = 4;  // float4 loads

// One row as classifier_kernel<4> forms its statistics: thread t folds groups t,
// t + 256, ... (the group straddling V logit by logit), each warp merges by a
// butterfly (every lane merges with lane ^ offset, offsets 16 .. 1), then the warps'
// states merge in warp order.
OnlineSoftmax kernel_order_statistics(const float* row, int V) {
  std::array<OnlineSoftmax, kThreads> state;
  state.fill(online_softmax_start());
  const int groups = (V + kGroup - 1) / kGroup;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = t; i < groups; i += kThreads) {
      const int real = V - i * kGroup;
      if (real >= kGroup) {
        online_softmax_add_tile(state[t], row + i * kGroup, kGroup);
      } else {
        for (int k = 0; k < real; ++k) online_softmax_add_tile(state[t], row + i * kGroup + k, 1);
      }
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const std::array<OnlineSoftmax, kThreads> before = state;
    for (int t = 0; t < kThreads; ++t) state[t] = online_softmax_merge(before[t], before[t ^ offset]);
  }
  for (int t = 0; t < kThreads; ++t) {  // the butterfly leaves every lane the same bits
    EXPECT_EQ(std::bit_cast<std::uint32_t>(state[t].sum), std::bit_cast<std::uint32_t>(state[t - t % kWarp].sum));
  }
  OnlineSoftmax total = state[0];
  for (int w = 1; w < kThreads / kWarp; ++w) total = online_softmax_merge(total, state[w * kWarp]);
  return total;
}

// GPT-2's vocabulary padded as the model pads it (V % 4 = 1, so the last real group
// straddles V), rows of logits in [-4, 4] with one row spiking late and one flat,
// against kernel_reference.h's double classifier, at kernels_test's tolerances.
TEST(ClassifierOnlineSoftmax, KernelOrderMatchesTheDoubleReferenceAtGpt2Vocabulary) {
  const int V = 50257, Vp = 50304, N = 3;
  std::vector<float> logits = random_floats(static_cast<std::size_t>(N) * Vp, 14, -4.0f, 4.0f);
  logits[static_cast<std::size_t>(0) * Vp + 50000] = 12.0f;                     // a late maximum
  std::fill_n(logits.begin() + static_cast<std::ptrdiff_t>(2) * Vp, Vp, 0.5f);  // a flat row
  const std::vector<std::int32_t> targets = {17, 50256, 3};
  const float scale = 1.0f / N;
  std::vector<double> losses, dlogits;
  reference::classifier_losses(losses, widen(logits), targets, N, V, Vp);
  reference::classifier_grad(dlogits, widen(logits), targets, scale, N, V, Vp);
  for (int n = 0; n < N; ++n) {
    const float* row = logits.data() + static_cast<std::size_t>(n) * Vp;
    const OnlineSoftmax total = kernel_order_statistics(row, V);
    EXPECT_NEAR(classifier_loss(total, row[targets[n]]), losses[n], 1e-6 + 2e-5 * losses[n]) << "row " << n;
    const float grad_scale = scale / total.sum;
    double worst = 0.0;
    for (int i = 0; i < V; ++i) {
      const double got = classifier_grad(total, row[i], grad_scale, i == targets[n], scale);
      const double want = dlogits[static_cast<std::size_t>(n) * Vp + i];
      worst = std::max(worst, std::abs(got - want) / (1e-6 + 2e-5 * std::abs(want)));
    }
    std::printf("  kernel order, row %d: loss error %.2e, worst gradient error %.3f of the tolerance\n", n,
                std::abs(classifier_loss(total, row[targets[n]]) - losses[n]), worst);
    EXPECT_LE(worst, 1.0) << "row " << n << ": the worst gradient error in units of the tolerance";
  }
}

}  // namespace
}  // namespace dufu::trainer
