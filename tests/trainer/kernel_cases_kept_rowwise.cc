// Kernel test rows of the row-wise and element-wise kernels that keep their output
// under the bf16 recipe (TensorOut): the embeddings, the norms' forwards, the residual
// add, rotary and SwiGLU. Each kept output
// is checked as kernel_cases_kept.h says: against the double reference rounded to bf16,
// and none of its values off the grid or unlike its stored bits. The inputs are not on
// the bf16 grid, so an entry that ignored its TensorOut would leave values off it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_cases.h"
#include "kernel_cases_kept.h"
#include "kernel_reference.h"
#include "kernel_reference_llama.h"
#include "kernel_test_support.h"

namespace dufu::trainer::testing {

namespace ref = reference;

namespace {

constexpr ElementType kBf16 = ElementType::kBf16;

// Both embeddings (the vocab-parallel one over the whole table, as one rank of one
// holds it), the serial one's bits stored.
Outputs run_embedding_forwards_kept(const Shape& s, Device* device, int) {
  const EmbeddingInputs in(s);
  const std::size_t n = static_cast<std::size_t>(s.N()) * s.C;
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(n, kNaN), vocab_parallel_out(n, kNaN);
    std::vector<std::uint16_t> bits(n, kUnwritten);
    k.embedding_forward({a.out(out), kBf16, a.out(bits)}, a.in(in.tokens), nullptr, a.in(in.wte), a.in(in.wpe), s.B, s.T, s.C);
    k.vocab_parallel_embedding_forward({a.out(vocab_parallel_out), kBf16, nullptr}, a.in(in.tokens), nullptr, a.in(in.wte),
                                       a.in(in.wpe), 0, s.Vp, s.B, s.T, s.C);
    a.finish();
    add_kept(outputs, "out", out, &bits);
    add_kept(outputs, "vocab_parallel_out", vocab_parallel_out, nullptr);
    return outputs;
  }
  Vec out;
  ref::embedding_forward(out, in.tokens, widen(in.wte), widen(in.wpe), s.B, s.T, s.C);
  add_kept_reference(outputs, "out", out);
  add_kept_reference(outputs, "vocab_parallel_out", out);
  return outputs;
}

// LayerNorm's output kept with its bits; its statistics stay fp32, those of x.
Outputs run_layernorm_forward_kept(const Shape& s, Device* device, int) {
  const std::size_t n = static_cast<std::size_t>(s.N()) * s.C;
  const auto x = random_floats(n, 100, -2.0f, 3.0f);
  const auto weight = random_floats(s.C, 101, 0.5f, 1.5f);
  const auto bias = random_floats(s.C, 102);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    std::vector<float> out(n, kNaN), mean(s.N(), kNaN), rstd(s.N(), kNaN);
    std::vector<std::uint16_t> bits(n, kUnwritten);
    device->kernels().layernorm_forward({a.out(out), kBf16, a.out(bits)}, a.out(mean), a.out(rstd), a.in(x),
                                        a.in(weight), a.in(bias), s.N(), s.C);
    a.finish();
    add_kept(outputs, "out", out, &bits);
    outputs.push_back({"mean", widen(mean)});
    outputs.push_back({"rstd", widen(rstd)});
    return outputs;
  }
  Vec out, mean, rstd;
  ref::layernorm_forward(out, mean, rstd, widen(x), widen(weight), widen(bias), s.N(), s.C);
  add_kept_reference(outputs, "out", out);
  outputs.push_back({"mean", mean});
  outputs.push_back({"rstd", rstd});
  return outputs;
}

Outputs run_rmsnorm_forward_kept(const Shape& s, Device* device, int) {
  const std::size_t n = static_cast<std::size_t>(s.N()) * s.C;
  const auto x = random_floats(n, 103, -2.0f, 3.0f);
  const auto weight = random_floats(s.C, 104, 0.5f, 1.5f);
  constexpr float kEps = 1e-5f;
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    std::vector<float> out(n, kNaN), rstd(s.N(), kNaN);
    std::vector<std::uint16_t> bits(n, kUnwritten);
    device->kernels().rmsnorm_forward({a.out(out), kBf16, a.out(bits)}, a.out(rstd), a.in(x), a.in(weight), kEps,
                                      s.N(), s.C);
    a.finish();
    add_kept(outputs, "out", out, &bits);
    outputs.push_back({"rstd", widen(rstd)});
    return outputs;
  }
  Vec out, rstd;
  ref::rmsnorm_forward(out, rstd, widen(x), widen(weight), kEps, s.N(), s.C);
  add_kept_reference(outputs, "out", out);
  outputs.push_back({"rstd", rstd});
  return outputs;
}

