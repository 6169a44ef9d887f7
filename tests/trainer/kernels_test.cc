// Every kernel of every device against its naive double-precision reference
// (kernel_reference.h), through one parameterised harness over devices x ops x
// shapes: each run uploads its inputs to the device, calls the op from the device's
// kernel table and downloads the outputs. A device that is not present here is
// listed with the reason, and its rows are skipped saying so. The same op table
// drives the contract tests: backward kernels accumulate parameter gradients and
// overwrite (or accumulate) activation gradients as kernel_table.h says, are bitwise
// repeatable, and (on the CPU) agree across OpenMP thread counts. AdamW also gets a
// multi-step check against torch.optim.AdamW's formula and against numbers printed by
// torch itself.
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

#include "dufu/trainer/device.h"
#include "dufu/trainer/kernel_math.h"
#include "dufu/trainer/kernel_partition.h"
#include "dufu/trainer/kernel_table.h"
#include "kernel_reference.h"
#include "kernel_test_support.h"

// From OpenBLAS's cblas.h, which the trainer library keeps private.
extern "C" int openblas_get_num_threads(void);

namespace dufu::trainer {
namespace {

namespace ref = reference;
using testing::DeviceArgs;
using testing::kNaN;
using testing::kTestDevices;
using testing::random_floats;
using testing::random_tokens;
using testing::Shape;
using testing::TestDevice;
using testing::Tolerance;
using testing::Vec;
using testing::widen;

// The shapes cover: T = 1 and NH = 1 (tiny); head sizes 4 and 5 with C not a multiple
// of 8 and Vp > V (odd, c20); several 64-wide column blocks and layernorm row chunks
// (mid, wide); N not a multiple of the 16-row sgemm split (mid); attention's 64-row
// query blocks, one full (wide) and several with a ragged last one (long).
const Shape kShapes[] = {
    {"tiny", 1, 1, 8, 1, 5, 8},           //
    {"odd", 2, 5, 12, 3, 7, 16},          //
    {"c20", 3, 7, 20, 4, 11, 13},         //
    {"mid", 3, 11, 72, 6, 301, 320},      //
    {"wide", 4, 64, 200, 4, 1000, 1024},  //
    {"long", 2, 150, 24, 2, 50, 64},
};

struct Output {
  std::string name;
  Vec values;
};
using Outputs = std::vector<Output>;

// Runs the op on `device`, or its reference when device is null. `calls` is how many
// times a backward kernel runs on the same buffers: the reference answer is init +
// calls * gradient for accumulated outputs and the gradient alone for overwritten
// ones, which tests the accumulate/overwrite contract of kernel_table.h.
using RunFn = Outputs (*)(const Shape&, Device* device, int calls);

struct OpCase {
  const char* name;
  RunFn run;
  Tolerance tol;
  bool repeatable_calls;                // false for the in-place classifier, which consumes its input
  bool same_bits_for_any_thread_count;  // all but matmul, whose OpenBLAS kernel depends on the block size
};

void PrintTo(const OpCase& op, std::ostream* os) { *os << op.name; }

// init + calls * grad, for a gradient the reference computed from zero.
Vec accumulated(const std::vector<float>& init, const Vec& grad, int calls) {
  Vec out = widen(init);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] += calls * grad[i];
  return out;
}

// ---- embedding ---------------------------------------------------------------------

// The inputs of the embedding forwards (serial and vocab-parallel).
struct EmbeddingInputs {
  std::vector<std::int32_t> tokens;
  std::vector<float> wte, wpe;
  explicit EmbeddingInputs(const Shape& s)
      : tokens(random_tokens(s.N(), s.V, 1)),
        wte(random_floats(static_cast<std::size_t>(s.Vp) * s.C, 2)),
        wpe(random_floats(static_cast<std::size_t>(s.T) * s.C, 3)) {}
};

// The inputs of the embedding backwards: a small vocabulary makes positions share
// tokens, so the dwte scatter collides.
struct EmbeddingGradInputs {
  std::vector<std::int32_t> tokens;
  std::vector<float> dout, dwte0, dwpe0;
  explicit EmbeddingGradInputs(const Shape& s)
      : tokens(random_tokens(s.N(), std::min(s.V, 4), 4)),
        dout(random_floats(static_cast<std::size_t>(s.N()) * s.C, 5)),
        dwte0(random_floats(static_cast<std::size_t>(s.Vp) * s.C, 6)),
        dwpe0(random_floats(static_cast<std::size_t>(s.T) * s.C, 7)) {}
};

Outputs run_embedding_forward(const Shape& s, Device* device, int) {
  const auto [tokens, wte, wpe] = EmbeddingInputs(s);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(static_cast<std::size_t>(s.N()) * s.C, kNaN);
    k.embedding_forward(d.out(out), d.in(tokens), d.in(wte), d.in(wpe), s.B, s.T, s.C);
    d.finish();
    return {{"out", widen(out)}};
  }
  Vec out;
  ref::embedding_forward(out, tokens, widen(wte), widen(wpe), s.B, s.T, s.C);
  return {{"out", out}};
}

