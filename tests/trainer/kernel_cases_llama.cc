// Kernel test rows of the Llama-family ops: RMSNorm, rotary position embedding, SwiGLU
// (kernel_cases.h), against kernel_reference_llama.h.
#include <cstddef>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_cases.h"
#include "kernel_reference_llama.h"
#include "kernel_test_support.h"

namespace dufu::trainer::testing {

namespace ref = reference;

namespace {

// ---- RMSNorm -----------------------------------------------------------------------

struct RmsNormInputs {
  std::vector<float> x, weight;
  explicit RmsNormInputs(const Shape& s)
      : x(random_floats(static_cast<std::size_t>(s.N()) * s.C, 70, -2.0f, 3.0f)),
        weight(random_floats(s.C, 71, 0.5f, 1.5f)) {}
};

constexpr float kLlama1Eps = 1e-6f;
constexpr float kLlama2Eps = 1e-5f;

Outputs run_rmsnorm_forward(const Shape& s, Device* device, int) {
  const RmsNormInputs in(s);
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> out(in.x.size(), kNaN), rstd(s.N(), kNaN);
    device->kernels().rmsnorm_forward(d.out(out), d.out(rstd), d.in(in.x), d.in(in.weight), kLlama1Eps, s.N(), s.C);
    d.finish();
    return {{"out", widen(out)}, {"rstd", widen(rstd)}};
  }
  Vec out, rstd;
  ref::rmsnorm_forward(out, rstd, widen(in.x), widen(in.weight), kLlama1Eps, s.N(), s.C);
  return {{"out", out}, {"rstd", rstd}};
}

// `in_place` runs with residual_out == residual, which kernel_table.h allows. The
// branch is scaled so that some rows have a small mean square, where eps matters.
Outputs residual_rmsnorm(const Shape& s, Device* device, bool in_place) {
  const RmsNormInputs in(s);
  const auto residual = random_floats(in.x.size(), 72, -0.01f, 0.01f);
  auto branch = random_floats(in.x.size(), 73, -2.0f, 2.0f);
  for (std::size_t i = 0; i < branch.size(); i += 2 * static_cast<std::size_t>(s.C)) {
    for (int c = 0; c < s.C; ++c) branch[i + c] *= 0.002f;  // every other row: mean square ~1e-6
  }
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> residual_buffer = residual;
    std::vector<float> separate_out(in.x.size(), kNaN);
    float* residual_out = in_place ? d.out(residual_buffer) : d.out(separate_out);
    std::vector<float> norm(in.x.size(), kNaN), rstd(s.N(), kNaN);
    device->kernels().residual_rmsnorm_forward(residual_out, d.out(norm), d.out(rstd), d.in(residual_buffer),
                                               d.in(branch), d.in(in.weight), kLlama2Eps, s.N(), s.C);
    d.finish();
    return {{"residual_out", widen(in_place ? residual_buffer : separate_out)},
            {"norm_out", widen(norm)},
            {"rstd", widen(rstd)}};
  }
  Vec sum(in.x.size());
  for (std::size_t i = 0; i < sum.size(); ++i)
    sum[i] = static_cast<double>(static_cast<float>(residual[i] + branch[i]));
  Vec norm, rstd;
  ref::rmsnorm_forward(norm, rstd, sum, widen(in.weight), kLlama2Eps, s.N(), s.C);
  return {{"residual_out", sum}, {"norm_out", norm}, {"rstd", rstd}};
}

Outputs run_residual_rmsnorm_forward(const Shape& s, Device* device, int) {
  return residual_rmsnorm(s, device, false);
}
Outputs run_residual_rmsnorm_forward_in_place(const Shape& s, Device* device, int) {
  return residual_rmsnorm(s, device, true);
}

Outputs run_rmsnorm_backward(const Shape& s, Device* device, int calls) {
  const RmsNormInputs in(s);
  const auto dout = random_floats(in.x.size(), 74);
  const auto dx0 = random_floats(in.x.size(), 75);  // dx accumulates: start from non-zero
  const auto dweight0 = random_floats(s.C, 76);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(in.x.size()), rstd(s.N());
    k.rmsnorm_forward(d.out(out), d.out(rstd), d.in(in.x), d.in(in.weight), kLlama2Eps, s.N(), s.C);
    auto dx = dx0;
    auto dweight = dweight0;
    for (int i = 0; i < calls; ++i) {
      k.rmsnorm_backward(d.out(dx), d.out(dweight), d.in(dout), d.in(in.x), d.in(in.weight), d.in(rstd), s.N(), s.C);
    }
    d.finish();
    return {{"dx", widen(dx)}, {"dweight", widen(dweight)}};
  }
  Vec dx(in.x.size(), 0.0), dweight(s.C, 0.0);
  ref::rmsnorm_backward(dx, dweight, widen(dout), widen(in.x), widen(in.weight), kLlama2Eps, s.N(), s.C);
  return {{"dx", accumulated(dx0, dx, calls)}, {"dweight", accumulated(dweight0, dweight, calls)}};
}

// ---- rotary embedding --------------------------------------------------------------