// The residual add at the end of a pipeline stage, its sum kept with bits.
Outputs run_add_kept(const Shape& s, Device* device, int) {
  const std::size_t n = static_cast<std::size_t>(s.N()) * s.C;
  const auto x = random_floats(n, 105, -2.0f, 2.0f);
  const auto y = random_floats(n, 106, -2.0f, 2.0f);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    std::vector<float> sum(n, kNaN);
    std::vector<std::uint16_t> bits(n, kUnwritten);
    device->kernels().add({a.out(sum), kBf16, a.out(bits)}, a.in(x), a.in(y), n);
    a.finish();
    add_kept(outputs, "sum", sum, &bits);
    return outputs;
  }
  Vec sum(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = static_cast<double>(x[i]) + static_cast<double>(y[i]);
  add_kept_reference(outputs, "sum", sum);
  return outputs;
}

// Rotary in place: the whole buffer kept, the v heads (not turned) too. The forward
// stores bits, the backward (an activation gradient) only rounds.
template <bool kBackward>
Outputs run_rotary_kept(const Shape& s, Device* device, int) {
  const LlamaDims m = llama_dims(s);
  constexpr float kTheta = 10000.0f;
  auto qkv = random_floats(static_cast<std::size_t>(s.N()) * m.qkv_width(), kBackward ? 108 : 107, -2.0f, 2.0f);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<std::uint16_t> bits(qkv.size(), kUnwritten);
    if constexpr (kBackward) {
      k.rotary_backward({a.out(qkv), kBf16, nullptr}, nullptr, s.B, s.T, m.NH, m.NKV, m.hs, kTheta);
    } else {
      k.rotary_forward({a.out(qkv), kBf16, a.out(bits)}, nullptr, s.B, s.T, m.NH, m.NKV, m.hs, kTheta);
    }
    a.finish();
    add_kept(outputs, "qkv", qkv, kBackward ? nullptr : &bits);
    return outputs;
  }
  Vec values = widen(qkv);
  ref::rotary(values, s.B, s.T, m.NH, m.NKV, m.hs, kTheta, kBackward ? -1.0 : 1.0);
  add_kept_reference(outputs, "qkv", values);
  return outputs;
}

// SwiGLU's output kept with bits; its backward's gradient (overwritten) rounded.
Outputs run_swiglu_kept(const Shape& s, Device* device, int calls) {
  const LlamaDims m = llama_dims(s);
  const std::size_t hidden = static_cast<std::size_t>(s.N()) * m.H;
  const auto gate_up = random_floats(2 * hidden, 109, -4.0f, 4.0f);
  const auto dout = random_floats(hidden, 110);
  Outputs outputs;
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(hidden, kNaN), dgate_up(2 * hidden, kNaN);
    std::vector<std::uint16_t> bits(hidden, kUnwritten);
    for (int i = 0; i < calls; ++i) {
      k.swiglu_forward({a.out(out), kBf16, a.out(bits)}, a.in(gate_up), s.N(), m.H);
      k.swiglu_backward({a.out(dgate_up), kBf16, nullptr}, a.in(dout), a.in(gate_up), s.N(), m.H);
    }
    a.finish();
    add_kept(outputs, "out", out, &bits);
    add_kept(outputs, "dgate_up", dgate_up, nullptr);
    return outputs;
  }
  Vec out, dgate_up;
  ref::swiglu_forward(out, widen(gate_up), s.N(), m.H);
  ref::swiglu_backward(dgate_up, widen(dout), widen(gate_up), s.N(), m.H);
  add_kept_reference(outputs, "out", out);
  add_kept_reference(outputs, "dgate_up", dgate_up);
  return outputs;
}

}  // namespace

// The tolerance of kernel_cases_kept.cc's rows: a bf16 step (rtol 1e-2) and fp32 noise
// near 0. The in-place rotary rows run once.
std::vector<OpCase> kept_rowwise_op_cases() {
  return {
      {"embedding_forwards_kept", run_embedding_forwards_kept, {1e-5, 1e-2}, true, true},
      {"layernorm_forward_kept", run_layernorm_forward_kept, {1e-5, 1e-2}, true, true},
      {"rmsnorm_forward_kept", run_rmsnorm_forward_kept, {1e-5, 1e-2}, true, true},
      {"add_kept", run_add_kept, {1e-5, 1e-2}, true, true},
      {"rotary_forward_kept", run_rotary_kept<false>, {1e-5, 1e-2}, false, true},
      {"rotary_backward_kept", run_rotary_kept<true>, {1e-5, 1e-2}, false, true},
      {"swiglu_kept", run_swiglu_kept, {1e-5, 1e-2}, true, true},
  };
}

}  // namespace dufu::trainer::testing