Outputs run_embedding_backward(const Shape& s, Device* device, int calls) {
  const auto [tokens, dout, dwte0, dwpe0] = EmbeddingGradInputs(s);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    auto dwte = dwte0;
    auto dwpe = dwpe0;
    for (int i = 0; i < calls; ++i)
      k.embedding_backward(d.out(dwte), d.out(dwpe), d.in(dout), d.in(tokens), s.B, s.T, s.C);
    d.finish();
    return {{"dwte", widen(dwte)}, {"dwpe", widen(dwpe)}};
  }
  Vec dwte(dwte0.size(), 0.0), dwpe(dwpe0.size(), 0.0);
  ref::embedding_backward(dwte, dwpe, widen(dout), tokens, s.B, s.T, s.C);
  return {{"dwte", accumulated(dwte0, dwte, calls)}, {"dwpe", accumulated(dwpe0, dwpe, calls)}};
}

// ---- layernorm ---------------------------------------------------------------------

struct LayerNormInputs {
  std::vector<float> x, weight, bias;
  explicit LayerNormInputs(const Shape& s)
      : x(random_floats(static_cast<std::size_t>(s.N()) * s.C, 10, -2.0f, 3.0f)),  // mean far from 0
        weight(random_floats(s.C, 11, 0.5f, 1.5f)),
        bias(random_floats(s.C, 12)) {}
};

Outputs run_layernorm_forward(const Shape& s, Device* device, int) {
  const LayerNormInputs in(s);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(in.x.size(), kNaN), mean(s.N(), kNaN), rstd(s.N(), kNaN);
    k.layernorm_forward(d.out(out), d.out(mean), d.out(rstd), d.in(in.x), d.in(in.weight), d.in(in.bias), s.N(), s.C);
    d.finish();
    return {{"out", widen(out)}, {"mean", widen(mean)}, {"rstd", widen(rstd)}};
  }
  Vec out, mean, rstd;
  ref::layernorm_forward(out, mean, rstd, widen(in.x), widen(in.weight), widen(in.bias), s.N(), s.C);
  return {{"out", out}, {"mean", mean}, {"rstd", rstd}};
}

// `in_place` runs with residual_out == residual, which kernels.h allows.
Outputs residual_layernorm(const Shape& s, Device* device, bool in_place) {
  const LayerNormInputs in(s);
  const auto residual = random_floats(in.x.size(), 13);
  const auto branch = random_floats(in.x.size(), 14, -2.0f, 2.0f);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> residual_buffer = residual;
    std::vector<float> separate_out(in.x.size(), kNaN);
    float* residual_out = in_place ? d.out(residual_buffer) : d.out(separate_out);
    std::vector<float> norm(in.x.size(), kNaN), mean(s.N(), kNaN), rstd(s.N(), kNaN);
    k.residual_layernorm_forward(residual_out, d.out(norm), d.out(mean), d.out(rstd), d.in(residual_buffer),
                                 d.in(branch), d.in(in.weight), d.in(in.bias), s.N(), s.C);
    d.finish();
    return {{"residual_out", widen(in_place ? residual_buffer : separate_out)},
            {"norm_out", widen(norm)},
            {"mean", widen(mean)},
            {"rstd", widen(rstd)}};
  }
  Vec sum(in.x.size());
  for (std::size_t i = 0; i < sum.size(); ++i)
    sum[i] = static_cast<double>(static_cast<float>(residual[i] + branch[i]));
  Vec norm, mean, rstd;
  ref::layernorm_forward(norm, mean, rstd, sum, widen(in.weight), widen(in.bias), s.N(), s.C);
  return {{"residual_out", sum}, {"norm_out", norm}, {"mean", mean}, {"rstd", rstd}};
}

Outputs run_residual_layernorm_forward(const Shape& s, Device* device, int) {
  return residual_layernorm(s, device, false);
}
Outputs run_residual_layernorm_forward_in_place(const Shape& s, Device* device, int) {
  return residual_layernorm(s, device, true);
}

Outputs run_layernorm_backward(const Shape& s, Device* device, int calls) {
  const LayerNormInputs in(s);
  const auto dout = random_floats(in.x.size(), 15);
  const auto dx0 = random_floats(in.x.size(), 16);  // dx accumulates: start from non-zero
  const auto dweight0 = random_floats(s.C, 17);
  const auto dbias0 = random_floats(s.C, 18);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(in.x.size()), mean(s.N()), rstd(s.N());
    k.layernorm_forward(d.out(out), d.out(mean), d.out(rstd), d.in(in.x), d.in(in.weight), d.in(in.bias), s.N(), s.C);
    auto dx = dx0;
    auto dweight = dweight0;
    auto dbias = dbias0;
    for (int i = 0; i < calls; ++i) {
      k.layernorm_backward(d.out(dx), d.out(dweight), d.out(dbias), d.in(dout), d.in(in.x), d.in(in.weight), d.in(mean),
                           d.in(rstd), s.N(), s.C);
    }
    d.finish();
    return {{"dx", widen(dx)}, {"dweight", widen(dweight)}, {"dbias", widen(dbias)}};
  }
  Vec dx(in.x.size(), 0.0), dweight(s.C, 0.0), dbias(s.C, 0.0);
  ref::layernorm_backward(dx, dweight, dbias, widen(dout), widen(in.x), widen(in.weight), s.N(), s.C);
  return {{"dx", accumulated(dx0, dx, calls)},
          {"dweight", accumulated(dweight0, dweight, calls)},
          {"dbias", accumulated(dbias0, dbias, calls)}};
}