// The whole buffer comes back, so v (which must stay as it was) is compared too. The
// forward runs at Llama 2's theta, the backward at Llama 3's.
// kPositions: position ids that restart in each packed document (document masking).
template <bool kBackward, bool kPositions = false>
Outputs run_rotary(const Shape& s, Device* device, int) {
  const LlamaDims m = llama_dims(s);
  const float theta = kBackward ? 500000.0f : 10000.0f;
  auto qkv = random_floats(static_cast<std::size_t>(s.N()) * m.qkv_width(), kBackward ? 78 : 77, -2.0f, 2.0f);
  const PackedRows packed = packed_rows(s.B, s.T, 79);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    const std::int32_t* positions = kPositions ? d.in(packed.positions) : nullptr;
    if constexpr (kBackward) {
      k.rotary_backward(d.out(qkv), positions, s.B, s.T, m.NH, m.NKV, m.hs, theta);
    } else {
      k.rotary_forward(d.out(qkv), positions, s.B, s.T, m.NH, m.NKV, m.hs, theta);
    }
    d.finish();
    return {{kBackward ? "dqkv" : "qkv", widen(qkv)}};
  }
  Vec values = widen(qkv);
  ref::rotary(values, s.B, s.T, m.NH, m.NKV, m.hs, theta, kBackward ? -1.0 : 1.0,
              kPositions ? &packed.positions : nullptr);
  return {{kBackward ? "dqkv" : "qkv", values}};
}

// ---- SwiGLU ------------------------------------------------------------------------

// Gates over [-8, 8] reach where sigmoid saturates.
std::vector<float> swiglu_gate_up(const Shape& s) {
  const LlamaDims m = llama_dims(s);
  auto gate_up = random_floats(static_cast<std::size_t>(s.N()) * 2 * m.H, 80, -2.0f, 2.0f);
  const auto gates = random_floats(static_cast<std::size_t>(s.N()) * m.H, 81, -8.0f, 8.0f);
  for (int n = 0; n < s.N(); ++n)
    for (int h = 0; h < m.H; ++h)
      gate_up[static_cast<std::size_t>(n) * 2 * m.H + h] = gates[static_cast<std::size_t>(n) * m.H + h];
  return gate_up;
}

Outputs run_swiglu_forward(const Shape& s, Device* device, int) {
  const LlamaDims m = llama_dims(s);
  const auto gate_up = swiglu_gate_up(s);
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> out(static_cast<std::size_t>(s.N()) * m.H, kNaN);
    device->kernels().swiglu_forward(d.out(out), d.in(gate_up), s.N(), m.H);
    d.finish();
    return {{"out", widen(out)}};
  }
  Vec out;
  ref::swiglu_forward(out, widen(gate_up), s.N(), m.H);
  return {{"out", out}};
}

// dgate_up is overwritten: after two calls it is what one call gives.
Outputs run_swiglu_backward(const Shape& s, Device* device, int calls) {
  const LlamaDims m = llama_dims(s);
  const auto gate_up = swiglu_gate_up(s);
  const auto dout = random_floats(static_cast<std::size_t>(s.N()) * m.H, 82);
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> dgate_up(gate_up.size(), kNaN);
    for (int i = 0; i < calls; ++i) {
      device->kernels().swiglu_backward(d.out(dgate_up), d.in(dout), d.in(gate_up), s.N(), m.H);
    }
    d.finish();
    return {{"dgate_up", widen(dgate_up)}};
  }
  Vec dgate_up;
  ref::swiglu_backward(dgate_up, widen(dout), widen(gate_up), s.N(), m.H);
  return {{"dgate_up", dgate_up}};
}

}  // namespace

// Rotary's tolerance: the kernels form the angle in float as HF does (llama_math.h),
// t * theta^(-2i/hs) rounded to within t * 2^-24 rad, so at T = 150 and |x| <= 2 up to
// 2e-5 from the reference's exact angle. The rotary rows are in place, so a second
// call turns again: they run once, like the classifier.
std::vector<OpCase> llama_op_cases() {
  return {
      {"rmsnorm_forward", run_rmsnorm_forward, {2e-5, 2e-5}, true, true},
      {"residual_rmsnorm_forward", run_residual_rmsnorm_forward, {2e-5, 2e-5}, true, true},
      {"residual_rmsnorm_forward_in_place", run_residual_rmsnorm_forward_in_place, {2e-5, 2e-5}, true, true},
      {"rmsnorm_backward", run_rmsnorm_backward, {5e-5, 5e-5}, true, true},
      {"rotary_forward", run_rotary<false>, {4e-5, 4e-5}, false, true},
      {"rotary_backward", run_rotary<true>, {4e-5, 4e-5}, false, true},
      {"rotary_forward_positions", run_rotary<false, true>, {4e-5, 4e-5}, false, true},
      {"rotary_backward_positions", run_rotary<true, true>, {4e-5, 4e-5}, false, true},
      {"swiglu_forward", run_swiglu_forward, {1e-5, 1e-5}, true, true},
      {"swiglu_backward", run_swiglu_backward, {2e-5, 2e-5}, true, true},
  };
}

}  // namespace dufu::trainer::testing
