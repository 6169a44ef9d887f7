// The flash-style attention: the online-softmax recurrence of
// device/flash_attention.h against the exact softmax, and the tiled kernels of every
// device at T = 1, 7, 64, 1024 and head sizes 32, 64, 128, with multi-head, grouped
// and multi-query K/V heads, against a naive double-precision attention that builds
// each full probability row (no tiles, no running maximum, no lse). The cuda rows
// carry the label gpu and skip without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dufu/common/error.h"
#include "device/bf16.h"
#include "dufu/trainer/device/device.h"
#include "device/flash_attention.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_reference.h"
#include "kernel_test_support.h"

namespace dufu::trainer {
namespace {

using testing::DeviceArgs;
using testing::kNaN;
using testing::kTestDevices;
using testing::random_floats;
using testing::TestDevice;
using testing::Tolerance;
using testing::Vec;
using testing::widen;

// ---- the recurrence, on the host -----------------------------------------------

// Runs a row of scores through online_softmax_* tile by tile, as both kernels do, and
// returns the softmax-weighted sum of `values` and the row's lse.
std::pair<float, float> online_weighted_sum(const std::vector<float>& scores, const std::vector<float>& values,
                                            std::size_t tile) {
  OnlineSoftmax row = online_softmax_start();
  float accumulated = 0.0f;
  for (std::size_t j0 = 0; j0 < scores.size(); j0 += tile) {
    const std::size_t j1 = std::min(scores.size(), j0 + tile);
    const float tile_max = *std::max_element(scores.begin() + j0, scores.begin() + j1);
    accumulated *= online_softmax_rescale(row, tile_max);
    float tile_sum = 0.0f;
    for (std::size_t j = j0; j < j1; ++j) {
      const float w = online_softmax_weight(row, scores[j]);
      tile_sum += w;
      accumulated += w * values[j];
    }
    row.sum += tile_sum;
  }
  return {accumulated / row.sum, online_softmax_lse(row)};
}

std::pair<double, double> exact_weighted_sum(const std::vector<float>& scores, const std::vector<float>& values) {
  const double max_score = *std::max_element(scores.begin(), scores.end());
  double sum = 0.0, weighted = 0.0;
  for (std::size_t j = 0; j < scores.size(); ++j) {
    const double e = std::exp(scores[j] - max_score);
    sum += e;
    weighted += e * values[j];
  }
  return {weighted / sum, max_score + std::log(sum)};
}

// The running maximum grows in every tile (scores rise by 6 per tile), so each tile
// must shrink what came before by exp(m_old - m_new): without the rescale the early
// tiles would keep weights up to e^18 too large and the sum would be far off.
TEST(OnlineSoftmax, MatchesTheExactSoftmaxWhenTheMaximumGrowsAcrossTiles) {
  const std::size_t n = 64, tile = 16;
  std::vector<float> scores = random_floats(n, 7, -1.0f, 1.0f);
  for (std::size_t j = 0; j < n; ++j) scores[j] += 6.0f * static_cast<float>(j / tile);
  const std::vector<float> values = random_floats(n, 8);
  const auto [got, got_lse] = online_weighted_sum(scores, values, tile);
  const auto [want, want_lse] = exact_weighted_sum(scores, values);
  EXPECT_NEAR(got, want, 1e-6 * std::max(1.0, std::abs(want)));
  EXPECT_NEAR(got_lse, want_lse, 1e-6 * std::abs(want_lse));
  // The same row in one tile, and tiles where the maximum falls: the same result.
  EXPECT_NEAR(online_weighted_sum(scores, values, n).first, want, 1e-6);
  std::vector<float> falling(scores.rbegin(), scores.rend()), falling_values(values.rbegin(), values.rend());
  EXPECT_NEAR(online_weighted_sum(falling, falling_values, tile).first, want, 1e-6);
}

TEST(OnlineSoftmax, RescaleFactorIsExpOfTheMaximumsDifference) {
  OnlineSoftmax row = online_softmax_start();
  EXPECT_EQ(online_softmax_rescale(row, 2.0f), 0.0f);  // nothing accumulated yet
  row.sum = 3.0f;
  EXPECT_EQ(online_softmax_rescale(row, 1.0f), 1.0f);  // the maximum does not grow
  EXPECT_EQ(row.max, 2.0f);
  const float factor = online_softmax_rescale(row, 5.0f);
  EXPECT_NEAR(factor, std::exp(-3.0), 1e-7);
  EXPECT_NEAR(row.sum, 3.0 * std::exp(-3.0), 1e-7);
  EXPECT_EQ(row.max, 5.0f);
  // lse = 5 + log(3 e^-3), so the score 5 has probability e^3 / 3.
  EXPECT_NEAR(flash_probability(5.0f, online_softmax_lse(row)), std::exp(3.0) / 3.0, 1e-5);
}

// ---- the kernels against a naive reference ---------------------------------------

struct AttentionShape {
  int B, T, NH, NKV, hs;
  reference::AttentionHeads heads() const { return {NH, NKV, hs}; }
  std::size_t tokens() const { return static_cast<std::size_t>(B) * T; }
};
void PrintTo(const AttentionShape& s, std::ostream* os) {
  *os << "B" << s.B << "_T" << s.T << "_NH" << s.NH << "_NKV" << s.NKV << "_hs" << s.hs;
}

// The head sizes GPT models use, at T = 1 (one key), 7 (less than a tile), 64 (one
// CPU query block) and 1024 (many tiles on every device; few heads, so the double
// reference stays fast); multi-head (NKV = NH), and the Llama family's grouped heads:
// 8 query heads over 2 K/V heads and over 1 (multi-query), and multi-query over
// several tiles at T = 320 (a group's K/V tiles reused across its query heads).
std::vector<AttentionShape> attention_shapes() {
  std::vector<AttentionShape> shapes;
  for (const int hs : {32, 64, 128}) {
    for (const int T : {1, 7, 64}) shapes.push_back({2, T, 2, 2, hs});
    shapes.push_back({1, 1024, 1, 1, hs});
  }
  for (const int hs : {32, 64}) {
    for (const int NKV : {2, 1}) {
      for (const int T : {1, 7, 64}) shapes.push_back({2, T, 8, NKV, hs});
    }
  }
  shapes.push_back({1, 320, 2, 1, 64});
  return shapes;
}

// dqkv in double through the softmax backward's row form dS = P (dP - sum P dP); the
// full-Jacobian reference of kernel_reference.h is O(T^3) per head, too slow at 1024.
// With document_starts, the probabilities before a row's document are 0, and so are the
// terms they bring.
Vec reference_attention_backward(const Vec& dout, const Vec& qkv, const AttentionShape& s,
                                 const std::vector<std::int32_t>* document_starts = nullptr) {
  using reference::qkv_index;
  const reference::AttentionHeads a = s.heads();
  const int T = s.T, NH = s.NH, hs = s.hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec att, lse;
  reference::attention_probabilities(att, lse, qkv, s.B, T, a, document_starts);
  Vec dqkv(qkv.size(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const int kv = a.kv_head(h);
        const double* p = &att[((static_cast<std::size_t>(b) * NH + h) * T + t) * T];
        const double* g =
            &dout[(static_cast<std::size_t>(b) * T + t) * a.out_width() + static_cast<std::size_t>(h) * hs];
        Vec dp(t + 1, 0.0);
        double p_dot_dp = 0.0;
        for (int k = 0; k <= t; ++k) {
          for (int i = 0; i < hs; ++i) dp[k] += g[i] * qkv[qkv_index(b, k, 2, kv, i, T, a)];
          p_dot_dp += p[k] * dp[k];
        }
        for (int k = 0; k <= t; ++k) {
          const double ds = p[k] * (dp[k] - p_dot_dp) * scale;
          for (int i = 0; i < hs; ++i) {
            dqkv[qkv_index(b, k, 2, kv, i, T, a)] += p[k] * g[i];
            dqkv[qkv_index(b, t, 0, h, i, T, a)] += ds * qkv[qkv_index(b, k, 1, kv, i, T, a)];
            dqkv[qkv_index(b, k, 1, kv, i, T, a)] += ds * qkv[qkv_index(b, t, 0, h, i, T, a)];
          }
        }
      }
  return dqkv;
}

using FlashParam = std::tuple<TestDevice, AttentionShape>;

std::string flash_case_name(const ::testing::TestParamInfo<FlashParam>& info) {
  const AttentionShape& s = std::get<1>(info.param);
  const std::string heads =
      s.NKV == s.NH ? "" : "_NH" + std::to_string(s.NH) + "_NKV" + std::to_string(s.NKV);  // multi-head: no suffix
  return std::string(std::get<0>(info.param).name) + "_T" + std::to_string(s.T) + "_hs" + std::to_string(s.hs) + heads;
}

class FlashAttentionTest : public ::testing::TestWithParam<FlashParam> {
 protected:
  void SetUp() override {
    const DeviceAvailability availability = device_availability(std::get<0>(GetParam()).kind);
    if (!availability.available) GTEST_SKIP() << std::get<0>(GetParam()).name << " skipped: " << availability.reason;
    device_ = &device_of_kind(std::get<0>(GetParam()).kind);
  }
  Device* device_ = nullptr;
};

TEST_P(FlashAttentionTest, MatchesTheNaiveDoubleAttention) {
  const AttentionShape s = std::get<1>(GetParam());
  const std::string label = std::string(std::get<0>(GetParam()).name) + " attention T=" + std::to_string(s.T) +
                            " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) +
                            " hs=" + std::to_string(s.hs);
  const reference::AttentionHeads a = s.heads();
  const auto qkv = random_floats(s.tokens() * a.qkv_width(), 90, -2.0f, 2.0f);
  const auto dout = random_floats(s.tokens() * a.out_width(), 91);
  // NaN-filled outputs: every element must be written.
  std::vector<float> out(s.tokens() * a.out_width(), kNaN), lse(s.tokens() * s.NH, kNaN), dqkv(qkv.size(), kNaN);
  DeviceArgs d(*device_);
  const KernelTable& k = device_->kernels();
  k.attention_forward(d.out(out), d.out(lse), d.in(qkv), nullptr, s.B, s.T, s.NH, s.NKV, s.hs);
  k.attention_backward(d.out(dqkv), d.in(dout), d.in(qkv), d.in(out), d.in(lse), nullptr, s.B, s.T, s.NH, s.NKV, s.hs);
  d.finish();

  Vec want_out, want_lse;
  reference::attention_forward(want_out, want_lse, widen(qkv), s.B, s.T, a);
  const Vec want_dqkv = reference_attention_backward(widen(dout), widen(qkv), s);
  testing::report_close(label + " out", widen(out), want_out, Tolerance{1e-5, 1e-5});
  testing::report_close(label + " lse", widen(lse), want_lse, Tolerance{1e-5, 1e-5});
  testing::report_close(label + " dqkv", widen(dqkv), want_dqkv, Tolerance{3e-5, 3e-5});
}

// ‖got - want‖ / ‖want‖ (NaN when any element is NaN, which then fails).
double relative_error(const Vec& got, const Vec& want) {
  double error = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    error += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(error / norm);
}

// bf16 qkv: the products take bf16 operands (P, dS and dout rounded, fp32 sums), as
// tensor cores run them. Against the double attention of the same (bf16-valued)
// inputs the error is that of bf16 operands, about 1e-3 by norm (the bound: 5e-3); the lse, whose
// sums stay fp32, as close as in fp32. And the rounding is real: the same inputs as
// fp32 qkv give other bits.
TEST_P(FlashAttentionTest, Bf16ProductsAreWithinBf16OfTheDoubleAttention) {
  const AttentionShape s = std::get<1>(GetParam());
  const std::string label = std::string(std::get<0>(GetParam()).name) + " bf16 attention T=" + std::to_string(s.T) +
                            " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) +
                            " hs=" + std::to_string(s.hs);
  const reference::AttentionHeads a = s.heads();
  auto qkv = random_floats(s.tokens() * a.qkv_width(), 92, -2.0f, 2.0f);
  auto dout = random_floats(s.tokens() * a.out_width(), 93);
  for (float& value : qkv) value = round_to_bf16(value);
  for (float& value : dout) value = round_to_bf16(value);
  std::vector<std::uint16_t> qkv_bits(qkv.size());
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv_bits[i] = float_to_bf16_bits(qkv[i]);
  std::vector<float> out(s.tokens() * a.out_width(), kNaN), lse(s.tokens() * s.NH, kNaN), dqkv(qkv.size(), kNaN);
  std::vector<float> fp32_out(out.size(), kNaN), fp32_lse(lse.size(), kNaN), fp32_dqkv(qkv.size(), kNaN);
  DeviceArgs d(*device_);
  const KernelTable& k = device_->kernels();
  k.attention_forward(d.out(out), d.out(lse), d.in(qkv_bits), nullptr, s.B, s.T, s.NH, s.NKV, s.hs);
  k.attention_backward(d.out(dqkv), d.in(dout), d.in(qkv_bits), d.in(out), d.in(lse), nullptr, s.B, s.T, s.NH, s.NKV, s.hs);
  k.attention_forward(d.out(fp32_out), d.out(fp32_lse), d.in(qkv), nullptr, s.B, s.T, s.NH, s.NKV, s.hs);
  k.attention_backward(d.out(fp32_dqkv), d.in(dout), d.in(qkv), d.in(fp32_out), d.in(fp32_lse), nullptr, s.B, s.T, s.NH, s.NKV,
                       s.hs);
  d.finish();

  Vec want_out, want_lse;
  reference::attention_forward(want_out, want_lse, widen(qkv), s.B, s.T, a);
  const Vec want_dqkv = reference_attention_backward(widen(dout), widen(qkv), s);
  const double out_error = relative_error(widen(out), want_out);
  const double dqkv_error = relative_error(widen(dqkv), want_dqkv);
  std::printf("  %-44s out %.2e  dqkv %.2e (relative, by norm)\n", label.c_str(), out_error, dqkv_error);
  EXPECT_LT(out_error, 5e-3) << label;
  EXPECT_LT(dqkv_error, 5e-3) << label;
  testing::report_close(label + " lse", widen(lse), want_lse, Tolerance{1e-5, 1e-5});
  // T = 1: one key, probability 1, which bf16 holds exactly: nothing to round.
  if (s.T > 1) {
    EXPECT_NE(out, fp32_out) << label << ": bf16 products gave the fp32 products' bits";
  }
}

INSTANTIATE_TEST_SUITE_P(TiledAttention, FlashAttentionTest,
                         ::testing::Combine(::testing::ValuesIn(kTestDevices), ::testing::ValuesIn(attention_shapes())),
                         flash_case_name);

// ---- document masking over many tiles ------------------------------------------------

// Where each token's document starts, for rows whose documents begin at `starts`
// (ascending, after 0).
std::vector<std::int32_t> starts_of_documents(int T, const std::vector<int>& starts) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(T), 0);
  for (int t = 0; t < T; ++t) {
    for (const int start : starts) {
      if (start <= t) out[static_cast<std::size_t>(t)] = start;
    }
  }
  return out;
}

// The GPU kernels' tile walks under document masking, replayed on the host with the
// host-device helpers they call (FlashAttentionShape::sees, first_key_tile,
// document_start): for 64-row tiles, the forward's and dq's key tiles (from
// first_key_tile to the query tile's end) hold every key a row sees, and the dk/dv
// walk (query tiles from the key tile's own, leaving at the first tile whose first row
// starts after the key tile) meets every query that sees one of its keys. Each
// (query, key) pair a row sees must be visited exactly once by each walk.
TEST(DocumentAttentionTiles, TheGpuWalksVisitEveryVisiblePairOnce) {
  constexpr int kTile = 64;
  for (const std::uint32_t seed : {1u, 2u, 3u}) {
    const int B = 2, T = 333;
    const testing::PackedRows packed = testing::packed_rows(B, T, seed);
    const FlashAttentionShape shape{T, 1, 1, 64, packed.document_starts.data()};
    for (int b = 0; b < B; ++b) {
      std::vector<int> forward_visits(static_cast<std::size_t>(T) * T, 0), dkv_visits(forward_visits.size(), 0);
      for (int t0 = 0; t0 < T; t0 += kTile) {
        const int keys_seen = std::min(T, t0 + kTile);
        for (int j0 = shape.first_key_tile(b, t0, kTile); j0 < keys_seen; j0 += kTile) {
          for (int t = t0; t < std::min(T, t0 + kTile); ++t)
            for (int key = j0; key < std::min(T, j0 + kTile); ++key)
              if (shape.sees(b, t, key)) ++forward_visits[static_cast<std::size_t>(t) * T + key];
        }
      }
      for (int j0 = 0; j0 < T; j0 += kTile) {
        for (int t0 = j0; t0 < T; t0 += kTile) {
          if (shape.document_start(b, t0) >= j0 + kTile) break;
          for (int t = t0; t < std::min(T, t0 + kTile); ++t)
            for (int key = j0; key < std::min(T, j0 + kTile); ++key)
              if (key <= t && key >= shape.document_start(b, t)) ++dkv_visits[static_cast<std::size_t>(t) * T + key];
        }
      }
      for (int t = 0; t < T; ++t) {
        const int start = packed.document_starts[static_cast<std::size_t>(b) * T + t];
        for (int key = 0; key < T; ++key) {
          const int want = key >= start && key <= t ? 1 : 0;
          ASSERT_EQ(forward_visits[static_cast<std::size_t>(t) * T + key], want) << b << " " << t << " " << key;
          ASSERT_EQ(dkv_visits[static_cast<std::size_t>(t) * T + key], want) << b << " " << t << " " << key;
        }
      }
    }
  }
}

class DocumentAttentionTest : public ::testing::TestWithParam<TestDevice> {
 protected:
  void SetUp() override {
    const DeviceAvailability availability = device_availability(GetParam().kind);
    if (!availability.available) GTEST_SKIP() << GetParam().name << " skipped: " << availability.reason;
    device_ = &device_of_kind(GetParam().kind);
  }
  Device* device_ = nullptr;
};

// Documents that start on either side of the tiles' edges (64 rows on a GPU, 64-row
// query blocks and 256-key tiles on the CPU), one of a single token, and a long one
// whose query blocks skip every key tile of the documents before it: out, lse and
// dqkv equal the naive attention with the block-diagonal causal mask, for fp32 and
// bf16 products. A row that is one document gives the bits of the unmasked kernels.
TEST_P(DocumentAttentionTest, MatchesTheNaiveDoubleAttentionWithTheDocumentsMask) {
  const AttentionShape s{2, 600, 2, 1, 64};
  const reference::AttentionHeads a = s.heads();
  std::vector<std::int32_t> document_starts = starts_of_documents(s.T, {63, 64, 65, 255, 256, 257, 258, 330});
  const std::vector<std::int32_t> row_1 = starts_of_documents(s.T, {});
  document_starts.insert(document_starts.end(), row_1.begin(), row_1.end());
  for (const bool bf16 : {false, true}) {
    const std::string label = std::string(GetParam().name) + (bf16 ? " bf16" : " fp32") + " document attention";
    auto qkv = random_floats(s.tokens() * a.qkv_width(), 94, -2.0f, 2.0f);
    auto dout = random_floats(s.tokens() * a.out_width(), 95);
    if (bf16) {
      for (float& value : qkv) value = round_to_bf16(value);
      for (float& value : dout) value = round_to_bf16(value);
    }
    std::vector<std::uint16_t> qkv_bits(qkv.size());
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv_bits[i] = float_to_bf16_bits(qkv[i]);
    std::vector<float> out(s.tokens() * a.out_width(), kNaN), lse(s.tokens() * s.NH, kNaN), dqkv(qkv.size(), kNaN);
    std::vector<float> plain_out(out.size()), plain_lse(lse.size()), plain_dqkv(dqkv.size());
    DeviceArgs d(*device_);
    const KernelTable& k = device_->kernels();
    const TensorIn input = bf16 ? TensorIn(d.in(qkv_bits)) : TensorIn(d.in(qkv));
    const std::int32_t* starts = d.in(document_starts);
    k.attention_forward(d.out(out), d.out(lse), input, starts, s.B, s.T, s.NH, s.NKV, s.hs);
    k.attention_backward(d.out(dqkv), d.in(dout), input, d.in(out), d.in(lse), starts, s.B, s.T, s.NH, s.NKV, s.hs);
    k.attention_forward(d.out(plain_out), d.out(plain_lse), input, nullptr, s.B, s.T, s.NH, s.NKV, s.hs);
    k.attention_backward(d.out(plain_dqkv), d.in(dout), input, d.in(plain_out), d.in(plain_lse), nullptr, s.B, s.T,
                         s.NH, s.NKV, s.hs);
    d.finish();

    Vec want_out, want_lse;
    reference::attention_forward(want_out, want_lse, widen(qkv), s.B, s.T, a, &document_starts);
    const Vec want_dqkv = reference_attention_backward(widen(dout), widen(qkv), s, &document_starts);
    if (bf16) {
      EXPECT_LT(relative_error(widen(out), want_out), 5e-3) << label;
      EXPECT_LT(relative_error(widen(dqkv), want_dqkv), 5e-3) << label;
    } else {
      testing::report_close(label + " out", widen(out), want_out, Tolerance{1e-5, 1e-5});
      testing::report_close(label + " dqkv", widen(dqkv), want_dqkv, Tolerance{3e-5, 3e-5});
    }
    testing::report_close(label + " lse", widen(lse), want_lse, Tolerance{1e-5, 1e-5});
    // Row 1 is one document: its out and lse are the unmasked kernels' bits.
    const std::size_t out_row = s.tokens() / 2 * a.out_width();
    EXPECT_TRUE(std::equal(out.begin() + static_cast<std::ptrdiff_t>(out_row), out.end(),
                           plain_out.begin() + static_cast<std::ptrdiff_t>(out_row)))
        << label;
    EXPECT_TRUE(std::equal(lse.begin() + static_cast<std::ptrdiff_t>(lse.size() / 2), lse.end(),
                           plain_lse.begin() + static_cast<std::ptrdiff_t>(lse.size() / 2)))
        << label;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DocumentAttentionTest, ::testing::ValuesIn(kTestDevices),
                         [](const ::testing::TestParamInfo<TestDevice>& info) { return std::string(info.param.name); });

// ---- grouped heads against multi-head attention with repeated K/V heads -----------

// qkv of multi-head attention whose K/V head h is the grouped qkv's K/V head of query
// head h, so each query head sees the same keys and values in both.
std::vector<float> repeat_kv_heads(const std::vector<float>& qkv, const AttentionShape& s) {
  const reference::AttentionHeads grouped = s.heads(), repeated{s.NH, s.NH, s.hs};
  std::vector<float> out(s.tokens() * repeated.qkv_width());
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.NH; ++h)
        for (int i = 0; i < s.hs; ++i) {
          const int kv = grouped.kv_head(h);
          out[reference::qkv_index(b, t, 0, h, i, s.T, repeated)] =
              qkv[reference::qkv_index(b, t, 0, h, i, s.T, grouped)];
          for (const int part : {1, 2})
            out[reference::qkv_index(b, t, part, h, i, s.T, repeated)] =
                qkv[reference::qkv_index(b, t, part, kv, i, s.T, grouped)];
        }
  return out;
}

struct AttentionRun {
  std::vector<float> out, lse, dqkv;
};
AttentionRun run_attention(Device& device, const std::vector<float>& qkv, const std::vector<float>& dout,
                           const AttentionShape& s) {
  AttentionRun run{std::vector<float>(dout.size()), std::vector<float>(s.tokens() * s.NH),
                   std::vector<float>(qkv.size())};
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.attention_forward(d.out(run.out), d.out(run.lse), d.in(qkv), nullptr, s.B, s.T, s.NH, s.NKV, s.hs);
  k.attention_backward(d.out(run.dqkv), d.in(dout), d.in(qkv), d.in(run.out), d.in(run.lse), nullptr, s.B, s.T, s.NH, s.NKV,
                       s.hs);
  d.finish();
  return run;
}

std::size_t elements_that_differ(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
  return differ;
}

// A query head's forward and dq do the same operations whichever K/V head it reads, so
// grouping changes none of their bits; dk and dv of a group are the sums of the
// repeated heads' (in another rounding: one accumulator against separate ones).
TEST(GroupedAttention, IsMultiHeadAttentionWithRepeatedKvHeads) {
  for (const TestDevice& test_device : kTestDevices) {
    const DeviceAvailability availability = device_availability(test_device.kind);
    if (!availability.available) {
      std::printf("  %s skipped: %s\n", test_device.name, availability.reason.c_str());
      continue;
    }
    for (const AttentionShape grouped : {AttentionShape{2, 70, 8, 2, 32}, AttentionShape{1, 33, 4, 1, 64}}) {
      const AttentionShape multi_head{grouped.B, grouped.T, grouped.NH, grouped.NH, grouped.hs};
      const std::string label = std::string(test_device.name) + " NH=" + std::to_string(grouped.NH) +
                                " NKV=" + std::to_string(grouped.NKV);
      const auto qkv = random_floats(grouped.tokens() * grouped.heads().qkv_width(), 92, -2.0f, 2.0f);
      const auto dout = random_floats(grouped.tokens() * grouped.heads().out_width(), 93);
      Device& device = device_of_kind(test_device.kind);
      const AttentionRun got = run_attention(device, qkv, dout, grouped);
      const AttentionRun want = run_attention(device, repeat_kv_heads(qkv, grouped), dout, multi_head);
      EXPECT_EQ(elements_that_differ(got.out, want.out), 0u) << label << " out";
      EXPECT_EQ(elements_that_differ(got.lse, want.lse), 0u) << label << " lse";
      const reference::AttentionHeads g = grouped.heads(), m = multi_head.heads();
      std::vector<float> got_dq, want_dq;
      Vec got_dkv, want_dkv;
      for (int b = 0; b < grouped.B; ++b)
        for (int t = 0; t < grouped.T; ++t) {
          for (int h = 0; h < grouped.NH; ++h)
            for (int i = 0; i < grouped.hs; ++i) {
              got_dq.push_back(got.dqkv[reference::qkv_index(b, t, 0, h, i, grouped.T, g)]);
              want_dq.push_back(want.dqkv[reference::qkv_index(b, t, 0, h, i, grouped.T, m)]);
            }
          for (const int part : {1, 2})
            for (int kv = 0; kv < grouped.NKV; ++kv)
              for (int i = 0; i < grouped.hs; ++i) {
                got_dkv.push_back(got.dqkv[reference::qkv_index(b, t, part, kv, i, grouped.T, g)]);
                double group_sum = 0.0;
                for (int h = 0; h < grouped.NH; ++h) {
                  if (g.kv_head(h) == kv) group_sum += want.dqkv[reference::qkv_index(b, t, part, h, i, grouped.T, m)];
                }
                want_dkv.push_back(group_sum);
              }
        }
      EXPECT_EQ(elements_that_differ(got_dq, want_dq), 0u) << label << " dq";
      testing::report_close(label + " dk, dv", got_dkv, want_dkv, Tolerance{1e-5, 1e-5});
    }
  }
}

// The kernels refuse heads that do not group, before touching memory.
TEST(GroupedAttention, RejectsQueryHeadsThatAreNotAMultipleOfTheKvHeads) {
  for (const TestDevice& test_device : kTestDevices) {
    if (!device_availability(test_device.kind).available) continue;
    const KernelTable& k = device_of_kind(test_device.kind).kernels();
    for (const auto& [NH, NKV] : {std::pair{3, 2}, std::pair{2, 4}, std::pair{2, 0}}) {
      EXPECT_THROW(k.attention_forward(nullptr, nullptr, nullptr, nullptr, 1, 1, NH, NKV, 4), Error) << NH << "/" << NKV;
      EXPECT_THROW(k.attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, NH, NKV, 4), Error)
          << NH << "/" << NKV;
    }
  }
}

}  // namespace
}  // namespace dufu::trainer