// ---- matmul ------------------------------------------------------------------------

// The GPT-2 linear layers: qkv (C -> 3C, bias), MLP projection (4C -> C, bias), and the
// tied LM head (C -> Vp, no bias); the last variant also skips dx like a first layer.
enum class Linear { kQkv, kProjection, kHead, kNoDx };

struct MatmulDims {
  int N, C, OC;
  bool bias, dx;
};

MatmulDims dims(const Shape& s, Linear layer) {
  switch (layer) {
    case Linear::kQkv:
      return {s.N(), s.C, 3 * s.C, true, true};
    case Linear::kProjection:
      return {s.N(), 4 * s.C, s.C, true, true};
    case Linear::kHead:
      return {s.N(), s.C, s.Vp, false, true};
    case Linear::kNoDx:
      return {s.N(), s.C, 2 * s.C + 1, false, false};
  }
  return {};
}

template <Linear kLayer>
Outputs run_matmul_forward(const Shape& s, Device* device, int) {
  const MatmulDims d = dims(s, kLayer);
  const auto x = random_floats(static_cast<std::size_t>(d.N) * d.C, 20);
  const auto weight = random_floats(static_cast<std::size_t>(d.OC) * d.C, 21);
  const auto bias = d.bias ? random_floats(d.OC, 22) : std::vector<float>();
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(static_cast<std::size_t>(d.N) * d.OC, kNaN);
    k.matmul_forward(a.out(out), a.in(x), a.in(weight), d.bias ? a.in(bias) : nullptr, d.N, d.C, d.OC);
    a.finish();
    return {{"out", widen(out)}};
  }
  Vec out;
  ref::matmul_forward(out, widen(x), widen(weight), widen(bias), d.N, d.C, d.OC);
  return {{"out", out}};
}

// The MLP's first projection with bias and GELU fused: out and the pre-activation.
// kWidthPadding 4 makes OC = 4C + 4, not a multiple of 8, which the CUDA op cannot
// fuse into cuBLASLt's epilogue and runs as two kernels instead.
template <int kWidthPadding>
Outputs run_matmul_bias_gelu_forward(const Shape& s, Device* device, int) {
  const int N = s.N(), C = s.C, OC = 4 * s.C + kWidthPadding;
  const auto x = random_floats(static_cast<std::size_t>(N) * C, 28);
  const auto weight = random_floats(static_cast<std::size_t>(OC) * C, 29);
  const auto bias = random_floats(OC, 30);
  if (device != nullptr) {
    DeviceArgs a(*device);
    std::vector<float> out(static_cast<std::size_t>(N) * OC, kNaN), pre(out.size(), kNaN);
    device->kernels().matmul_bias_gelu_forward(a.out(out), a.out(pre), a.in(x), a.in(weight), a.in(bias), N, C, OC);
    a.finish();
    return {{"out", widen(out)}, {"pre", widen(pre)}};
  }
  Vec product, out, pre;
  ref::matmul_forward(product, widen(x), widen(weight), Vec(), N, C, OC);
  ref::bias_gelu_forward(out, pre, product, widen(bias), N, OC);
  return {{"out", out}, {"pre", pre}};
}

template <Linear kLayer>
Outputs run_matmul_backward(const Shape& s, Device* device, int calls) {
  const MatmulDims d = dims(s, kLayer);
  const auto x = random_floats(static_cast<std::size_t>(d.N) * d.C, 23);
  const auto weight = random_floats(static_cast<std::size_t>(d.OC) * d.C, 24);
  const auto dout = random_floats(static_cast<std::size_t>(d.N) * d.OC, 25);
  const auto dweight0 = random_floats(weight.size(), 26);
  const auto dbias0 = random_floats(d.OC, 27);
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> dx(x.size(), kNaN);
    auto dweight = dweight0;
    auto dbias = dbias0;
    for (int i = 0; i < calls; ++i) {
      k.matmul_backward(d.dx ? a.out(dx) : nullptr, a.out(dweight), d.bias ? a.out(dbias) : nullptr, a.in(dout),
                        a.in(x), a.in(weight), d.N, d.C, d.OC);
    }
    a.finish();
    Outputs outputs{{"dweight", widen(dweight)}, {"dbias", widen(dbias)}};
    if (d.dx) outputs.push_back({"dx", widen(dx)});
    return outputs;
  }
  Vec dx, dweight(weight.size(), 0.0), dbias(d.OC, 0.0);
  ref::matmul_backward(dx, dweight, dbias, widen(dout), widen(x), widen(weight), d.N, d.C, d.OC);
  Outputs outputs{{"dweight", accumulated(dweight0, dweight, calls)},
                  {"dbias", d.bias ? accumulated(dbias0, dbias, calls) : widen(dbias0)}};
  if (d.dx) outputs.push_back({"dx", dx});
  return outputs;
}

