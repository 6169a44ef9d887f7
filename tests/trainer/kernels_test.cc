// Every kernel of every device against its naive double-precision reference
// (kernel_reference.h), through one parameterised harness over devices x ops x
// shapes: each run uploads its inputs to the device, calls the op from the device's
// kernel table and downloads the outputs, with sentinels around every buffer and its
// inputs held unchanged (DeviceArgs, kernel_test_support.h). A device that is not present here is
// listed with the reason, and its rows are skipped saying so. The same op table
// drives the contract tests: backward kernels accumulate parameter gradients and
// overwrite (or accumulate) activation gradients as kernel_table.h says, are bitwise
// repeatable, and (on the CPU) agree across OpenMP thread counts. AdamW also gets a
// multi-step check against torch.optim.AdamW's formula and against numbers printed by
// torch itself. How to add an op to every device, with its rows here: the top of
// kernel_cases.h.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "device/bf16.h"
#include "dufu/trainer/device/device.h"
#include "device/kernel_math.h"
#include "device/kernel_partition.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_cases.h"
#include "kernel_reference.h"
#include "kernel_test_support.h"

// From OpenBLAS's cblas.h, which the trainer library keeps private.
extern "C" int openblas_get_num_threads(void);

namespace dufu::trainer {
namespace {

namespace ref = reference;
using testing::bf16_op_cases;
using testing::DeviceArgs;
using testing::kNaN;
using testing::kTestDevices;
using testing::layer_op_cases;
using testing::kept_op_cases;
using testing::kept_rowwise_op_cases;
using testing::llama_op_cases;
using testing::OpCase;
using testing::Outputs;
using testing::random_floats;
using testing::random_tokens;
using testing::Shape;
using testing::step_op_cases;
using testing::TestDevice;
using testing::Tolerance;
using testing::Vec;
using testing::vocabulary_op_cases;
using testing::widen;

// The shapes cover: T = 1 and NH = 1 (tiny); head sizes 4 and 5 with C not a multiple
// of 8 and Vp > V (odd, c20); several 64-wide column blocks and layernorm row chunks
// (mid, wide); N not a multiple of the 16-row sgemm split (mid); attention's 64-row
// query blocks, one full (wide) and several with a ragged last one (long); C not a
// multiple of 4 (c18: the CUDA norms' single-float path, where the others take float4).
const Shape kShapes[] = {
    {"tiny", 1, 1, 8, 1, 5, 8},           //
    {"odd", 2, 5, 12, 3, 7, 16},          //
    {"c20", 3, 7, 20, 4, 11, 13},         //
    {"mid", 3, 11, 72, 6, 301, 320},      //
    {"wide", 4, 64, 200, 4, 1000, 1024},  //
    {"long", 2, 150, 24, 2, 50, 64},      //
    {"c18", 2, 3, 18, 3, 9, 12},
};

// Every row of kernel_cases_*.cc, in one table.
const std::vector<OpCase> kOps = [] {
  std::vector<OpCase> ops;
  for (const auto& family :
       {layer_op_cases(), vocabulary_op_cases(), step_op_cases(), bf16_op_cases(), llama_op_cases(),
        kept_op_cases(), kept_rowwise_op_cases()}) {
    ops.insert(ops.end(), family.begin(), family.end());
  }
  return ops;
}();

using KernelParam = std::tuple<TestDevice, OpCase, Shape>;

std::string case_name(const ::testing::TestParamInfo<KernelParam>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name + "_" +
         std::get<2>(info.param).name;
}

// Runs fn with OpenMP limited to `threads`, restoring the previous limit.
template <typename Fn>
auto with_threads(int threads, Fn fn) {
  const int previous = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto result = fn();
  omp_set_num_threads(previous);
  return result;
}

bool bitwise_equal(const Vec& a, const Vec& b) {
  // memcmp must not see the null data() of an empty vector
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// One row per (device, op, shape); rows of a device that is not here are skipped with
// the reason.
class KernelTest : public ::testing::TestWithParam<KernelParam> {
 protected:
  void SetUp() override {
    const DeviceAvailability availability = device_availability(test_device().kind);
    if (!availability.available) GTEST_SKIP() << test_device().name << " skipped: " << availability.reason;
    device_ = &device_of_kind(test_device().kind);
  }
  const TestDevice& test_device() const { return std::get<0>(GetParam()); }
  Device* device() const { return device_; }
  const OpCase& op() const { return std::get<1>(GetParam()); }
  const Shape& shape() const { return std::get<2>(GetParam()); }
  std::string label(const std::string& output) const {
    return std::string(test_device().name) + " " + op().name + "[" + shape().name + "]." + output;
  }

 private:
  Device* device_ = nullptr;
};

TEST_P(KernelTest, MatchesReference) {
  const Outputs fast = op().run(shape(), device(), 1);
  const Outputs want = op().run(shape(), nullptr, 1);
  ASSERT_EQ(fast.size(), want.size());
  for (std::size_t i = 0; i < fast.size(); ++i) {
    ASSERT_EQ(fast[i].name, want[i].name);
    testing::report_close(label(fast[i].name), fast[i].values, want[i].values, op().tol);
  }
}

// Backward kernels called twice add their gradients twice into accumulated outputs and
// leave overwritten ones as after one call (see `calls`); forward kernels run once.
class KernelCalledTwiceTest : public KernelTest {};

TEST_P(KernelCalledTwiceTest, FollowsTheAccumulateContract) {
  const Outputs fast = op().run(shape(), device(), 2);
  const Outputs want = op().run(shape(), nullptr, 2);
  ASSERT_EQ(fast.size(), want.size());
  for (std::size_t i = 0; i < fast.size(); ++i) {
    testing::report_close(label(fast[i].name) + " x2", fast[i].values, want[i].values, op().tol);
  }
}

TEST_P(KernelTest, IsBitwiseRepeatable) {
  const Outputs first = op().run(shape(), device(), 1);
  const Outputs second = op().run(shape(), device(), 1);
  ASSERT_EQ(first.size(), second.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(first[i].values, second[i].values)) << label(first[i].name);
  }
}

// Thread counts change how work is split, never the answer: the same bits, except
// for matmul, which may differ in rounding (cpu_kernels.h). OpenMP threads are the
// CPU device's.
TEST_P(KernelTest, AgreesAcrossThreadCounts) {
  if (test_device().kind != DeviceKind::kCpu) GTEST_SKIP() << "OpenMP thread counts concern the cpu device only";
  const Outputs two = with_threads(2, [&] { return op().run(shape(), device(), 1); });
  for (const int threads : {1, 3}) {
    const Outputs other = with_threads(threads, [&] { return op().run(shape(), device(), 1); });
    ASSERT_EQ(other.size(), two.size());
    for (std::size_t i = 0; i < two.size(); ++i) {
      const bool same_bits = bitwise_equal(other[i].values, two[i].values);
      std::printf("  %s: %d vs 2 threads %s\n", label(two[i].name).c_str(), threads,
                  same_bits ? "bitwise identical" : "differ in rounding");
      if (op().same_bits_for_any_thread_count) {
        EXPECT_TRUE(same_bits) << label(two[i].name) << " with " << threads << " threads";
      } else if (!same_bits) {
        testing::report_close(label(two[i].name), other[i].values, two[i].values, op().tol);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, KernelTest,
                         ::testing::Combine(::testing::ValuesIn(kTestDevices), ::testing::ValuesIn(kOps),
                                            ::testing::ValuesIn(kShapes)),
                         case_name);

std::vector<OpCase> repeatable_ops() {
  std::vector<OpCase> ops;
  std::copy_if(std::begin(kOps), std::end(kOps), std::back_inserter(ops),
               [](const OpCase& op) { return op.repeatable_calls; });
  return ops;
}

INSTANTIATE_TEST_SUITE_P(RepeatableOps, KernelCalledTwiceTest,
                         ::testing::Combine(::testing::ValuesIn(kTestDevices), ::testing::ValuesIn(repeatable_ops()),
                                            ::testing::ValuesIn(kShapes)),
                         case_name);

// Says once which devices the rows above ran on and why the others were skipped.
TEST(KernelDevices, ListsThePresentAndTheSkipped) {
  int present = 0;
  for (const TestDevice& device : kTestDevices) {
    const DeviceAvailability availability = device_availability(device.kind);
    std::printf("  device %-5s %s%s\n", device.name,
                availability.available ? "present" : "skipped: ", availability.reason.c_str());
    present += availability.available ? 1 : 0;
  }
  EXPECT_TRUE(device_availability(DeviceKind::kCpu).available) << "the cpu device is always there";
  EXPECT_GE(present, 1);
}

// ---- contracts not covered by the harness ------------------------------------------

TEST(Matmul, LeavesOpenBlasSingleThreadedForOpenMPToSplitTheWork) {
  const auto matmul = std::find_if(kOps.begin(), kOps.end(),
                                   [](const OpCase& op) { return std::string(op.name) == "matmul_forward_qkv"; });
  ASSERT_NE(matmul, kOps.end());
  matmul->run(kShapes[1], &cpu_device(), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST(Classifier, RejectsTargetsOutsideTheVocabulary) {
  std::vector<float> logits(2 * 8, 0.0f), losses(2);
  const std::vector<std::int32_t> targets{3, 5};
  EXPECT_THROW(
      cpu_device().kernels().classifier_forward_backward(logits.data(), losses.data(), targets.data(), 0.5f, 2, 5, 8),
      std::exception);
}

// One entry per op whatever the precision: the operand's type picks how it is read, so
// the same entry gives bf16 bits' values and the fp32 values of those bits alike, and
// a mix of the two types in one call is refused by name (nothing written).
TEST(TypedOperands, OneEntryReadsEitherTypeAndRefusesAMix) {
  constexpr int N = 3, C = 8, OC = 5;
  std::vector<float> x(N * C), weight(OC * C);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = bf16_bits_to_float(float_to_bf16_bits(0.37f * (i % 7) - 1.1f));
  for (std::size_t i = 0; i < weight.size(); ++i) {
    weight[i] = bf16_bits_to_float(float_to_bf16_bits(0.21f * (i % 5) - 0.4f));
  }
  std::vector<std::uint16_t> x_bits(x.size()), weight_bits(weight.size());
  for (std::size_t i = 0; i < x.size(); ++i) x_bits[i] = float_to_bf16_bits(x[i]);
  for (std::size_t i = 0; i < weight.size(); ++i) weight_bits[i] = float_to_bf16_bits(weight[i]);
  const KernelTable& k = cpu_device().kernels();
  std::vector<float> from_floats(N * OC), from_bits(N * OC);
  k.matmul_forward(from_floats.data(), x.data(), weight.data(), nullptr, N, C, OC);
  k.matmul_forward(from_bits.data(), x_bits.data(), weight_bits.data(), nullptr, N, C, OC);
  EXPECT_EQ(from_floats, from_bits);
  EXPECT_EQ(TensorIn(x_bits.data()).type, ElementType::kBf16);
  EXPECT_EQ(TensorIn(x.data()).type, ElementType::kFloat32);

  std::vector<float> untouched(N * OC, 7.0f);
  try {
    k.matmul_forward(untouched.data(), x.data(), weight_bits.data(), nullptr, N, C, OC);
    ADD_FAILURE() << "a float x with bf16 weights was taken";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("matmul_forward: operands of two element types, fp32 and bf16"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(untouched, std::vector<float>(N * OC, 7.0f));
  const std::vector<std::int32_t> tokens{0, 1, 2};
  std::vector<float> embedded(N * C);
  EXPECT_THROW(k.embedding_forward(embedded.data(), tokens.data(), nullptr, x_bits.data(), weight.data(), 1, N, C),
               std::exception);
}

// A bf16-kept output (TensorOut) is rounded by the kernel that computes it, as the
// separate passes it replaces rounded it: the fused residual + norm under bf16 gives
// the bits of add, store_bf16, the norm and store_bf16 again (the residual rounded
// before the statistics), with and without bits to keep.
TEST(KeptOutputs, FusedResidualNormsRoundAsTheSeparatePassesDid) {
  constexpr int N = 5, C = 40;
  const std::size_t n = static_cast<std::size_t>(N) * C;
  std::vector<float> residual(n), branch(n), weight(C), bias(C);
  for (std::size_t i = 0; i < n; ++i) {
    residual[i] = std::sin(0.37f * static_cast<float>(i)) * 3.1f;
    branch[i] = std::cos(0.11f * static_cast<float>(i)) * 0.0123f;
  }
  for (int c = 0; c < C; ++c) {
    weight[static_cast<std::size_t>(c)] = 1.0f + 0.01f * static_cast<float>(c);
    bias[static_cast<std::size_t>(c)] = 0.003f * static_cast<float>(c) - 0.05f;
  }
  const KernelTable& k = cpu_device().kernels();
  for (const bool llama : {false, true}) {
    for (const bool with_bits : {true, false}) {
      SCOPED_TRACE(std::string(llama ? "rmsnorm" : "layernorm") + (with_bits ? ", bits kept" : ", rounded only"));
      // The separate passes.
      std::vector<float> expected_residual(n), expected_norm(n), expected_mean(N), expected_rstd(N);
      std::vector<std::uint16_t> expected_residual_bits(n), expected_norm_bits(n);
      k.add(expected_residual.data(), residual.data(), branch.data(), n);
      k.store_bf16(expected_residual_bits.data(), expected_residual.data(), n);
      if (llama) {
        k.rmsnorm_forward(expected_norm.data(), expected_rstd.data(), expected_residual.data(), weight.data(), 1e-5f,
                          N, C);
      } else {
        k.layernorm_forward(expected_norm.data(), expected_mean.data(), expected_rstd.data(), expected_residual.data(),
                            weight.data(), bias.data(), N, C);
      }
      k.store_bf16(expected_norm_bits.data(), expected_norm.data(), n);
      // The fused kernel keeping both in bf16.
      std::vector<float> got_residual(n), got_norm(n), got_mean(N), got_rstd(N);
      std::vector<std::uint16_t> residual_bits(n, 0xdead), norm_bits(n, 0xdead);
      const TensorOut residual_kept(got_residual.data(), ElementType::kBf16, with_bits ? residual_bits.data() : nullptr);
      const TensorOut norm_kept(got_norm.data(), ElementType::kBf16, with_bits ? norm_bits.data() : nullptr);
      if (llama) {
        k.residual_rmsnorm_forward(residual_kept, norm_kept, got_rstd.data(), residual.data(), branch.data(),
                                   weight.data(), 1e-5f, N, C);
      } else {
        k.residual_layernorm_forward(residual_kept, norm_kept, got_mean.data(), got_rstd.data(), residual.data(),
                                     branch.data(), weight.data(), bias.data(), N, C);
      }
      EXPECT_EQ(0, std::memcmp(got_residual.data(), expected_residual.data(), n * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(got_norm.data(), expected_norm.data(), n * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(got_rstd.data(), expected_rstd.data(), N * sizeof(float)));
      if (with_bits) {
        EXPECT_EQ(residual_bits, expected_residual_bits);
        EXPECT_EQ(norm_bits, expected_norm_bits);
      } else {
        EXPECT_EQ(residual_bits, std::vector<std::uint16_t>(n, 0xdead)) << "bits written where none were asked for";
      }
      // fp32 outputs are not rounded: the fused fp32 call differs from the rounded one.
      std::vector<float> fp32_residual(n), fp32_norm(n);
      if (llama) {
        k.residual_rmsnorm_forward(fp32_residual.data(), fp32_norm.data(), got_rstd.data(), residual.data(),
                                   branch.data(), weight.data(), 1e-5f, N, C);
      } else {
        k.residual_layernorm_forward(fp32_residual.data(), fp32_norm.data(), got_mean.data(), got_rstd.data(),
                                     residual.data(), branch.data(), weight.data(), bias.data(), N, C);
      }
      EXPECT_NE(0, std::memcmp(fp32_residual.data(), expected_residual.data(), n * sizeof(float)));
    }
  }
}

// The GEMMs and the attention keep their outputs as the store_bf16 pass after them
// did: on the CPU the same bits, values and stored bits alike (kernel_cases_kept.cc
// holds every device to the reference).
TEST(KeptOutputs, GemmsAndAttentionRoundAsTheStorePassDid) {
  constexpr int B = 2, T = 9, NH = 2, hs = 8, C = NH * hs, N = B * T, OC = 3 * C;
  const auto grid = [](std::size_t n, float scale, float shift) {
    std::vector<std::uint16_t> bits(n);
    for (std::size_t i = 0; i < n; ++i) {
      bits[i] = float_to_bf16_bits(std::sin(0.37f * static_cast<float>(i) + shift) * scale);
    }
    return bits;
  };
  const auto x = grid(static_cast<std::size_t>(N) * C, 1.0f, 0.0f);
  const auto weight = grid(static_cast<std::size_t>(OC) * C, 0.3f, 1.0f);
  const auto dout = grid(static_cast<std::size_t>(N) * OC, 0.5f, 2.0f);
  std::vector<float> bias(OC), pre_values(static_cast<std::size_t>(N) * C), dout_values(dout.size());
  for (int o = 0; o < OC; ++o) bias[static_cast<std::size_t>(o)] = 0.01f * static_cast<float>(o % 7) - 0.02f;
  for (std::size_t i = 0; i < pre_values.size(); ++i) pre_values[i] = std::cos(0.21f * static_cast<float>(i)) * 3.0f;
  for (std::size_t i = 0; i < dout.size(); ++i) dout_values[i] = bf16_bits_to_float(dout[i]);
  const KernelTable& k = cpu_device().kernels();
  // The separate pass's result from an fp32 result: the values rounded, their bits.
  struct Stored {
    std::vector<float> values;
    std::vector<std::uint16_t> bits;
  };
  const auto store = [&](std::vector<float> values) {
    Stored stored{std::move(values), {}};
    stored.bits.resize(stored.values.size());
    k.store_bf16(stored.bits.data(), stored.values.data(), stored.values.size());
    return stored;
  };
  const auto expect_kept = [](const Stored& want, const std::vector<float>& values,
                              const std::vector<std::uint16_t>* bits, const char* what) {
    EXPECT_EQ(0, std::memcmp(values.data(), want.values.data(), values.size() * sizeof(float))) << what;
    if (bits != nullptr) {
      EXPECT_EQ(*bits, want.bits) << what;
    }
  };
  // matmul_forward with its bias.
  std::vector<float> plain(static_cast<std::size_t>(N) * OC), got(plain.size());
  std::vector<std::uint16_t> got_bits(plain.size(), 0xffff);
  k.matmul_forward(plain.data(), x.data(), weight.data(), bias.data(), N, C, OC);
  k.matmul_forward({got.data(), ElementType::kBf16, got_bits.data()}, x.data(), weight.data(), bias.data(), N, C, OC);
  expect_kept(store(plain), got, &got_bits, "matmul_forward");
  // matmul_bias_gelu_forward: both outputs, the GELU of the unrounded pre-activation.
  std::vector<float> plain_out(plain.size()), plain_pre(plain.size()), got_out(plain.size()), got_pre(plain.size());
  std::vector<std::uint16_t> out_bits(plain.size()), pre_bits(plain.size());
  k.matmul_bias_gelu_forward(plain_out.data(), plain_pre.data(), x.data(), weight.data(), bias.data(), N, C, OC);
  k.matmul_bias_gelu_forward({got_out.data(), ElementType::kBf16, out_bits.data()},
                             {got_pre.data(), ElementType::kBf16, pre_bits.data()}, x.data(), weight.data(),
                             bias.data(), N, C, OC);
  expect_kept(store(plain_out), got_out, &out_bits, "matmul_bias_gelu_forward out");
  expect_kept(store(plain_pre), got_pre, &pre_bits, "matmul_bias_gelu_forward pre");
  // The input gradients: matmul_backward's dx and matmul_gelu_backward's dpre, rounded.
  std::vector<float> dweight(static_cast<std::size_t>(OC) * C, 0.0f), plain_dx(pre_values.size()),
      got_dx(pre_values.size());
  k.matmul_backward(plain_dx.data(), dweight.data(), nullptr, dout_values.data(), x.data(), weight.data(), N, C, OC);
  k.matmul_backward({got_dx.data(), ElementType::kBf16, nullptr}, dweight.data(), nullptr, dout_values.data(),
                    x.data(), weight.data(), N, C, OC);
  expect_kept(store(plain_dx), got_dx, nullptr, "matmul_backward dx");
  k.matmul_gelu_backward(plain_dx.data(), dweight.data(), nullptr, dout_values.data(), x.data(), weight.data(),
                         pre_values.data(), N, C, OC);
  k.matmul_gelu_backward({got_dx.data(), ElementType::kBf16, nullptr}, dweight.data(), nullptr, dout_values.data(),
                         x.data(), weight.data(), pre_values.data(), N, C, OC);
  expect_kept(store(plain_dx), got_dx, nullptr, "matmul_gelu_backward dpre");
  // Attention on the projection's output as qkv: out kept with bits, dqkv rounded.
  std::vector<float> qkv(plain.size());
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = bf16_bits_to_float(got_bits[i]);
  std::vector<float> plain_att(static_cast<std::size_t>(N) * C), got_att(plain_att.size()), lse(B * NH * T);
  std::vector<std::uint16_t> att_bits(plain_att.size());
  k.attention_forward(plain_att.data(), lse.data(), qkv.data(), nullptr, B, T, NH, NH, hs);
  k.attention_forward({got_att.data(), ElementType::kBf16, att_bits.data()}, lse.data(), qkv.data(), nullptr, B, T, NH, NH,
                      hs);
  const Stored att = store(plain_att);
  expect_kept(att, got_att, &att_bits, "attention_forward");
  std::vector<float> plain_dqkv(qkv.size()), got_dqkv(qkv.size());
  const std::vector<float> datt(dout_values.begin(), dout_values.begin() + static_cast<std::ptrdiff_t>(N * C));
  k.attention_backward(plain_dqkv.data(), datt.data(), qkv.data(), att.values.data(), lse.data(), nullptr, B, T, NH, NH, hs);
  k.attention_backward({got_dqkv.data(), ElementType::kBf16, nullptr}, datt.data(), qkv.data(), att.values.data(),
                       lse.data(), nullptr, B, T, NH, NH, hs);
  expect_kept(store(plain_dqkv), got_dqkv, nullptr, "attention_backward");
  // The norms' backward, adding into dx and keeping the sum.
  std::vector<float> mean(N), rstd(N), norm_out(plain_att.size()), norm_weight(C, 1.1f), norm_bias(C, 0.1f);
  k.layernorm_forward(norm_out.data(), mean.data(), rstd.data(), plain_att.data(), norm_weight.data(),
                      norm_bias.data(), N, C);
  for (const bool llama : {false, true}) {
    std::vector<float> plain_norm_dx(plain_att.size(), 0.25f), got_norm_dx(plain_att.size(), 0.25f), dnorm(C);
    std::vector<float> dnorm_bias(C);
    if (llama) {
      k.rmsnorm_backward(plain_norm_dx.data(), dnorm.data(), datt.data(), plain_att.data(), norm_weight.data(),
                         rstd.data(), N, C);
      k.rmsnorm_backward({got_norm_dx.data(), ElementType::kBf16, nullptr}, dnorm.data(), datt.data(),
                         plain_att.data(), norm_weight.data(), rstd.data(), N, C);
    } else {
      k.layernorm_backward(plain_norm_dx.data(), dnorm.data(), dnorm_bias.data(), datt.data(), plain_att.data(),
                           norm_weight.data(), mean.data(), rstd.data(), N, C);
      k.layernorm_backward({got_norm_dx.data(), ElementType::kBf16, nullptr}, dnorm.data(), dnorm_bias.data(),
                           datt.data(), plain_att.data(), norm_weight.data(), mean.data(), rstd.data(), N, C);
    }
    expect_kept(store(plain_norm_dx), got_norm_dx, nullptr, llama ? "rmsnorm_backward" : "layernorm_backward");
  }
  // Kept fp32 is plain fp32: nothing rounded.
  k.matmul_forward({got.data(), ElementType::kFloat32, nullptr}, x.data(), weight.data(), bias.data(), N, C, OC);
  EXPECT_EQ(got, plain);
  EXPECT_NE(plain, store(plain).values) << "the test's values are not all on the bf16 grid already";
}

TEST(AdamW, RejectsStepZeroAndSegmentsThatGoBackwards) {
  std::vector<float> params(8, 1.0f), grads(8, 0.5f), m(8, 0.0f), v(8, 0.0f);
  const AdamWSegment forwards[] = {{3, 0.1f}, {8, 0.0f}};
  const AdamWSegment backwards[] = {{5, 0.1f}, {3, 0.0f}, {8, 0.1f}};
  EXPECT_THROW(
      cpu_device().kernels().adamw_update(params.data(), grads.data(), m.data(), v.data(),
                                          std::span<const AdamWSegment>(forwards), 1e-3f, 0.9f, 0.95f, 1e-8f, 0, 1.0f),
      std::exception);
  EXPECT_THROW(
      cpu_device().kernels().adamw_update(params.data(), grads.data(), m.data(), v.data(),
                                          std::span<const AdamWSegment>(backwards), 1e-3f, 0.9f, 0.95f, 1e-8f, 1, 1.0f),
      std::exception);
  EXPECT_EQ(params, std::vector<float>(8, 1.0f)) << "nothing is written before the checks";
}

TEST(KernelMath, ExpApproxIsWithinTwoUlpOfExp) {
  double max_rel = 0.0;
  for (float x = -87.0f; x <= 88.0f; x += 0.001f) {
    const double want = std::exp(static_cast<double>(x));
    max_rel = std::max(max_rel, std::abs(exp_approx(x) - want) / want);
  }
  std::printf("  exp_approx max rel err %.3g (float eps 1.19e-7)\n", max_rel);
  EXPECT_LE(max_rel, 2.4e-7);
  // Clamped, not overflowed or wrapped, outside the float range; NaN stays NaN.
  for (const float x : {-1e30f, -1000.0f, -88.0f, -std::numeric_limits<float>::infinity()}) {
    EXPECT_GT(exp_approx(x), 0.0f) << x;
    EXPECT_LT(exp_approx(x), 1e-37f) << x;
  }
  for (const float x : {89.0f, 1000.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_TRUE(std::isfinite(exp_approx(x))) << x;
    EXPECT_GT(exp_approx(x), 1e38f) << x;
  }
  EXPECT_TRUE(std::isnan(exp_approx(kNaN)));
  EXPECT_TRUE(std::isnan(exp_approx(-kNaN)));
}

TEST(KernelMath, GeluStaysFiniteAndAccurateFarFromZero) {
  for (float x = -30.0f; x <= 30.0f; x += 0.25f) {
    const float value = gelu_tanh(x);
    const float grad = gelu_tanh_grad(x);
    ASSERT_TRUE(std::isfinite(value) && std::isfinite(grad)) << x;
    EXPECT_NEAR(value, ref::gelu(x), 1e-6 + 2e-6 * std::abs(ref::gelu(x))) << x;
    EXPECT_NEAR(grad, ref::gelu_grad(x), 2e-6) << x;
  }
}

// ---- AdamW over several steps ------------------------------------------------------

class AdamWSteps : public ::testing::TestWithParam<float> {};

// Steps t = 1, 2, 3 with fresh gradients, the state carried between steps, against the
// double-precision transcription of torch.optim.AdamW.
TEST_P(AdamWSteps, FollowTorchFormulaForThreeSteps) {
  const float weight_decay = GetParam();
  const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  const std::size_t n = 1000;
  auto params = random_floats(n, 80);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  Vec ref_params = widen(params), ref_m(n, 0.0), ref_v(n, 0.0);
  for (int t = 1; t <= 3; ++t) {
    auto grads = random_floats(n, 80 + t, -0.5f, 0.5f);
    grads[t] = 0.0f;  // a zero gradient still decays and moves by momentum
    const AdamWSegment all[] = {{n, weight_decay}};
    cpu_device().kernels().adamw_update(params.data(), grads.data(), m.data(), v.data(),
                                        std::span<const AdamWSegment>(all), lr, beta1, beta2, eps, t, 1.0f);
    ref::adamw_update(ref_params, widen(grads), ref_m, ref_v, lr, beta1, beta2, eps, weight_decay, t);
    const std::string step = "adamw wd=" + std::to_string(weight_decay) + " t=" + std::to_string(t);
    testing::report_close(step + " params", widen(params), ref_params, {1e-7, 1e-6});
    testing::report_close(step + " m", widen(m), ref_m, {3e-8, 1e-6});  // m cancels: absolute
    testing::report_close(step + " v", widen(v), ref_v, {1e-10, 1e-6});
  }
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutDecay, AdamWSteps, ::testing::Values(0.0f, 0.1f));

// Values printed by torch 1.13 (Debian python3-torch), float32:
//   p = torch.tensor([0.5, -1.25, 2.0, 0.0], requires_grad=True)
//   opt = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
//   for g in ([0.1, -0.2, 0.0, 3.0], [-0.3, 0.1, 0.5, 1.0], [0.2, 0.2, -0.1, -2.0]):
//       p.grad = torch.tensor(g); opt.step(); print(p.tolist())  # as %.9g
TEST(AdamW, MatchesNumbersFromTorch) {
  std::vector<float> params{0.5f, -1.25f, 2.0f, 0.0f}, m(4, 0.0f), v(4, 0.0f);
  const std::vector<std::vector<float>> grads{
      {0.1f, -0.2f, 0.0f, 3.0f}, {-0.3f, 0.1f, 0.5f, 1.0f}, {0.2f, 0.2f, -0.1f, -2.0f}};
  const std::vector<std::vector<float>> torch_params{{0.489500016f, -1.23874998f, 1.99800003f, -0.00999999978f},
                                                     {0.493903458f, -1.23482764f, 1.98865247f, -0.0187896173f},
                                                     {0.493222654f, -1.23631942f, 1.9822793f, -0.0210633632f}};
  const AdamWSegment all[] = {{4, 0.1f}};
  for (int t = 1; t <= 3; ++t) {
    cpu_device().kernels().adamw_update(params.data(), grads[t - 1].data(), m.data(), v.data(),
                                        std::span<const AdamWSegment>(all), 0.01f, 0.9f, 0.95f, 1e-8f, t, 1.0f);
    testing::report_close("adamw vs torch t=" + std::to_string(t), widen(params), widen(torch_params[t - 1]),
                          {1e-7, 1e-6});
  }
}

}  // namespace
}  // namespace dufu::trainer

namespace dufu::trainer {
namespace {

// The host-device partition helpers the CPU and CUDA kernels share, against naive loops.
TEST(KernelPartition, RowChunksTileTheRowsEvenly) {
  for (int N = 0; N <= 200; ++N) {
    const int chunks = row_chunk_count(N);
    ASSERT_EQ(chunks, std::max(1, std::min(N, kMaxRowChunks))) << N;
    ASSERT_EQ(row_chunk_begin(N, chunks, 0), 0);
    ASSERT_EQ(row_chunk_begin(N, chunks, chunks), N);
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int size = row_chunk_begin(N, chunks, chunk + 1) - row_chunk_begin(N, chunks, chunk);
      EXPECT_TRUE(size == N / chunks || size == N / chunks + 1) << N << " " << chunk;
      if (N > 0) {
        EXPECT_GE(size, 1) << N << " " << chunk;
      }
    }
  }
}

TEST(KernelPartition, BlocksCoverEveryItemOnce) {
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256},
                                  std::size_t{257}, std::size_t{1} << 33}) {
    for (const unsigned block : {32u, 128u, 256u}) {
      const std::size_t covered = static_cast<std::size_t>(blocks_for(count, block)) * block;
      EXPECT_GE(covered, count);
      EXPECT_LT(covered, count + block);
    }
  }
}

// The block reduction's tree, replayed on the host: the same bits as summing pairs
// (i, i + stride) level by level, which is what makes the GPU sums repeatable.
TEST(KernelPartition, BlockTreeSumsPairsLevelByLevel) {
  constexpr int kThreads = 256;
  auto values = random_floats(kThreads, 99, -1.0f, 1.0f);
  std::vector<float> tree = values;
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    for (int slot = 0; slot < kThreads; ++slot) {
      if (reduces_at(slot, stride)) tree[slot] += tree[slot + stride];
    }
  }
  std::vector<float> levels = values;
  for (int width = kThreads; width > 1; width /= 2) {
    std::vector<float> next(width / 2);
    for (int i = 0; i < width / 2; ++i) next[i] = levels[i] + levels[i + width / 2];
    levels = next;
  }
  EXPECT_EQ(tree[0], levels[0]);
  double exact = 0.0;
  for (const float v : values) exact += v;
  EXPECT_NEAR(tree[0], exact, 1e-4);
}

}  // namespace
}  // namespace dufu::trainer
