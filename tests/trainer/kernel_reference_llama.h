// Naive double-precision references for the Llama-family kernels (RMSNorm, rotary
// position embedding, SwiGLU), written from the formulas of the papers and of
// HuggingFace's modeling_llama.py, not from llama_math.h: the oracles of
// kernel_cases_llama.cc and the forwards whose finite differences check the backwards
// in kernels_gradcheck_test.cc.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace dufu::trainer::reference {

using Vec = std::vector<double>;

// out = x / sqrt(mean(x^2) + eps) * weight, rstd = 1 / sqrt(mean(x^2) + eps).
inline void rmsnorm_forward(Vec& out, Vec& rstd, const Vec& x, const Vec& weight, double eps, int N, int C) {
  out.assign(static_cast<std::size_t>(N) * C, 0.0);
  rstd.assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    const std::size_t row = static_cast<std::size_t>(n) * C;
    double mean_sq = 0.0;
    for (int c = 0; c < C; ++c) mean_sq += x[row + c] * x[row + c];
    mean_sq /= C;
    rstd[n] = 1.0 / std::sqrt(mean_sq + eps);
    for (int c = 0; c < C; ++c) out[row + c] = x[row + c] * rstd[n] * weight[c];
  }
}

// dx += J^T dout, dweight += sum over rows of norm * dout, with the Jacobian of
// y_j = w_j x_j r, r = (mean(x^2) + eps)^(-1/2): dy_j/dx_k = w_j (r δ_jk - x_j x_k r^3 / C).
inline void rmsnorm_backward(Vec& dx, Vec& dweight, const Vec& dout, const Vec& x, const Vec& weight, double eps, int N,
                             int C) {
  Vec out, rstd;
  rmsnorm_forward(out, rstd, x, weight, eps, N, C);
  for (int n = 0; n < N; ++n) {
    const double r = rstd[n];
    const std::size_t row = static_cast<std::size_t>(n) * C;
    for (int k = 0; k < C; ++k) {
      double sum = 0.0;
      for (int j = 0; j < C; ++j) {
        const double jacobian = weight[j] * ((j == k ? r : 0.0) - x[row + j] * x[row + k] * r * r * r / C);
        sum += dout[row + j] * jacobian;
      }
      dx[row + k] += sum;
      dweight[k] += x[row + k] * r * dout[row + k];
    }
  }
}

// HF's apply_rotary_pos_emb on the q and k heads of qkv [B, T, (NH + 2 NKV) hs]:
// x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[hs/2:], x[:hs/2]) and the
// angle of element c at position t = t * theta^(-2 (c mod hs/2) / hs) (HF's
// emb = cat(freqs, freqs)). `sign` -1 turns by -angle.
// positions (null: t) give each row's position, as under document masking.
inline void rotary(Vec& qkv, int B, int T, int NH, int NKV, int hs, double theta, double sign = 1.0,
                   const std::vector<std::int32_t>* positions = nullptr) {
  const int half = hs / 2;
  const std::size_t width = static_cast<std::size_t>(NH + 2 * NKV) * hs;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int head = 0; head < NH + NKV; ++head) {
        double* x = qkv.data() + (static_cast<std::size_t>(b) * T + t) * width + static_cast<std::size_t>(head) * hs;
        Vec rotated(hs);
        for (int c = 0; c < hs; ++c) {
          const int p = positions == nullptr ? t : (*positions)[static_cast<std::size_t>(b) * T + t];
          const double angle = sign * p * std::pow(theta, -2.0 * (c % half) / hs);
          const double rotate_half = c < half ? -x[c + half] : x[c - half];
          rotated[c] = x[c] * std::cos(angle) + rotate_half * std::sin(angle);
        }
        for (int c = 0; c < hs; ++c) x[c] = rotated[c];
      }
}

inline double silu(double g) { return g / (1.0 + std::exp(-g)); }

// out [N, H] = silu(gate) * up, gate and up the two halves of each row of gate_up [N, 2H].
inline void swiglu_forward(Vec& out, const Vec& gate_up, int N, int H) {
  out.assign(static_cast<std::size_t>(N) * H, 0.0);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      const std::size_t g = static_cast<std::size_t>(n) * 2 * H + h;
      out[static_cast<std::size_t>(n) * H + h] = silu(gate_up[g]) * gate_up[g + H];
    }
}

// dgate = dout * up * d silu/dg, with silu' = sigmoid + g sigmoid (1 - sigmoid); dup = dout * silu(gate).
inline void swiglu_backward(Vec& dgate_up, const Vec& dout, const Vec& gate_up, int N, int H) {
  dgate_up.assign(static_cast<std::size_t>(N) * 2 * H, 0.0);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      const std::size_t g = static_cast<std::size_t>(n) * 2 * H + h;
      const double d = dout[static_cast<std::size_t>(n) * H + h];
      const double sigmoid = 1.0 / (1.0 + std::exp(-gate_up[g]));
      dgate_up[g] = d * gate_up[g + H] * (sigmoid + gate_up[g] * sigmoid * (1.0 - sigmoid));
      dgate_up[g + H] = d * silu(gate_up[g]);
    }
}

}  // namespace dufu::trainer::reference