// ---- bias + GELU -------------------------------------------------------------------

// The MLP's hidden width is 4C; `in_place` runs with pre == x (forward) or dx == dout
// (backward), which kernels.h allows.
Outputs bias_gelu_forward_case(const Shape& s, Device* device, bool in_place) {
  const int N = s.N(), H = 4 * s.C;
  const auto x = random_floats(static_cast<std::size_t>(N) * H, 30, -4.0f, 4.0f);
  const auto bias = random_floats(H, 31);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> x_buffer = x;
    std::vector<float> out(x.size(), kNaN), separate_pre(x.size(), kNaN);
    float* pre = in_place ? d.out(x_buffer) : d.out(separate_pre);
    k.bias_gelu_forward(d.out(out), pre, d.in(x_buffer), d.in(bias), N, H);
    d.finish();
    return {{"out", widen(out)}, {"pre", widen(in_place ? x_buffer : separate_pre)}};
  }
  Vec out, pre;
  ref::bias_gelu_forward(out, pre, widen(x), widen(bias), N, H);
  return {{"out", out}, {"pre", pre}};
}

Outputs bias_gelu_backward_case(const Shape& s, Device* device, int calls, bool in_place) {
  const int N = s.N(), H = 4 * s.C;
  const auto pre = random_floats(static_cast<std::size_t>(N) * H, 32, -4.0f, 4.0f);
  const auto dout = random_floats(pre.size(), 33);
  const auto dbias0 = random_floats(H, 34);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> separate_dx(pre.size(), kNaN);
    auto dbias = dbias0;
    std::vector<float> dx;
    for (int i = 0; i < calls; ++i) {
      // In place, dout is consumed, so each call starts from a fresh copy.
      std::vector<float> dout_buffer = dout;
      DeviceArgs call(*device);
      float* target = in_place ? call.out(dout_buffer) : call.out(separate_dx);
      k.bias_gelu_backward(target, d.out(dbias), call.in(dout_buffer), d.in(pre), N, H);
      call.finish();
      dx = in_place ? dout_buffer : separate_dx;
    }
    d.finish();
    return {{"dx", widen(dx)}, {"dbias", widen(dbias)}};
  }
  Vec dx, dbias(H, 0.0);
  ref::bias_gelu_backward(dx, dbias, widen(dout), widen(pre), N, H);
  return {{"dx", dx}, {"dbias", accumulated(dbias0, dbias, calls)}};
}

Outputs run_bias_gelu_forward(const Shape& s, Device* device, int) { return bias_gelu_forward_case(s, device, false); }
Outputs run_bias_gelu_forward_in_place(const Shape& s, Device* device, int) {
  return bias_gelu_forward_case(s, device, true);
}
Outputs run_bias_gelu_backward(const Shape& s, Device* device, int calls) {
  return bias_gelu_backward_case(s, device, calls, false);
}
Outputs run_bias_gelu_backward_in_place(const Shape& s, Device* device, int calls) {
  return bias_gelu_backward_case(s, device, calls, true);
}

// ---- attention ---------------------------------------------------------------------

std::vector<float> attention_qkv(const Shape& s) {
  return random_floats(static_cast<std::size_t>(s.N()) * 3 * s.C, 40, -2.0f, 2.0f);
}

// Splits att [B, NH, T, T] into its causal part (k <= t) and its masked part.
void split_causal(const Vec& att, const Shape& s, Vec& causal, Vec& masked) {
  causal.clear();
  masked.clear();
  for (std::size_t row = 0; row < static_cast<std::size_t>(s.B) * s.NH * s.T; ++row) {
    const std::size_t t = row % s.T;
    for (std::size_t k = 0; k < static_cast<std::size_t>(s.T); ++k) {
      (k <= t ? causal : masked).push_back(att[row * s.T + k]);
    }
  }
}

Outputs run_attention_forward(const Shape& s, Device* device, int) {
  const auto qkv = attention_qkv(s);
  Vec out, att;
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    // NaN everywhere: the masked entries must come back untouched.
    std::vector<float> out_f(static_cast<std::size_t>(s.N()) * s.C, kNaN);
    std::vector<float> att_f(static_cast<std::size_t>(s.B) * s.NH * s.T * s.T, kNaN);
    k.attention_forward(d.out(out_f), d.out(att_f), d.in(qkv), s.B, s.T, s.C, s.NH);
    d.finish();
    out = widen(out_f);
    att = widen(att_f);
  } else {
    ref::attention_forward(out, att, widen(qkv), s.B, s.T, s.C, s.NH);
  }
  Vec causal, masked;
  split_causal(att, s, causal, masked);
  if (device == nullptr) masked.assign(masked.size(), std::nan(""));
  return {{"out", out}, {"att (k <= t)", causal}, {"att (k > t) untouched", masked}};
}

