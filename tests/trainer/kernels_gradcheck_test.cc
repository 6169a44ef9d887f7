// Finite-difference checks of every backward kernel. The loss is a scalar
// L = sum(out * w) with fixed random weights w (w is then the upstream gradient fed to
// the fast backward kernel); its central differences are taken in double through the
// naive forward references, so the check is independent of both the fast forward
// kernels and the reference backward formulas.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_cases.h"
#include "kernel_reference.h"
#include "kernel_reference_llama.h"
#include "kernel_test_support.h"

namespace dufu::trainer {
namespace {

namespace ref = reference;
using testing::DeviceArgs;
using testing::kTestDevices;
using testing::llama_dims;
using testing::LlamaDims;
using testing::random_floats;
using testing::random_tokens;
using testing::Shape;
using testing::TestDevice;
using testing::Tolerance;
using testing::Vec;
using testing::widen;

// Small enough to difference every input; fd_t1 has T = 1, NH = 1 and V = Vp.
const Shape kGradShapes[] = {
    {"fd", 2, 4, 10, 2, 5, 8},
    {"fd_t1", 1, 1, 6, 1, 3, 3},
};

// With O(1) inputs, h = 1e-5 makes the O(h^2) truncation and the O(1e-16 / h) rounding
// of the double differences both far below the float error of the kernels checked.
constexpr double kStep = 1e-5;
// The fast backward kernels are float: a few ulps of O(1) gradients, with margin.
constexpr Tolerance kTolerance{2e-5, 2e-5};

double weighted_sum(const Vec& out, const Vec& weights) {
  double sum = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) sum += out[i] * weights[i];
  return sum;
}

// dL/dx by central differences; `loss` reads x, which is perturbed in place and restored.
Vec numeric_gradient(Vec& x, const std::function<double()>& loss) {
  Vec grad(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double plus = loss();
    x[i] = saved - kStep;
    const double minus = loss();
    x[i] = saved;
    grad[i] = (plus - minus) / (2 * kStep);
  }
  return grad;
}

struct Check {
  std::string name;
  Vec analytic;  // from the fast backward kernel
  Vec numeric;   // central differences of the reference forward
};
using Checks = std::vector<Check>;

Checks embedding(const Shape& s, Device& device) {
  const auto tokens = random_tokens(s.N(), 2, 1);  // two tokens: rows collide in dwte
  const auto wte = random_floats(static_cast<std::size_t>(s.Vp) * s.C, 2);
  const auto wpe = random_floats(static_cast<std::size_t>(s.T) * s.C, 3);
  const auto w = random_floats(static_cast<std::size_t>(s.N()) * s.C, 4);
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.embedding_backward(d.arg(dwte), d.arg(dwpe), d.arg(w), d.arg(tokens), nullptr, s.B, s.T, s.C);
  d.finish();

  Vec wte_d = widen(wte), wpe_d = widen(wpe);
  const auto loss = [&] {
    Vec out;
    ref::embedding_forward(out, tokens, wte_d, wpe_d, s.B, s.T, s.C);
    return weighted_sum(out, widen(w));
  };
  return {{"dwte", widen(dwte), numeric_gradient(wte_d, loss)}, {"dwpe", widen(dwpe), numeric_gradient(wpe_d, loss)}};
}

Checks layernorm(const Shape& s, Device& device) {
  const int N = s.N(), C = s.C;
  const auto x = random_floats(static_cast<std::size_t>(N) * C, 10, -2.0f, 3.0f);
  const auto weight = random_floats(C, 11, 0.5f, 1.5f);
  const auto bias = random_floats(C, 12);
  const auto w = random_floats(x.size(), 13);
  std::vector<float> out(x.size()), mean(N), rstd(N);
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.layernorm_forward(d.arg(out), d.arg(mean), d.arg(rstd), d.arg(x), d.arg(weight), d.arg(bias), N, C);
  std::vector<float> dx(x.size(), 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
  k.layernorm_backward(d.arg(dx), d.arg(dweight), d.arg(dbias), d.arg(w), d.arg(x), d.arg(weight), d.arg(mean),
                       d.arg(rstd), N, C);
  d.finish();

  Vec x_d = widen(x), weight_d = widen(weight), bias_d = widen(bias);
  const auto loss = [&] {
    Vec o, m, r;
    ref::layernorm_forward(o, m, r, x_d, weight_d, bias_d, N, C);
    return weighted_sum(o, widen(w));
  };
  return {{"dx", widen(dx), numeric_gradient(x_d, loss)},
          {"dweight", widen(dweight), numeric_gradient(weight_d, loss)},
          {"dbias", widen(dbias), numeric_gradient(bias_d, loss)}};
}

// The residual-fused forward has no backward of its own: the model seeds the residual
// gradient with the upstream one and lets layernorm_backward accumulate into it, and
// residual and branch then share that gradient. This checks that recipe.
Checks residual_layernorm(const Shape& s, Device& device) {
  const int N = s.N(), C = s.C;
  const auto residual = random_floats(static_cast<std::size_t>(N) * C, 20, -2.0f, 2.0f);
  const auto branch = random_floats(residual.size(), 21);
  const auto weight = random_floats(C, 22, 0.5f, 1.5f);
  const auto bias = random_floats(C, 23);
  const auto w_residual = random_floats(residual.size(), 24);
  const auto w_norm = random_floats(residual.size(), 25);
  std::vector<float> residual_out(residual.size()), norm(residual.size()), mean(N), rstd(N);
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.residual_layernorm_forward(d.arg(residual_out), d.arg(norm), d.arg(mean), d.arg(rstd), d.arg(residual),
                               d.arg(branch), d.arg(weight), d.arg(bias), N, C);
  std::vector<float> dresidual = w_residual, dweight(C, 0.0f), dbias(C, 0.0f);
  k.layernorm_backward(d.arg(dresidual), d.arg(dweight), d.arg(dbias), d.arg(w_norm), d.arg(residual_out),
                       d.arg(weight), d.arg(mean), d.arg(rstd), N, C);
  d.finish();

  Vec residual_d = widen(residual), branch_d = widen(branch), weight_d = widen(weight), bias_d = widen(bias);
  const auto loss = [&] {
    Vec sum(residual_d.size()), o, m, r;
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = residual_d[i] + branch_d[i];
    ref::layernorm_forward(o, m, r, sum, weight_d, bias_d, N, C);
    return weighted_sum(sum, widen(w_residual)) + weighted_sum(o, widen(w_norm));
  };
  return {{"dresidual", widen(dresidual), numeric_gradient(residual_d, loss)},
          {"dbranch", widen(dresidual), numeric_gradient(branch_d, loss)},
          {"dweight", widen(dweight), numeric_gradient(weight_d, loss)},
          {"dbias", widen(dbias), numeric_gradient(bias_d, loss)}};
}

Checks matmul(const Shape& s, Device& device) {
  const int N = s.N(), C = s.C, OC = 3 * s.C;
  const auto x = random_floats(static_cast<std::size_t>(N) * C, 30);
  const auto weight = random_floats(static_cast<std::size_t>(OC) * C, 31);
  const auto bias = random_floats(OC, 32);
  const auto w = random_floats(static_cast<std::size_t>(N) * OC, 33);
  std::vector<float> dx(x.size()), dweight(weight.size(), 0.0f), dbias(OC, 0.0f);
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.matmul_backward(d.arg(dx), d.arg(dweight), d.arg(dbias), d.arg(w), d.arg(x), d.arg(weight), N, C, OC);
  d.finish();

  Vec x_d = widen(x), weight_d = widen(weight), bias_d = widen(bias);
  const auto loss = [&] {
    Vec out;
    ref::matmul_forward(out, x_d, weight_d, bias_d, N, C, OC);
    return weighted_sum(out, widen(w));
  };
  return {{"dx", widen(dx), numeric_gradient(x_d, loss)},
          {"dweight", widen(dweight), numeric_gradient(weight_d, loss)},
          {"dbias", widen(dbias), numeric_gradient(bias_d, loss)}};
}

// The MLP's second projection through the GELU before it: L = sum(w * (gelu(pre) ·
// weight^T + bias)), differenced in pre, weight and bias; the kernel takes the forward's
// x = gelu(pre) (bias_gelu_forward's float values) beside pre.
Checks matmul_gelu(const Shape& s, Device& device) {
  const int N = s.N(), H = 4 * s.C, OC = s.C;
  const auto pre_in = random_floats(static_cast<std::size_t>(N) * H, 40, -4.0f, 4.0f);
  const auto weight = random_floats(static_cast<std::size_t>(OC) * H, 41);
  const auto bias = random_floats(OC, 42);
  const auto w = random_floats(static_cast<std::size_t>(N) * OC, 43);
  const std::vector<float> zero_bias(H, 0.0f);
  std::vector<float> x(pre_in.size()), pre(pre_in.size());
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.bias_gelu_forward(d.arg(x), d.arg(pre), d.arg(pre_in), d.arg(zero_bias), N, H);
  std::vector<float> dpre(pre.size()), dweight(weight.size(), 0.0f), dbias(OC, 0.0f);
  k.matmul_gelu_backward(d.arg(dpre), d.arg(dweight), d.arg(dbias), d.arg(w), d.arg(x), d.arg(weight), d.arg(pre), N, H,
                         OC);
  d.finish();

  Vec pre_d = widen(pre_in), weight_d = widen(weight), bias_d = widen(bias);
  const auto loss = [&] {
    Vec hidden(pre_d.size()), out;
    for (std::size_t i = 0; i < hidden.size(); ++i) hidden[i] = ref::gelu(pre_d[i]);
    ref::matmul_forward(out, hidden, weight_d, bias_d, N, H, OC);
    return weighted_sum(out, widen(w));
  };
  return {{"dpre", widen(dpre), numeric_gradient(pre_d, loss)},
          {"dweight", widen(dweight), numeric_gradient(weight_d, loss)},
          {"dbias", widen(dbias), numeric_gradient(bias_d, loss)}};
}

Checks attention_with_heads(const Shape& s, const ref::AttentionHeads& a, Device& device) {
  const auto qkv = random_floats(static_cast<std::size_t>(s.N()) * a.qkv_width(), 50, -2.0f, 2.0f);
  const auto w = random_floats(static_cast<std::size_t>(s.N()) * a.out_width(), 51);
  std::vector<float> out(w.size()), lse(static_cast<std::size_t>(s.B) * a.NH * s.T), dqkv(qkv.size());
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.attention_forward(d.arg(out), d.arg(lse), d.arg(qkv), nullptr, s.B, s.T, a.NH, a.NKV, a.hs);
  k.attention_backward(d.arg(dqkv), d.arg(w), d.arg(qkv), d.arg(out), d.arg(lse), nullptr, s.B, s.T, a.NH, a.NKV, a.hs);
  d.finish();

  Vec qkv_d = widen(qkv);
  const auto loss = [&] {
    Vec o, l;
    ref::attention_forward(o, l, qkv_d, s.B, s.T, a);
    return weighted_sum(o, widen(w));
  };
  return {{"dqkv", widen(dqkv), numeric_gradient(qkv_d, loss)}};
}

Checks attention(const Shape& s, Device& device) {
  return attention_with_heads(s, {s.NH, s.NH, s.C / s.NH}, device);
}

// Three query heads per K/V head: fd has 6 query heads over 2 K/V heads, fd_t1 3 over
// 1 (multi-query), so dk and dv sum over a group.
Checks grouped_attention(const Shape& s, Device& device) {
  return attention_with_heads(s, {3 * s.NH, s.NH, s.C / s.NH}, device);
}

// L = scale * sum of the row losses, the mean loss when scale = 1/N; the kernel's
// in-place output is dL/dlogits, including zeros in the padding and ignored rows.
Checks classifier(const Shape& s, Device& device) {
  const int N = s.N();
  auto logits = random_floats(static_cast<std::size_t>(N) * s.Vp, 60, -3.0f, 3.0f);
  auto targets = random_tokens(N, s.V, 61);
  if (N > 1) targets[N - 1] = -1;
  const float scale = 1.0f / static_cast<float>(N);
  Vec logits_d = widen(logits);
  std::vector<float> losses(N);
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.classifier_forward_backward(d.arg(logits), d.arg(losses), d.arg(targets), scale, N, s.V, s.Vp);
  d.finish();

  const auto loss = [&] {
    Vec row_losses;
    ref::classifier_losses(row_losses, logits_d, targets, N, s.V, s.Vp);
    double sum = 0.0;
    for (const double l : row_losses) sum += l;
    return static_cast<double>(scale) * sum;
  };
  return {{"dlogits", widen(logits), numeric_gradient(logits_d, loss)}};
}

// ---- the Llama-family ops ----

constexpr float kRmsNormEps = 1e-5f;

Checks rmsnorm(const Shape& s, Device& device) {
  const int N = s.N(), C = s.C;
  const auto x = random_floats(static_cast<std::size_t>(N) * C, 70, -2.0f, 3.0f);
  const auto weight = random_floats(C, 71, 0.5f, 1.5f);
  const auto w = random_floats(x.size(), 72);
  std::vector<float> out(x.size()), rstd(N);
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.rmsnorm_forward(d.arg(out), d.arg(rstd), d.arg(x), d.arg(weight), kRmsNormEps, N, C);
  std::vector<float> dx(x.size(), 0.0f), dweight(C, 0.0f);
  k.rmsnorm_backward(d.arg(dx), d.arg(dweight), d.arg(w), d.arg(x), d.arg(weight), d.arg(rstd), N, C);
  d.finish();

  Vec x_d = widen(x), weight_d = widen(weight);
  const auto loss = [&] {
    Vec o, r;
    ref::rmsnorm_forward(o, r, x_d, weight_d, kRmsNormEps, N, C);
    return weighted_sum(o, widen(w));
  };
  return {{"dx", widen(dx), numeric_gradient(x_d, loss)},
          {"dweight", widen(dweight), numeric_gradient(weight_d, loss)}};
}

// The residual-fused RMSNorm's recipe, as residual_layernorm's above: the residual
// gradient seeded with the upstream one, rmsnorm_backward accumulating into it.
Checks residual_rmsnorm(const Shape& s, Device& device) {
  const int N = s.N(), C = s.C;
  const auto residual = random_floats(static_cast<std::size_t>(N) * C, 73, -2.0f, 2.0f);
  const auto branch = random_floats(residual.size(), 74);
  const auto weight = random_floats(C, 75, 0.5f, 1.5f);
  const auto w_residual = random_floats(residual.size(), 76);
  const auto w_norm = random_floats(residual.size(), 77);
  std::vector<float> residual_out(residual.size()), norm(residual.size()), rstd(N);
  DeviceArgs d(device);
  const KernelTable& k = device.kernels();
  k.residual_rmsnorm_forward(d.arg(residual_out), d.arg(norm), d.arg(rstd), d.arg(residual), d.arg(branch),
                             d.arg(weight), kRmsNormEps, N, C);
  std::vector<float> dresidual = w_residual, dweight(C, 0.0f);
  k.rmsnorm_backward(d.arg(dresidual), d.arg(dweight), d.arg(w_norm), d.arg(residual_out), d.arg(weight),
                     d.arg(rstd), N, C);
  d.finish();

  Vec residual_d = widen(residual), branch_d = widen(branch), weight_d = widen(weight);
  const auto loss = [&] {
    Vec sum(residual_d.size()), o, r;
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = residual_d[i] + branch_d[i];
    ref::rmsnorm_forward(o, r, sum, weight_d, kRmsNormEps, N, C);
    return weighted_sum(sum, widen(w_residual)) + weighted_sum(o, widen(w_norm));
  };
  return {{"dresidual", widen(dresidual), numeric_gradient(residual_d, loss)},
          {"dbranch", widen(dresidual), numeric_gradient(branch_d, loss)},
          {"dweight", widen(dweight), numeric_gradient(weight_d, loss)}};
}

// The rotary backward against differences of the reference forward: a backward that
// turned the gradient by +angle (the forward's sign) fails here at every t > 0.
Checks rotary(const Shape& s, Device& device) {
  const LlamaDims m = llama_dims(s);
  const float theta = 10000.0f;
  const auto qkv = random_floats(static_cast<std::size_t>(s.N()) * m.qkv_width(), 78, -2.0f, 2.0f);
  const auto w = random_floats(qkv.size(), 79);
  std::vector<float> dqkv = w;
  DeviceArgs d(device);
  device.kernels().rotary_backward(d.arg(dqkv), nullptr, s.B, s.T, m.NH, m.NKV, m.hs, theta);
  d.finish();

  Vec qkv_d = widen(qkv);
  const auto loss = [&] {
    Vec rotated = qkv_d;
    ref::rotary(rotated, s.B, s.T, m.NH, m.NKV, m.hs, theta);
    return weighted_sum(rotated, widen(w));
  };
  return {{"dqkv", widen(dqkv), numeric_gradient(qkv_d, loss)}};
}

Checks swiglu(const Shape& s, Device& device) {
  const LlamaDims m = llama_dims(s);
  const auto gate_up = random_floats(static_cast<std::size_t>(s.N()) * 2 * m.H, 80, -4.0f, 4.0f);
  const auto w = random_floats(static_cast<std::size_t>(s.N()) * m.H, 81);
  std::vector<float> dgate_up(gate_up.size());
  DeviceArgs d(device);
  device.kernels().swiglu_backward(d.arg(dgate_up), d.arg(w), d.arg(gate_up), s.N(), m.H);
  d.finish();

  Vec gate_up_d = widen(gate_up);
  const auto loss = [&] {
    Vec out;
    ref::swiglu_forward(out, gate_up_d, s.N(), m.H);
    return weighted_sum(out, widen(w));
  };
  return {{"dgate_up", widen(dgate_up), numeric_gradient(gate_up_d, loss)}};
}

struct GradCase {
  const char* name;
  Checks (*run)(const Shape&, Device&);
};

const GradCase kGradCases[] = {
    {"embedding_backward", embedding},
    {"layernorm_backward", layernorm},
    {"residual_layernorm_forward+layernorm_backward", residual_layernorm},
    {"matmul_backward", matmul},
    {"matmul_gelu_backward", matmul_gelu},
    {"attention_backward", attention},
    {"attention_backward_grouped", grouped_attention},
    {"classifier_forward_backward", classifier},
    {"rmsnorm_backward", rmsnorm},
    {"residual_rmsnorm_forward+rmsnorm_backward", residual_rmsnorm},
    {"rotary_backward", rotary},
    {"swiglu_backward", swiglu},
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

// One row per (device, backward, shape); a device that is not here is skipped with the
// reason.
using GradParam = std::tuple<TestDevice, GradCase, Shape>;
class GradCheck : public ::testing::TestWithParam<GradParam> {};

TEST_P(GradCheck, BackwardMatchesFiniteDifferences) {
  const auto& [test_device, grad_case, shape] = GetParam();
  const DeviceAvailability availability = device_availability(test_device.kind);
  if (!availability.available) GTEST_SKIP() << test_device.name << " skipped: " << availability.reason;
  for (const Check& check : grad_case.run(shape, device_of_kind(test_device.kind))) {
    testing::report_close(
        std::string(test_device.name) + " " + grad_case.name + "[" + shape.name + "]." + check.name + " vs FD",
        check.analytic, check.numeric, kTolerance);
  }
}

std::string grad_case_name(const ::testing::TestParamInfo<GradParam>& info) {
  std::string name = std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name + "_" +
                     std::get<2>(info.param).name;
  for (char& c : name) {
    if (c == '+') c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllBackwards, GradCheck,
                         ::testing::Combine(::testing::ValuesIn(kTestDevices), ::testing::ValuesIn(kGradCases),
                                            ::testing::ValuesIn(kGradShapes)),
                         grad_case_name);

}  // namespace
}  // namespace dufu::trainer
