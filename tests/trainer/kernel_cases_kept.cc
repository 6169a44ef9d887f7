// Kernel test rows of outputs the bf16 recipe keeps (TensorOut): the kernel that
// computes a tensor rounds it to bf16 as it writes it, and stores its bits beside it
// where asked, instead of a store_bf16 pass after it (kernel_cases.h). Each row checks
// the values against the double reference rounded to bf16 (within a bf16 step: the
// device's fp32 sum may round to the neighbour), and counts the values that are off
// the bf16 grid or differ from their stored bits, which must be none: an entry that
// ignored its TensorOut would leave fp32 values and unwritten bits.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device/bf16.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_cases.h"
#include "kernel_cases_kept.h"
#include "kernel_reference.h"
#include "kernel_test_support.h"

namespace dufu::trainer::testing {

namespace ref = reference;

void add_kept(Outputs& outputs, const std::string& name, const std::vector<float>& values,
              const std::vector<std::uint16_t>* bits) {
  double wrong = 0.0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const bool on_grid = ::dufu::trainer::round_to_bf16(values[i]) == values[i];
    const bool stored = bits == nullptr || bf16_bits_to_float((*bits)[i]) == values[i];
    if (!on_grid || !stored) wrong += 1.0;
  }
  outputs.push_back({name, widen(values)});
  outputs.push_back({name + "_not_kept", Vec{wrong}});
}

void add_kept_reference(Outputs& outputs, const std::string& name, const Vec& exact) {
  Vec rounded(exact.size());
  for (std::size_t i = 0; i < exact.size(); ++i) {
    rounded[i] = ::dufu::trainer::round_to_bf16(static_cast<float>(exact[i]));
  }
  outputs.push_back({name, rounded});
  outputs.push_back({name + "_not_kept", Vec{0.0}});
}

std::vector<float> on_bf16_grid(std::size_t count, std::uint32_t seed, float low, float high) {
  return on_grid<Operands::kBf16>(random_floats(count, seed, low, high));
}

namespace {

// The qkv projection (C -> 3C with bias) on bf16 operands, out kept with its bits.
Outputs run_matmul_forward_kept(const Shape& s, Device* device, int) {
  const int N = s.N(), C = s.C, OC = 3 * s.C;
  const auto x = on_bf16_grid(static_cast<std::size_t>(N) * C, 80);
  const auto weight = on_bf16_grid(static_cast<std::size_t>(OC) * C, 81);
  const auto bias = on_bf16_grid(static_cast<std::size_t>(OC), 82);
  const auto x_bits = bf16_bits(x);
  const auto weight_bits = bf16_bits(weight);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    std::vector<float> out(static_cast<std::size_t>(N) * OC, kNaN);
    std::vector<std::uint16_t> bits(out.size(), kUnwritten);
    device->kernels().matmul_forward({a.out(out), ElementType::kBf16, a.out(bits)}, a.in(x_bits), a.in(weight_bits),
                                     a.in(bias), N, C, OC);
    a.finish();
    add_kept(outputs, "out", out, &bits);
    return outputs;
  }
  Vec out;
  ref::matmul_forward(out, widen(x), widen(weight), widen(bias), N, C, OC);
  add_kept_reference(outputs, "out", out);
  return outputs;
}