Outputs run_attention_backward(const Shape& s, Device* device, int calls) {
  const auto qkv = attention_qkv(s);
  const auto dout = random_floats(static_cast<std::size_t>(s.N()) * s.C, 41);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    // The masked half of att and the scratch are NaN: reading either would show.
    const std::size_t att_size = static_cast<std::size_t>(s.B) * s.NH * s.T * s.T;
    std::vector<float> out(static_cast<std::size_t>(s.N()) * s.C), att(att_size, kNaN);
    k.attention_forward(d.out(out), d.out(att), d.in(qkv), s.B, s.T, s.C, s.NH);
    std::vector<float> dqkv(qkv.size(), kNaN), scratch(att_size, kNaN);
    for (int i = 0; i < calls; ++i) {
      k.attention_backward(d.out(dqkv), d.out(scratch), d.in(dout), d.in(qkv), d.in(att), s.B, s.T, s.C, s.NH);
    }
    d.finish();
    return {{"dqkv", widen(dqkv)}};
  }
  Vec dqkv;
  ref::attention_backward(dqkv, widen(dout), widen(qkv), s.B, s.T, s.C, s.NH);
  return {{"dqkv", dqkv}};
}

// ---- classifier --------------------------------------------------------------------

Outputs run_classifier(const Shape& s, Device* device, int) {
  const int N = s.N();
  auto logits = random_floats(static_cast<std::size_t>(N) * s.Vp, 50, -4.0f, 4.0f);
  for (int n = 0; n < N; ++n) {
    for (int i = s.V; i < s.Vp; ++i) logits[static_cast<std::size_t>(n) * s.Vp + i] = kNaN;  // must not be read
  }
  auto targets = random_tokens(N, s.V, 51);
  if (N > 1) targets[1] = -1;
  const float scale = 1.0f / static_cast<float>(N);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> losses(N, kNaN);
    k.classifier_forward_backward(d.out(logits), d.out(losses), d.in(targets), scale, N, s.V, s.Vp);
    d.finish();
    return {{"losses", widen(losses)}, {"dlogits (in place)", widen(logits)}};
  }
  Vec losses, dlogits;
  ref::classifier_losses(losses, widen(logits), targets, N, s.V, s.Vp);
  ref::classifier_grad(dlogits, widen(logits), targets, scale, N, s.V, s.Vp);
  return {{"losses", losses}, {"dlogits (in place)", dlogits}};
}

// ---- vocab-parallel pieces (tensor parallelism) -------------------------------------

// The vocabulary split over two simulated tensor-parallel ranks, Vl rows each (the
// table padded with zero rows to 2 Vl); the ranks' results combined on the host as the
// all-reduces between them would, against the serial reference.
constexpr int kVocabRanks = 2;
int vocab_slice(const Shape& s) { return (s.Vp + kVocabRanks - 1) / kVocabRanks; }

// Rows [rank Vl, (rank + 1) Vl) of a [rows, width] table padded with zeros.
std::vector<float> rows_of(const std::vector<float>& table, int width, int first_row, int rows) {
  std::vector<float> slice(static_cast<std::size_t>(rows) * width, 0.0f);
  const int available = static_cast<int>(table.size() / static_cast<std::size_t>(width));
  for (int r = 0; r < rows && first_row + r < available; ++r) {
    std::copy_n(table.begin() + static_cast<std::ptrdiff_t>(first_row + r) * width, width,
                slice.begin() + static_cast<std::ptrdiff_t>(r) * width);
  }
  return slice;
}

Outputs run_vocab_parallel_embedding_forward(const Shape& s, Device* device, int) {
  const auto [tokens, wte, wpe] = EmbeddingInputs(s);
  if (device != nullptr) {
    const KernelTable& k = device->kernels();
    const int Vl = vocab_slice(s);
    std::vector<float> sum(static_cast<std::size_t>(s.N()) * s.C, 0.0f);
    for (int rank = 0; rank < kVocabRanks; ++rank) {
      DeviceArgs d(*device);
      const auto slice = rows_of(wte, s.C, rank * Vl, Vl);
      std::vector<float> out(sum.size(), kNaN);
      k.vocab_parallel_embedding_forward(d.out(out), d.in(tokens), d.in(slice), rank == 0 ? d.in(wpe) : nullptr,
                                         rank * Vl, Vl, s.B, s.T, s.C);
      d.finish();
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
    }
    return {{"out (sum over ranks)", widen(sum)}};
  }
  Vec out;
  ref::embedding_forward(out, tokens, widen(wte), widen(wpe), s.B, s.T, s.C);
  return {{"out (sum over ranks)", out}};
}

