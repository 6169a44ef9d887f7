// Kernel test rows of the layers: embedding, LayerNorm, matmul, GELU, attention (kernel_cases.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

namespace dufu::trainer::testing {

namespace ref = reference;

namespace {

// kPositions: position ids that restart in each packed document (document masking).
template <Operands kOperands = Operands::kFp32, bool kPositions = false>
Outputs run_embedding_forward(const Shape& s, Device* device, int) {
  const EmbeddingInputs inputs(s);
  const auto& tokens = inputs.tokens;
  const PackedRows packed = packed_rows(s.B, s.T, 45);
  const std::vector<std::int32_t>* positions = kPositions ? &packed.positions : nullptr;
  const auto wte = on_grid<kOperands>(inputs.wte);
  const auto wpe = on_grid<kOperands>(inputs.wpe);
  const auto wte_bits = bf16_bits(wte);
  const auto wpe_bits = bf16_bits(wpe);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(static_cast<std::size_t>(s.N()) * s.C, kNaN);
    const std::int32_t* device_positions = kPositions ? d.in(packed.positions) : nullptr;
    if constexpr (kOperands == Operands::kBf16) {
      k.embedding_forward(d.out(out), d.in(tokens), device_positions, d.in(wte_bits), d.in(wpe_bits), s.B, s.T,
                          s.C);
    } else {
      k.embedding_forward(d.out(out), d.in(tokens), device_positions, d.in(wte), d.in(wpe), s.B, s.T, s.C);
    }
    d.finish();
    return {{"out", widen(out)}};
  }
  Vec out;
  ref::embedding_forward(out, tokens, widen(wte), widen(wpe), s.B, s.T, s.C, positions);
  return {{"out", out}};
}

template <bool kPositions = false>
Outputs run_embedding_backward(const Shape& s, Device* device, int calls) {
  const auto [tokens, dout, dwte0, dwpe0] = EmbeddingGradInputs(s);
  const PackedRows packed = packed_rows(s.B, s.T, 46);
  const std::vector<std::int32_t>* positions = kPositions ? &packed.positions : nullptr;
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    auto dwte = dwte0;
    auto dwpe = dwpe0;
    const std::int32_t* device_positions = kPositions ? d.in(packed.positions) : nullptr;
    for (int i = 0; i < calls; ++i)
      k.embedding_backward(d.out(dwte), d.out(dwpe), d.in(dout), d.in(tokens), device_positions, s.B, s.T, s.C);
    d.finish();
    return {{"dwte", widen(dwte)}, {"dwpe", widen(dwpe)}};
  }
  Vec dwte(dwte0.size(), 0.0), dwpe(dwpe0.size(), 0.0);
  ref::embedding_backward(dwte, dwpe, widen(dout), tokens, s.B, s.T, s.C, positions);
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

// The matmul rows run twice: fp32 operands, and operands on the bf16 grid given to the
// same entries as bf16 bits (TensorIn's type), which read x and the weight as bf16
// (the bf16 recipe's matmuls: a GPU's bf16 GEMMs; dout stays fp32 on the grid), each
// against the reference on the same values.
template <Operands kOperands>
std::vector<float> operand(std::size_t count, std::uint32_t seed) {
  return on_grid<kOperands>(random_floats(count, seed));
}

template <Linear kLayer, Operands kOperands = Operands::kFp32>
Outputs run_matmul_forward(const Shape& s, Device* device, int) {
  const MatmulDims d = dims(s, kLayer);
  const auto x = operand<kOperands>(static_cast<std::size_t>(d.N) * d.C, 20);
  const auto weight = operand<kOperands>(static_cast<std::size_t>(d.OC) * d.C, 21);
  const auto x_bits = bf16_bits(x);
  const auto weight_bits = bf16_bits(weight);
  const auto bias = d.bias ? random_floats(d.OC, 22) : std::vector<float>();
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(static_cast<std::size_t>(d.N) * d.OC, kNaN);
    if constexpr (kOperands == Operands::kBf16) {
      k.matmul_forward(a.out(out), a.in(x_bits), a.in(weight_bits), d.bias ? a.in(bias) : nullptr, d.N, d.C, d.OC);
    } else {
      k.matmul_forward(a.out(out), a.in(x), a.in(weight), d.bias ? a.in(bias) : nullptr, d.N, d.C, d.OC);
    }
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
template <int kWidthPadding, Operands kOperands = Operands::kFp32>
Outputs run_matmul_bias_gelu_forward(const Shape& s, Device* device, int) {
  const int N = s.N(), C = s.C, OC = 4 * s.C + kWidthPadding;
  const auto x = operand<kOperands>(static_cast<std::size_t>(N) * C, 28);
  const auto weight = operand<kOperands>(static_cast<std::size_t>(OC) * C, 29);
  const auto x_bits = bf16_bits(x);
  const auto weight_bits = bf16_bits(weight);
  const auto bias = random_floats(OC, 30);
  if (device != nullptr) {
    DeviceArgs a(*device);
    std::vector<float> out(static_cast<std::size_t>(N) * OC, kNaN), pre(out.size(), kNaN);
    const KernelTable& k = device->kernels();
    if constexpr (kOperands == Operands::kBf16) {
      k.matmul_bias_gelu_forward(a.out(out), a.out(pre), a.in(x_bits), a.in(weight_bits), a.in(bias), N, C, OC);
    } else {
      k.matmul_bias_gelu_forward(a.out(out), a.out(pre), a.in(x), a.in(weight), a.in(bias), N, C, OC);
    }
    a.finish();
    return {{"out", widen(out)}, {"pre", widen(pre)}};
  }
  Vec product, out, pre;
  ref::matmul_forward(product, widen(x), widen(weight), Vec(), N, C, OC);
  ref::bias_gelu_forward(out, pre, product, widen(bias), N, OC);
  return {{"out", out}, {"pre", pre}};
}

template <Linear kLayer, Operands kOperands = Operands::kFp32>
Outputs run_matmul_backward(const Shape& s, Device* device, int calls) {
  const MatmulDims d = dims(s, kLayer);
  const auto x = operand<kOperands>(static_cast<std::size_t>(d.N) * d.C, 23);
  const auto weight = operand<kOperands>(static_cast<std::size_t>(d.OC) * d.C, 24);
  const auto x_bits = bf16_bits(x);
  const auto weight_bits = bf16_bits(weight);
  const auto dout = operand<kOperands>(static_cast<std::size_t>(d.N) * d.OC, 25);
  const auto dweight0 = random_floats(weight.size(), 26);
  const auto dbias0 = random_floats(d.OC, 27);
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> dx(x.size(), kNaN);
    auto dweight = dweight0;
    auto dbias = dbias0;
    for (int i = 0; i < calls; ++i) {
      if constexpr (kOperands == Operands::kBf16) {
        k.matmul_backward(d.dx ? a.out(dx) : nullptr, a.out(dweight), d.bias ? a.out(dbias) : nullptr, a.in(dout),
                               a.in(x_bits), a.in(weight_bits), d.N, d.C, d.OC);
      } else {
        k.matmul_backward(d.dx ? a.out(dx) : nullptr, a.out(dweight), d.bias ? a.out(dbias) : nullptr, a.in(dout),
                          a.in(x), a.in(weight), d.N, d.C, d.OC);
      }
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

// The MLP's second projection backward through the GELU: hidden width C = 4C (plus
// kWidthPadding: 4 makes it no multiple of 8, which the CUDA op cannot hand to
// cuBLASLt's DGELU epilogue and runs as a GEMM and a kernel instead) to OC = C. pre
// spans the GELU's curved part; x (the GELU's output in the model) is independent of
// it here, so an op that took gelu' of x instead would show.
template <int kWidthPadding, bool kBias, Operands kOperands = Operands::kFp32>
Outputs run_matmul_gelu_backward(const Shape& s, Device* device, int calls) {
  const int N = s.N(), C = 4 * s.C + kWidthPadding, OC = s.C;
  const auto x = operand<kOperands>(static_cast<std::size_t>(N) * C, 35);
  const auto weight = operand<kOperands>(static_cast<std::size_t>(OC) * C, 36);
  const auto x_bits = bf16_bits(x);
  const auto weight_bits = bf16_bits(weight);
  const auto dout = operand<kOperands>(static_cast<std::size_t>(N) * OC, 37);
  const auto pre = random_floats(x.size(), 38, -4.0f, 4.0f);
  const auto dweight0 = random_floats(weight.size(), 39);
  const auto dbias0 = random_floats(OC, 40);
  if (device != nullptr) {
    DeviceArgs a(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> dpre(x.size(), kNaN);
    auto dweight = dweight0;
    auto dbias = dbias0;
    for (int i = 0; i < calls; ++i) {
      if constexpr (kOperands == Operands::kBf16) {
        k.matmul_gelu_backward(a.out(dpre), a.out(dweight), kBias ? a.out(dbias) : nullptr, a.in(dout),
                                    a.in(x_bits), a.in(weight_bits), a.in(pre), N, C, OC);
      } else {
        k.matmul_gelu_backward(a.out(dpre), a.out(dweight), kBias ? a.out(dbias) : nullptr, a.in(dout), a.in(x),
                               a.in(weight), a.in(pre), N, C, OC);
      }
    }
    a.finish();
    return {{"dpre", widen(dpre)}, {"dweight", widen(dweight)}, {"dbias", widen(dbias)}};
  }
  Vec dpre, dweight(weight.size(), 0.0), dbias(OC, 0.0);
  ref::matmul_gelu_backward(dpre, dweight, dbias, widen(dout), widen(x), widen(weight), widen(pre), N, C, OC);
  return {{"dpre", dpre},
          {"dweight", accumulated(dweight0, dweight, calls)},
          {"dbias", kBias ? accumulated(dbias0, dbias, calls) : widen(dbias0)}};
}

// ---- bias + GELU -------------------------------------------------------------------

// The MLP's hidden width is 4C; `in_place` runs with pre == x, which kernel_table.h allows.
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

Outputs run_bias_gelu_forward(const Shape& s, Device* device, int) { return bias_gelu_forward_case(s, device, false); }
Outputs run_bias_gelu_forward_in_place(const Shape& s, Device* device, int) {
  return bias_gelu_forward_case(s, device, true);
}

// ---- attention ---------------------------------------------------------------------

// The heads a shape stands for: GPT-2's NH heads of C / NH (multi-head), or the
// Llama-family grouping of llama_dims (kernel_cases.h): 4 query heads sharing 2 K/V
// heads (c20, wide), 6 sharing 3 (mid), 3 and 2 sharing 1 (odd, long: multi-query).
enum class Heads { kMultiHead, kGrouped };
template <Heads kHeads>
ref::AttentionHeads attention_heads(const Shape& s) {
  if constexpr (kHeads == Heads::kGrouped) {
    const LlamaDims m = llama_dims(s);
    return {m.NH, m.NKV, m.hs};
  }
  return {s.NH, s.NH, s.C / s.NH};
}

std::vector<float> attention_qkv(const Shape& s, const ref::AttentionHeads& a) {
  return random_floats(static_cast<std::size_t>(s.N()) * a.qkv_width(), 40, -2.0f, 2.0f);
}

// kDocuments: several documents packed into each row but the first (document masking).
template <Heads kHeads, bool kDocuments = false>
Outputs run_attention_forward(const Shape& s, Device* device, int) {
  const ref::AttentionHeads a = attention_heads<kHeads>(s);
  const auto qkv = attention_qkv(s, a);
  const PackedRows packed = packed_rows(s.B, s.T, 43);
  const std::vector<std::int32_t>* starts = kDocuments ? &packed.document_starts : nullptr;
  Vec out, lse;
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    // NaN everywhere: every output must be written.
    std::vector<float> out_f(static_cast<std::size_t>(s.N()) * a.out_width(), kNaN);
    std::vector<float> lse_f(static_cast<std::size_t>(s.B) * a.NH * s.T, kNaN);
    k.attention_forward(d.out(out_f), d.out(lse_f), d.in(qkv), kDocuments ? d.in(packed.document_starts) : nullptr,
                        s.B, s.T, a.NH, a.NKV, a.hs);
    d.finish();
    out = widen(out_f);
    lse = widen(lse_f);
  } else {
    ref::attention_forward(out, lse, widen(qkv), s.B, s.T, a, starts);
  }
  return {{"out", out}, {"lse", lse}};
}

template <Heads kHeads, bool kDocuments = false>
Outputs run_attention_backward(const Shape& s, Device* device, int calls) {
  const ref::AttentionHeads a = attention_heads<kHeads>(s);
  const auto qkv = attention_qkv(s, a);
  const PackedRows packed = packed_rows(s.B, s.T, 44);
  const std::vector<std::int32_t>* starts = kDocuments ? &packed.document_starts : nullptr;
  const auto dout = random_floats(static_cast<std::size_t>(s.N()) * a.out_width(), 41);
  if (device != nullptr) {
    DeviceArgs d(*device);
    const KernelTable& k = device->kernels();
    std::vector<float> out(static_cast<std::size_t>(s.N()) * a.out_width());
    std::vector<float> lse(static_cast<std::size_t>(s.B) * a.NH * s.T);
    const std::int32_t* device_starts = kDocuments ? d.in(packed.document_starts) : nullptr;
    k.attention_forward(d.out(out), d.out(lse), d.in(qkv), device_starts, s.B, s.T, a.NH, a.NKV, a.hs);
    std::vector<float> dqkv(qkv.size(), kNaN);
    for (int i = 0; i < calls; ++i) {
      k.attention_backward(d.out(dqkv), d.in(dout), d.in(qkv), d.in(out), d.in(lse), device_starts, s.B, s.T, a.NH,
                           a.NKV, a.hs);
    }
    d.finish();
    return {{"dqkv", widen(dqkv)}};
  }
  Vec dqkv;
  ref::attention_backward(dqkv, widen(dout), widen(qkv), s.B, s.T, a, starts);
  return {{"dqkv", dqkv}};
}

}  // namespace

std::vector<OpCase> layer_op_cases() {
  return {
      {"embedding_forward", run_embedding_forward, {1e-6, 1e-6}, true, true},
      {"embedding_forward_bf16", run_embedding_forward<Operands::kBf16>, {1e-6, 1e-6}, true, true},
      {"embedding_backward", run_embedding_backward, {1e-5, 1e-5}, true, true},
      {"embedding_forward_positions", run_embedding_forward<Operands::kFp32, true>, {1e-6, 1e-6}, true, true},
      {"embedding_backward_positions", run_embedding_backward<true>, {1e-5, 1e-5}, true, true},
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
      // atol 4e-4: cuBLASLt's DGELU epilogue (width a multiple of 8) computes gelu' to
      // about 1.2e-5 absolute, times |dout @ W| up to 23 here (H100, 2026-11-28: max
      // abs err 2.64e-4, in 7 of 204800 elements over 2e-4); a wrong derivative is off
      // by 1e-2 or more.
      {"matmul_gelu_backward", run_matmul_gelu_backward<0, true>, {4e-4, 1e-6}, true, false},
      {"matmul_gelu_backward_width_not_8_no_bias", run_matmul_gelu_backward<4, false>, {2e-4, 1e-6}, true, false},
      {"matmul_forward_qkv_bf16", run_matmul_forward<Linear::kQkv, Operands::kBf16>, {2e-4, 1e-6}, true, false},
      {"matmul_backward_projection_bf16",
       run_matmul_backward<Linear::kProjection, Operands::kBf16>,
       {2e-4, 1e-6},
       true,
       false},
      {"matmul_backward_no_dx_no_bias_bf16",
       run_matmul_backward<Linear::kNoDx, Operands::kBf16>,
       {2e-4, 1e-6},
       true,
       false},
      {"matmul_bias_gelu_forward_bf16", run_matmul_bias_gelu_forward<0, Operands::kBf16>, {2e-4, 1e-6}, true, false},
      {"matmul_bias_gelu_forward_width_not_8_bf16",
       run_matmul_bias_gelu_forward<4, Operands::kBf16>,
       {2e-4, 1e-6},
       true,
       false},
      {"matmul_gelu_backward_bf16", run_matmul_gelu_backward<0, true, Operands::kBf16>, {4e-4, 1e-6}, true, false},
      {"matmul_gelu_backward_width_not_8_no_bias_bf16",
       run_matmul_gelu_backward<4, false, Operands::kBf16>,
       {2e-4, 1e-6},
       true,
       false},
      {"bias_gelu_forward", run_bias_gelu_forward, {5e-6, 1e-5}, true, true},
      {"bias_gelu_forward_in_place", run_bias_gelu_forward_in_place, {5e-6, 1e-5}, true, true},
      {"attention_forward", run_attention_forward<Heads::kMultiHead>, {1e-5, 1e-5}, true, true},
      {"attention_backward", run_attention_backward<Heads::kMultiHead>, {2e-5, 2e-5}, true, true},
      {"attention_forward_grouped", run_attention_forward<Heads::kGrouped>, {1e-5, 1e-5}, true, true},
      {"attention_backward_grouped", run_attention_backward<Heads::kGrouped>, {2e-5, 2e-5}, true, true},
      {"attention_forward_documents", run_attention_forward<Heads::kMultiHead, true>, {1e-5, 1e-5}, true, true},
      {"attention_backward_documents", run_attention_backward<Heads::kMultiHead, true>, {2e-5, 2e-5}, true, true},
      // Grouped heads with documents: DocumentAttentionTest (flash_attention_test.cc).
  };
}

}  // namespace dufu::trainer::testing