// The MLP's first projection (C -> 4C + kWidthPadding; 4 is no multiple of 8, the CUDA
// op's unfused path) with bias and GELU: both outputs kept with their bits, the GELU
// of the pre-activation before it was rounded.
template <int kWidthPadding>
Outputs run_matmul_bias_gelu_forward_kept(const Shape& s, Device* device, int) {
  const int N = s.N(), C = s.C, OC = 4 * s.C + kWidthPadding;
  const auto x = on_bf16_grid(static_cast<std::size_t>(N) * C, 83);
  const auto weight = on_bf16_grid(static_cast<std::size_t>(OC) * C, 84);
  const auto bias = on_bf16_grid(static_cast<std::size_t>(OC), 85);
  const auto x_bits = bf16_bits(x);
  const auto weight_bits = bf16_bits(weight);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    std::vector<float> out(static_cast<std::size_t>(N) * OC, kNaN), pre(out.size(), kNaN);
    std::vector<std::uint16_t> out_bits(out.size(), kUnwritten), pre_bits(out.size(), kUnwritten);
    device->kernels().matmul_bias_gelu_forward({a.out(out), ElementType::kBf16, a.out(out_bits)},
                                               {a.out(pre), ElementType::kBf16, a.out(pre_bits)},
                                               a.in(x_bits), a.in(weight_bits), a.in(bias), N, C, OC);
    a.finish();
    add_kept(outputs, "out", out, &out_bits);
    add_kept(outputs, "pre", pre, &pre_bits);
    return outputs;
  }
  Vec product, out, pre;
  ref::matmul_forward(product, widen(x), widen(weight), Vec(), N, C, OC);
  ref::bias_gelu_forward(out, pre, product, widen(bias), N, OC);
  add_kept_reference(outputs, "out", out);
  add_kept_reference(outputs, "pre", pre);
  return outputs;
}

// A backward's input gradients, rounded where the recipe keeps activation gradients
// (no bits): matmul_backward's dx (the MLP projection, 4C -> C) and, through the GELU,
// matmul_gelu_backward's dpre (its width 4C a multiple of 8: the CUDA epilogue's path).
Outputs run_matmul_backwards_kept(const Shape& s, Device* device, int calls) {
  const int N = s.N(), C = 4 * s.C, OC = s.C;
  const auto x = on_bf16_grid(static_cast<std::size_t>(N) * C, 86);
  const auto weight = on_bf16_grid(static_cast<std::size_t>(OC) * C, 87);
  const auto dout = on_bf16_grid(static_cast<std::size_t>(N) * OC, 88);
  const auto pre = random_floats(x.size(), 89, -4.0f, 4.0f);
  const auto x_bits = bf16_bits(x);
  const auto weight_bits = bf16_bits(weight);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> dx(x.size(), kNaN), dpre(x.size(), kNaN), dweight(weight.size(), 0.0f);
    for (int i = 0; i < calls; ++i) {
      k.matmul_backward({a.out(dx), ElementType::kBf16, nullptr}, a.out(dweight), nullptr, a.in(dout), a.in(x_bits),
                        a.in(weight_bits), N, C, OC);
      k.matmul_gelu_backward({a.out(dpre), ElementType::kBf16, nullptr}, a.out(dweight), nullptr, a.in(dout),
                             a.in(x_bits), a.in(weight_bits), a.in(pre), N, C, OC);
    }
    a.finish();
    add_kept(outputs, "dx", dx, nullptr);
    add_kept(outputs, "dpre", dpre, nullptr);
    return outputs;
  }
  Vec dx, dpre, dweight(weight.size(), 0.0), dbias(OC, 0.0);
  ref::matmul_backward(dx, dweight, dbias, widen(dout), widen(x), widen(weight), N, C, OC);
  ref::matmul_gelu_backward(dpre, dweight, dbias, widen(dout), widen(x), widen(weight), widen(pre), N, C, OC);
  add_kept_reference(outputs, "dx", dx);
  add_kept_reference(outputs, "dpre", dpre);
  return outputs;
}