Outputs run_vocab_parallel_embedding_backward(const Shape& s, Device* device, int calls) {
  const auto [tokens, dout, dwte0, dwpe0] = EmbeddingGradInputs(s);
  if (device != nullptr) {
    const KernelTable& k = device->kernels();
    const int Vl = vocab_slice(s);
    std::vector<float> dwte = dwte0;
    auto dwpe = dwpe0;
    for (int rank = 0; rank < kVocabRanks; ++rank) {
      DeviceArgs d(*device);
      auto slice = rows_of(dwte0, s.C, rank * Vl, Vl);
      for (int i = 0; i < calls; ++i) {
        k.vocab_parallel_embedding_backward(d.out(slice), rank == 0 ? d.out(dwpe) : nullptr, d.in(dout), d.in(tokens),
                                            rank * Vl, Vl, s.B, s.T, s.C);
      }
      d.finish();
      const std::size_t first = static_cast<std::size_t>(rank) * Vl * s.C;
      for (std::size_t i = 0; i < slice.size() && first + i < dwte.size(); ++i) dwte[first + i] = slice[i];
    }
    return {{"dwte (ranks' rows)", widen(dwte)}, {"dwpe (rank 0)", widen(dwpe)}};
  }
  Vec dwte(dwte0.size(), 0.0), dwpe(dwpe0.size(), 0.0);
  ref::embedding_backward(dwte, dwpe, widen(dout), tokens, s.B, s.T, s.C);
  return {{"dwte (ranks' rows)", accumulated(dwte0, dwte, calls)}, {"dwpe (rank 0)", accumulated(dwpe0, dwpe, calls)}};
}

// The three phases with the max and sum all-reduces done on the host between them.
Outputs run_vocab_parallel_classifier(const Shape& s, Device* device, int) {
  const int N = s.N();
  auto logits = random_floats(static_cast<std::size_t>(N) * s.Vp, 50, -4.0f, 4.0f);
  for (int n = 0; n < N; ++n) {
    for (int i = s.V; i < s.Vp; ++i) logits[static_cast<std::size_t>(n) * s.Vp + i] = kNaN;  // must not be read
  }
  auto targets = random_tokens(N, s.V, 51);
  if (N > 1) targets[1] = -1;
  const float scale = 1.0f / static_cast<float>(N);
  if (device != nullptr) {
    const KernelTable& k = device->kernels();
    const int Vl = vocab_slice(s);
    const std::size_t rows = static_cast<std::size_t>(N);
    std::vector<std::vector<float>> local(kVocabRanks, std::vector<float>(rows * Vl, kNaN));
    for (int rank = 0; rank < kVocabRanks; ++rank) {
      for (std::size_t n = 0; n < rows; ++n) {
        for (int i = 0; i < Vl && rank * Vl + i < s.Vp; ++i) {
          local[rank][n * Vl + i] = logits[n * s.Vp + rank * Vl + i];
        }
      }
    }
    std::vector<std::unique_ptr<DeviceArgs>> args;
    for (int rank = 0; rank < kVocabRanks; ++rank) args.push_back(std::make_unique<DeviceArgs>(*device));
    std::vector<float> row_max(rows, -std::numeric_limits<float>::infinity());
    for (int rank = 0; rank < kVocabRanks; ++rank) {
      DeviceArgs phase(*device);
      std::vector<float> rank_max(rows, kNaN);
      k.vocab_parallel_classifier_max(phase.out(rank_max), args[rank]->in(local[rank]), args[rank]->in(targets), N, s.V,
                                      rank * Vl, Vl);
      phase.finish();
      for (std::size_t n = 0; n < rows; ++n) row_max[n] = std::max(row_max[n], rank_max[n]);
    }
    std::vector<double> stats(2 * rows, 0.0);
    for (int rank = 0; rank < kVocabRanks; ++rank) {
      DeviceArgs phase(*device);
      std::vector<double> rank_stats(2 * rows, 0.0);
      k.vocab_parallel_classifier_exp_sum(phase.out(rank_stats), args[rank]->out(local[rank]), phase.in(row_max),
                                          args[rank]->in(targets), N, s.V, rank * Vl, Vl);
      phase.finish();
      for (std::size_t i = 0; i < stats.size(); ++i) stats[i] += rank_stats[i];
    }
    std::vector<float> losses(rows, kNaN);
    std::vector<float> dlogits(rows * s.Vp, kNaN);
    for (int rank = 0; rank < kVocabRanks; ++rank) {
      DeviceArgs phase(*device);
      std::vector<float> rank_losses(rows, kNaN);
      k.vocab_parallel_classifier_finish(args[rank]->out(local[rank]), phase.out(rank_losses), phase.in(stats),
                                         phase.in(row_max), args[rank]->in(targets), scale, N, s.V, rank * Vl, Vl);
      phase.finish();
      args[rank]->finish();
      if (rank == 0) losses = rank_losses;
      for (std::size_t n = 0; n < rows; ++n) {
        for (int i = 0; i < Vl && rank * Vl + i < s.Vp; ++i)
          dlogits[n * s.Vp + rank * Vl + i] = local[rank][n * Vl + i];
      }
    }
    return {{"losses", widen(losses)}, {"dlogits (ranks' columns)", widen(dlogits)}};
  }
  Vec losses, dlogits;
  ref::classifier_losses(losses, widen(logits), targets, N, s.V, s.Vp);
  ref::classifier_grad(dlogits, widen(logits), targets, scale, N, s.V, s.Vp);
  return {{"losses", losses}, {"dlogits (ranks' columns)", dlogits}};
}

// ---- the model's glue ----------------------------------------------------------------