// Attention (GPT-2's heads, fp32 products) with its output kept with bits and its
// input gradient rounded; the backward reads the fp32 out, so only the keeping of
// dqkv is measured against the reference.
Outputs run_attention_kept(const Shape& s, Device* device, int calls) {
  const ref::AttentionHeads heads{s.NH, s.NH, s.C / s.NH};
  const auto qkv = on_bf16_grid(static_cast<std::size_t>(s.N()) * heads.qkv_width(), 90, -2.0f, 2.0f);
  const auto dout = on_bf16_grid(static_cast<std::size_t>(s.N()) * heads.out_width(), 91);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(static_cast<std::size_t>(s.N()) * heads.out_width(), kNaN);
    std::vector<std::uint16_t> out_bits(out.size(), kUnwritten);
    std::vector<float> lse(static_cast<std::size_t>(s.B) * heads.NH * s.T, kNaN);
    std::vector<float> dqkv(qkv.size(), kNaN), fp32_out(out.size(), kNaN);
    k.attention_forward({a.out(out), ElementType::kBf16, a.out(out_bits)}, a.out(lse), a.in(qkv), nullptr, s.B, s.T,
                        heads.NH, heads.NKV, heads.hs);
    k.attention_forward(a.out(fp32_out), a.out(lse), a.in(qkv), nullptr, s.B, s.T, heads.NH, heads.NKV, heads.hs);
    for (int i = 0; i < calls; ++i) {
      k.attention_backward({a.out(dqkv), ElementType::kBf16, nullptr}, a.in(dout), a.in(qkv), a.out(fp32_out),
                           a.out(lse), nullptr, s.B, s.T, heads.NH, heads.NKV, heads.hs);
    }
    a.finish();
    add_kept(outputs, "out", out, &out_bits);
    add_kept(outputs, "dqkv", dqkv, nullptr);
    return outputs;
  }
  Vec out, lse, dqkv;
  ref::attention_forward(out, lse, widen(qkv), s.B, s.T, heads);
  ref::attention_backward(dqkv, widen(dout), widen(qkv), s.B, s.T, heads);
  add_kept_reference(outputs, "out", out);
  add_kept_reference(outputs, "dqkv", dqkv);
  return outputs;
}

// LayerNorm's backward adding into a residual-stream gradient on the bf16 grid (as the
// model's is) and keeping the sum, rounded. Run once: a second call would round twice.
Outputs run_layernorm_backward_kept(const Shape& s, Device* device, int) {
  const std::size_t n = static_cast<std::size_t>(s.N()) * s.C;
  const auto x = random_floats(n, 92, -2.0f, 3.0f);
  const auto weight = random_floats(s.C, 93, 0.5f, 1.5f);
  const auto bias = random_floats(s.C, 94);
  const auto dout = on_bf16_grid(n, 95);
  const auto dx0 = on_bf16_grid(n, 96);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(n), mean(s.N()), rstd(s.N()), dx = dx0, dweight(s.C, 0.0f), dbias(s.C, 0.0f);
    k.layernorm_forward(a.out(out), a.out(mean), a.out(rstd), a.in(x), a.in(weight), a.in(bias), s.N(), s.C);
    k.layernorm_backward({a.out(dx), ElementType::kBf16, nullptr}, a.out(dweight), a.out(dbias), a.in(dout), a.in(x),
                         a.in(weight), a.in(mean), a.in(rstd), s.N(), s.C);
    a.finish();
    add_kept(outputs, "dx", dx, nullptr);
    return outputs;
  }
  Vec dx(n, 0.0), dweight(s.C, 0.0), dbias(s.C, 0.0);
  ref::layernorm_backward(dx, dweight, dbias, widen(dout), widen(x), widen(weight), s.N(), s.C);
  add_kept_reference(outputs, "dx", accumulated(dx0, dx, 1));
  return outputs;
}

// The classifiers' inputs: a few rows of GPT-2's padded vocabulary, one row ignored.
struct ClassifierKeptInputs {
  int N, V = 50257, Vp = 50304;
  std::vector<float> logits;
  std::vector<std::int32_t> targets;
  float scale;
  ClassifierKeptInputs(const Shape& s, std::uint32_t seed)
      : N(std::min(s.N(), 4)),
        logits(random_floats(static_cast<std::size_t>(N) * Vp, seed, -4.0f, 4.0f)),
        targets(random_tokens(N, V, seed + 1)),
        scale(1.0f / static_cast<float>(N)) {
    if (N > 1) targets[1] = -1;
  }
};