Outputs run_add(const Shape& s, Device* device, int) {
  const auto a = random_floats(static_cast<std::size_t>(s.N()) * s.C, 55, -3.0f, 3.0f);
  const auto b = random_floats(a.size(), 56);
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> out(a.size(), kNaN);
    device->kernels().add(d.out(out), d.in(a), d.in(b), a.size());
    d.finish();
    return {{"out", widen(out)}};
  }
  Vec out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = static_cast<double>(a[i]) + b[i];
  return {{"out", out}};
}

Outputs run_masked_mean_loss(const Shape& s, Device* device, int) {
  const auto losses = random_floats(static_cast<std::size_t>(s.N()), 57, 0.0f, 10.0f);
  auto targets = random_tokens(s.N(), s.V, 58);
  for (std::size_t i = 0; i < targets.size(); i += 3) targets[i] = -1;  // every third row ignored
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> mean(1, kNaN);
    device->kernels().masked_mean_loss(d.out(mean), d.in(losses), d.in(targets), s.N());
    d.finish();
    return {{"mean", widen(mean)}};
  }
  double sum = 0.0;
  int counted = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == -1) continue;
    sum += losses[i];
    ++counted;
  }
  return {{"mean", {counted == 0 ? 0.0 : sum / counted}}};
}

// ---- mixed precision -----------------------------------------------------------------

// The bf16 value nearest to x, ties to the even bf16, found by comparing the two bf16
// neighbours in double (no bit tricks, unlike bf16.h): the independent reference.
double nearest_bf16(float x) {
  if (std::isnan(x)) return std::numeric_limits<double>::quiet_NaN();
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const auto as_double = [](std::uint32_t upper) {
    const std::uint32_t wide = upper << 16;
    float value;
    std::memcpy(&value, &wide, sizeof(value));
    return static_cast<double>(value);
  };
  const std::uint32_t down = bits >> 16;  // towards zero
  const std::uint32_t up = down + 1;      // away from zero (may reach infinity)
  const double low = as_double(down);
  const double high = as_double(up);
  const double gap_low = std::abs(static_cast<double>(x) - low);
  const double gap_high = std::isinf(high) && !std::isinf(x)
                              ? std::abs(std::ldexp(static_cast<double>(std::signbit(x) ? -1.0 : 1.0), 128) - x)
                              : std::abs(high - static_cast<double>(x));
  if (gap_low < gap_high) return low;
  if (gap_high < gap_low) return high;
  return (down & 1u) == 0 ? low : high;
}

Outputs run_round_to_bf16(const Shape& s, Device* device, int) {
  auto values = random_floats(static_cast<std::size_t>(s.N()) * s.C, 59, -50.0f, 50.0f);
  // Exact ties (odd and even upper halves), large, subnormal and signed-zero values
  // and NaN. (Overflow to infinity is bf16_test's, against torch: the harness's
  // tolerances cannot compare infinities.)
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3e38f, -3.3e38f, 1e-40f, 0.0f, -0.0f, kNaN};
  for (std::size_t i = 0; i < std::size(specials) && i < values.size(); ++i) values[i] = specials[i];
  if (device != nullptr) {
    DeviceArgs d(*device);
    auto rounded = values;
    device->kernels().round_to_bf16(d.out(rounded), rounded.size());
    d.finish();
    return {{"values", widen(rounded)}};
  }
  Vec rounded(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) rounded[i] = nearest_bf16(values[i]);
  return {{"values", rounded}};
}

// ---- norm and optimizer ------------------------------------------------------------

// Sized past one 65536-value chunk of the fast sum for the larger shapes.
std::size_t vector_size(const Shape& s) { return static_cast<std::size_t>(s.N()) * s.C * 3 + 1; }

Outputs run_sum_of_squares(const Shape& s, Device* device, int) {
  const auto values = random_floats(vector_size(s), 60, -3.0f, 3.0f);
  double sum = 0.0;
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    sum = k.sum_of_squares(d.in(values), values.size());
  } else {
    long double exact = 0.0L;
    for (const float v : values) exact += static_cast<long double>(v) * v;
    sum = static_cast<double>(exact);
  }
  return {{"sum", {sum}}};
}

Outputs run_scale_in_place(const Shape& s, Device* device, int) {
  const auto values = random_floats(vector_size(s), 61);
  const float scale = 0.37f;
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    auto scaled = values;
    k.scale_in_place(d.out(scaled), scale, scaled.size());
    d.finish();
    return {{"values", widen(scaled)}};
  }
  Vec scaled = widen(values);
  for (double& v : scaled) v *= scale;
  return {{"values", scaled}};
}

// Segments of both decays, one of them empty, so that the threads' chunks cut through
// segments and the decay changes inside a chunk.
Outputs run_adamw(const Shape& s, Device* device, int) {
  const std::size_t n = vector_size(s);
  const auto params = random_floats(n, 70);
  const auto grads = random_floats(n, 71, -0.1f, 0.1f);
  const auto m = random_floats(n, 72, -0.01f, 0.01f);
  const auto v = random_floats(n, 73, 0.0f, 1e-4f);
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  const AdamWSegment segments[] = {{n / 3, 0.1f}, {n / 3, 0.0f}, {n / 2 + 1, 0.0f}, {n, 0.1f}};
  const int t = 7;
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    auto p = params, mm = m, vv = v;
    k.adamw_update(d.out(p), d.in(grads), d.out(mm), d.out(vv), std::span<const AdamWSegment>(segments), lr, beta1,
                   beta2, eps, t, 1.0f);
    d.finish();
    return {{"params", widen(p)}, {"m", widen(mm)}, {"v", widen(vv)}};
  }
  Vec p = widen(params), mm = widen(m), vv = widen(v);
  std::size_t begin = 0;
  for (const AdamWSegment& segment : segments) {
    ref::adamw_update_range(p, widen(grads), mm, vv, begin, segment.end, lr, beta1, beta2, eps, segment.weight_decay,
                            t);
    begin = segment.end;
  }
  return {{"params", p}, {"m", mm}, {"v", vv}};
}

// Tolerances are set from the fp32 error each kernel can accumulate (sums of up to
// 4C = 800 products for matmul, exp/tanh rounding elsewhere), with about 10x margin
// over the errors the harness prints.
const OpCase kOps[] = {
    {"embedding_forward", run_embedding_forward, {1e-6, 1e-6}, true, true},
    {"embedding_backward", run_embedding_backward, {1e-5, 1e-5}, true, true},
    {"layernorm_forward", run_layernorm_forward, {2e-5, 2e-5}, true, true},
    {"residual_layernorm_forward", run_residual_layernorm_forward, {2e-5, 2e-5}, true, true},
    {"residual_layernorm_forward_in_place", run_residual_layernorm_forward_in_place, {2e-5, 2e-5}, true, true},
    {"layernorm_backward", run_layernorm_backward, {5e-5, 5e-5}, true, true},
    {"matmul_forward_qkv", run_matmul_forward<Linear::kQkv>, {2e-4, 1e-6}, true, false},
    {"matmul_forward_projection", run_matmul_forward<Linear::kProjection>, {2e-4, 1e-6}, true, false},
    {"matmul_forward_head", run_matmul_forward<Linear::kHead>, {2e-4, 1e-6}, true, false},
    {"matmul_backward_qkv", run_matmul_backward<Linear::kQkv>, {2e-4, 1e-6}, true, false},
    {"matmul_backward_projection", run_matmul_backward<Linear::kProjection>, {2e-4, 1e-6}, true, false},
    {"matmul_backward_head", run_matmul_backward<Linear::kHead>, {2e-4, 1e-6}, true, false},
    {"matmul_backward_no_dx_no_bias", run_matmul_backward<Linear::kNoDx>, {2e-4, 1e-6}, true, false},
    {"matmul_bias_gelu_forward", run_matmul_bias_gelu_forward<0>, {2e-4, 1e-6}, true, false},
    {"matmul_bias_gelu_forward_width_not_8", run_matmul_bias_gelu_forward<4>, {2e-4, 1e-6}, true, false},
    {"bias_gelu_forward", run_bias_gelu_forward, {5e-6, 1e-5}, true, true},
    {"bias_gelu_forward_in_place", run_bias_gelu_forward_in_place, {5e-6, 1e-5}, true, true},
    {"bias_gelu_backward", run_bias_gelu_backward, {1e-5, 1e-5}, true, true},
    {"bias_gelu_backward_in_place", run_bias_gelu_backward_in_place, {1e-5, 1e-5}, true, true},
    {"attention_forward", run_attention_forward, {1e-5, 1e-5}, true, true},
    {"attention_backward", run_attention_backward, {2e-5, 2e-5}, true, true},
    {"classifier_forward_backward", run_classifier, {1e-6, 2e-5}, false, true},
    {"vocab_parallel_embedding_forward", run_vocab_parallel_embedding_forward, {1e-6, 1e-6}, true, true},
    {"vocab_parallel_embedding_backward", run_vocab_parallel_embedding_backward, {1e-5, 1e-5}, true, true},
    {"vocab_parallel_classifier", run_vocab_parallel_classifier, {1e-6, 2e-5}, false, true},
    {"add", run_add, {0.0, 1e-7}, true, true},
    {"masked_mean_loss", run_masked_mean_loss, {0.0, 1e-6}, true, true},
    {"round_to_bf16", run_round_to_bf16, {0.0, 0.0}, true, true},
    {"sum_of_squares", run_sum_of_squares, {0.0, 1e-12}, true, true},
    {"scale_in_place", run_scale_in_place, {0.0, 1e-7}, true, true},
    {"adamw_update", run_adamw, {1e-7, 1e-6}, true, true},
};

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
  const Shape s = kShapes[1];
  run_matmul_forward<Linear::kQkv>(s, &cpu_device(), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST(Classifier, RejectsTargetsOutsideTheVocabulary) {
  std::vector<float> logits(2 * 8, 0.0f), losses(2);
  const std::vector<std::int32_t> targets{3, 5};
  EXPECT_THROW(
      cpu_device().kernels().classifier_forward_backward(logits.data(), losses.data(), targets.data(), 0.5f, 2, 5, 8),
      std::exception);
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