// The losses and the kept gradient of the logits, as the reference computes them.
Outputs classifier_kept_reference(const ClassifierKeptInputs& in) {
  Vec losses, dlogits;
  ref::classifier_losses(losses, widen(in.logits), in.targets, in.N, in.V, in.Vp);
  ref::classifier_grad(dlogits, widen(in.logits), in.targets, in.scale, in.N, in.V, in.Vp);
  Outputs outputs{{"losses", losses}};
  add_kept_reference(outputs, "dlogits", dlogits);
  return outputs;
}

// The classifier keeping the logits' gradient it writes in place; the losses stay fp32.
Outputs run_classifier_kept(const Shape& s, Device* device, int) {
  ClassifierKeptInputs in(s, 97);
  if (device == nullptr) return classifier_kept_reference(in);
  DeviceArgs a(*device);
  std::vector<float> losses(in.N, kNaN);
  // Every bit written, the ignored row's and the padding columns' too (the LM head's
  // backward multiplies them all).
  std::vector<std::uint16_t> bits(in.logits.size(), kUnwritten);
  device->kernels().classifier_forward_backward({a.out(in.logits), ElementType::kBf16, a.out(bits)}, a.out(losses),
                                                a.in(in.targets), in.scale, in.N, in.V, in.Vp);
  a.finish();
  Outputs outputs{{"losses", widen(losses)}};
  add_kept(outputs, "dlogits", in.logits, &bits);
  return outputs;
}

// The vocab-parallel classifier's three phases on one rank holding the whole (padded)
// vocabulary, the last keeping the gradient with its bits.
Outputs run_vocab_parallel_classifier_kept(const Shape& s, Device* device, int) {
  ClassifierKeptInputs in(s, 111);
  if (device == nullptr) return classifier_kept_reference(in);
  DeviceArgs a(*device);
  const KernelTable& k = device->kernels();
  std::vector<float> row_max(in.N, kNaN), losses(in.N, kNaN);
  std::vector<double> stats(2 * static_cast<std::size_t>(in.N), 0.0);
  std::vector<std::uint16_t> bits(in.logits.size(), kUnwritten);
  k.vocab_parallel_classifier_max(a.out(row_max), a.in(in.logits), a.in(in.targets), in.N, in.V, 0, in.Vp);
  k.vocab_parallel_classifier_exp_sum(a.out(stats), a.out(in.logits), a.in(row_max), a.in(in.targets), in.N, in.V,
                                      0, in.Vp);
  k.vocab_parallel_classifier_finish({a.out(in.logits), ElementType::kBf16, a.out(bits)}, a.out(losses), a.in(stats),
                                     a.in(row_max), a.in(in.targets), in.scale, in.N, in.V, 0, in.Vp);
  a.finish();
  Outputs outputs{{"losses", widen(losses)}};
  add_kept(outputs, "dlogits", in.logits, &bits);
  return outputs;
}

}  // namespace

// A bf16 step of the rounding is 2^-8 relative: rtol 1e-2 takes a value that rounded
// to the neighbour of the reference's, atol 1e-5 the fp32 noise of values near 0.
std::vector<OpCase> kept_op_cases() {
  return {
      {"matmul_forward_kept", run_matmul_forward_kept, {1e-5, 1e-2}, true, false},
      {"matmul_bias_gelu_forward_kept", run_matmul_bias_gelu_forward_kept<0>, {1e-5, 1e-2}, true, false},
      {"matmul_bias_gelu_forward_kept_width_not_8", run_matmul_bias_gelu_forward_kept<4>, {1e-5, 1e-2}, true,
       false},
      {"matmul_backwards_kept", run_matmul_backwards_kept, {1e-5, 1e-2}, true, false},
      {"attention_kept", run_attention_kept, {1e-5, 1e-2}, true, true},
      {"layernorm_backward_kept", run_layernorm_backward_kept, {1e-5, 1e-2}, false, true},
      {"classifier_kept", run_classifier_kept, {1e-5, 1e-2}, false, true},
      {"vocab_parallel_classifier_kept", run_vocab_parallel_classifier_kept, {1e-5, 1e-2}, false, true},
  };
}

}  // namespace dufu::trainer::testing
