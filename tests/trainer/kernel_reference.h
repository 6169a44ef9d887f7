// Naive double-precision references for the GPT-2 kernels: the oracles the fast CPU
// kernels are tested against (kernels_test.cc) and the functions whose finite
// differences check every backward (kernels_gradcheck_test.cc). Written for the
// reader, not for speed: one loop per formula, full [T, T] attention matrices with an
// explicit mask, the softmax Jacobian spelled out.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

namespace dufu::trainer::reference {

using Vec = std::vector<double>;

inline std::size_t at(std::size_t row, std::size_t col, std::size_t cols) { return row * cols + col; }

// positions (null: t) index wpe's rows, as under document masking.
inline void embedding_forward(Vec& out, const std::vector<std::int32_t>& tokens, const Vec& wte, const Vec& wpe, int B,
                              int T, int C, const std::vector<std::int32_t>* positions = nullptr) {
  out.assign(static_cast<std::size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const std::size_t n = static_cast<std::size_t>(b) * T + t;
        const std::size_t p = positions == nullptr ? static_cast<std::size_t>(t) : (*positions)[n];
        out[at(n, c, C)] = wte[at(tokens[n], c, C)] + wpe[at(p, c, C)];
      }
}

inline void embedding_backward(Vec& dwte, Vec& dwpe, const Vec& dout, const std::vector<std::int32_t>& tokens, int B,
                               int T, int C, const std::vector<std::int32_t>* positions = nullptr) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const std::size_t n = static_cast<std::size_t>(b) * T + t;
        const std::size_t p = positions == nullptr ? static_cast<std::size_t>(t) : (*positions)[n];
        dwte[at(tokens[n], c, C)] += dout[at(n, c, C)];
        dwpe[at(p, c, C)] += dout[at(n, c, C)];
      }
}

inline void layernorm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& x, const Vec& weight, const Vec& bias, int N,
                              int C) {
  out.assign(static_cast<std::size_t>(N) * C, 0.0);
  mean.assign(N, 0.0);
  rstd.assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[at(n, c, C)];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[at(n, c, C)] - m) * (x[at(n, c, C)] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; ++c) out[at(n, c, C)] = (x[at(n, c, C)] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

// dx += ..., dweight += ..., dbias += ...
inline void layernorm_backward(Vec& dx, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& x, const Vec& weight,
                               int N, int C) {
  Vec out, mean, rstd;
  layernorm_forward(out, mean, rstd, x, weight, Vec(C, 0.0), N, C);
  for (int n = 0; n < N; ++n) {
    // xhat = (x - mean) * rstd; with g = weight * dout,
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    double mean_g = 0.0, mean_g_xhat = 0.0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[at(n, c, C)] - mean[n]) * rstd[n];
      const double g = weight[c] * dout[at(n, c, C)];
      mean_g += g / C;
      mean_g_xhat += g * xhat / C;
    }
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[at(n, c, C)] - mean[n]) * rstd[n];
      const double g = weight[c] * dout[at(n, c, C)];
      dx[at(n, c, C)] += rstd[n] * (g - mean_g - xhat * mean_g_xhat);
      dweight[c] += xhat * dout[at(n, c, C)];
      dbias[c] += dout[at(n, c, C)];
    }
  }
}

// out[N, OC] = x[N, C] weight[OC, C]^T + bias (bias may be empty)
inline void matmul_forward(Vec& out, const Vec& x, const Vec& weight, const Vec& bias, int N, int C, int OC) {
  out.assign(static_cast<std::size_t>(N) * OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double sum = bias.empty() ? 0.0 : bias[o];
      for (int c = 0; c < C; ++c) sum += x[at(n, c, C)] * weight[at(o, c, C)];
      out[at(n, o, OC)] = sum;
    }
}

// dx = dout weight (overwritten); dweight += dout^T x; dbias += column sums of dout
inline void matmul_backward(Vec& dx, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& x, const Vec& weight, int N,
                            int C, int OC) {
  dx.assign(static_cast<std::size_t>(N) * C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double d = dout[at(n, o, OC)];
      for (int c = 0; c < C; ++c) {
        dx[at(n, c, C)] += d * weight[at(o, c, C)];
        dweight[at(o, c, C)] += d * x[at(n, c, C)];
      }
      dbias[o] += d;
    }
}

inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// d/dx of gelu: product rule on 0.5 x (1 + tanh(u(x))).
inline double gelu_grad(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  const double du = std::sqrt(2.0 / std::numbers::pi) * (1.0 + 3.0 * 0.044715 * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

inline void bias_gelu_forward(Vec& out, Vec& pre, const Vec& x, const Vec& bias, int N, int C) {
  out.assign(static_cast<std::size_t>(N) * C, 0.0);
  pre.assign(static_cast<std::size_t>(N) * C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      pre[at(n, c, C)] = x[at(n, c, C)] + bias[c];
      out[at(n, c, C)] = gelu(pre[at(n, c, C)]);
    }
}

// The backward of out = gelu(pre) weight^T + bias taken with x for gelu(pre):
// dpre = gelu'(pre) (dout weight) (overwritten); dweight += dout^T x; dbias += column
// sums of dout.
inline void matmul_gelu_backward(Vec& dpre, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& x, const Vec& weight,
                                 const Vec& pre, int N, int C, int OC) {
  matmul_backward(dpre, dweight, dbias, dout, x, weight, N, C, OC);
  for (std::size_t i = 0; i < dpre.size(); ++i) dpre[i] *= gelu_grad(pre[i]);
}

// The heads of causal attention with grouped K/V heads: qkv [B, T, (NH + 2 NKV) hs],
// each row NH query heads, then NKV key heads, then NKV value heads; query head h
// reads K/V head h / (NH / NKV). NKV = NH is GPT-2's multi-head attention.
struct AttentionHeads {
  int NH, NKV, hs;
  int kv_head(int h) const { return h / (NH / NKV); }
  std::size_t qkv_width() const { return static_cast<std::size_t>(NH + 2 * NKV) * hs; }
  std::size_t out_width() const { return static_cast<std::size_t>(NH) * hs; }
};

// Element i of a head of qkv: part 0 = q (head is a query head, 0 .. NH - 1), 1 = k and
// 2 = v (head is a K/V head, 0 .. NKV - 1).
inline std::size_t qkv_index(int b, int t, int part, int head, int i, int T, const AttentionHeads& a) {
  const int first = part == 0 ? 0 : part == 1 ? a.NH : a.NH + a.NKV;
  return (static_cast<std::size_t>(b) * T + t) * a.qkv_width() + static_cast<std::size_t>(first + head) * a.hs + i;
}

// The full softmax matrix att [B, NH, T, T], zeros above the diagonal, and each row's
// log-sum-exp lse [B, NH, T] of the scaled scores (what the flash kernels keep). With
// document_starts [B, T] (document masking) a row also has zeros before its
// document's start.
inline void attention_probabilities(Vec& att, Vec& lse, const Vec& qkv, int B, int T, const AttentionHeads& a,
                                    const std::vector<std::int32_t>* document_starts = nullptr) {
  const int NH = a.NH, hs = a.hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  att.assign(static_cast<std::size_t>(B) * NH * T * T, 0.0);
  lse.assign(static_cast<std::size_t>(B) * NH * T, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        Vec scores(T);
        for (int k = 0; k < T; ++k) {
          double s = 0.0;
          for (int i = 0; i < hs; ++i)
            s += qkv[qkv_index(b, t, 0, h, i, T, a)] * qkv[qkv_index(b, k, 1, a.kv_head(h), i, T, a)];
          const int start = document_starts == nullptr ? 0 : (*document_starts)[static_cast<std::size_t>(b) * T + t];
          scores[k] = k <= t && k >= start ? s * scale : -std::numeric_limits<double>::infinity();
        }
        double max_score = scores[0];
        for (int k = 0; k < T; ++k) max_score = std::max(max_score, scores[k]);
        double sum = 0.0;
        for (int k = 0; k < T; ++k) sum += std::exp(scores[k] - max_score);
        const std::size_t row_index = (static_cast<std::size_t>(b) * NH + h) * T + t;
        lse[row_index] = max_score + std::log(sum);
        double* row = &att[row_index * T];
        for (int k = 0; k < T; ++k) row[k] = std::exp(scores[k] - max_score) / sum;
      }
}

// out [B, T, NH hs] = att V per query head, and lse as attention_probabilities gives it.
inline void attention_forward(Vec& out, Vec& lse, const Vec& qkv, int B, int T, const AttentionHeads& a,
                              const std::vector<std::int32_t>* document_starts = nullptr) {
  Vec att;
  attention_probabilities(att, lse, qkv, B, T, a, document_starts);
  out.assign(static_cast<std::size_t>(B) * T * a.out_width(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < a.NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* row = &att[((static_cast<std::size_t>(b) * a.NH + h) * T + t) * T];
        for (int i = 0; i < a.hs; ++i) {
          double o = 0.0;
          for (int k = 0; k < T; ++k) o += row[k] * qkv[qkv_index(b, k, 2, a.kv_head(h), i, T, a)];
          out[(static_cast<std::size_t>(b) * T + t) * a.out_width() + static_cast<std::size_t>(h) * a.hs + i] = o;
        }
      }
}

// dqkv (overwritten), through the full softmax Jacobian datt -> dscores; a K/V head's
// gradient collects every query head that reads it.
inline void attention_backward(Vec& dqkv, const Vec& dout, const Vec& qkv, int B, int T, const AttentionHeads& a,
                               const std::vector<std::int32_t>* document_starts = nullptr) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.hs));
  Vec att, lse;
  attention_probabilities(att, lse, qkv, B, T, a, document_starts);
  dqkv.assign(qkv.size(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < a.NH; ++h)
      for (int t = 0; t < T; ++t) {
        const int kv = a.kv_head(h);
        const double* row = &att[((static_cast<std::size_t>(b) * a.NH + h) * T + t) * T];
        const double* g =
            &dout[(static_cast<std::size_t>(b) * T + t) * a.out_width() + static_cast<std::size_t>(h) * a.hs];
        Vec datt(T, 0.0);
        for (int k = 0; k < T; ++k)
          for (int i = 0; i < a.hs; ++i) {
            datt[k] += g[i] * qkv[qkv_index(b, k, 2, kv, i, T, a)];
            dqkv[qkv_index(b, k, 2, kv, i, T, a)] += row[k] * g[i];
          }
        for (int k = 0; k < T; ++k) {
          // d softmax_j / d score_k = att_j (delta_jk - att_k)
          double dscore = 0.0;
          for (int j = 0; j < T; ++j) dscore += row[j] * ((j == k ? 1.0 : 0.0) - row[k]) * datt[j];
          for (int i = 0; i < a.hs; ++i) {
            dqkv[qkv_index(b, t, 0, h, i, T, a)] += dscore * scale * qkv[qkv_index(b, k, 1, kv, i, T, a)];
            dqkv[qkv_index(b, k, 1, kv, i, T, a)] += dscore * scale * qkv[qkv_index(b, t, 0, h, i, T, a)];
          }
        }
      }
}

// losses[n] = -log softmax(logits[n, :V])[target] (0 for target -1)
inline void classifier_losses(Vec& losses, const Vec& logits, const std::vector<std::int32_t>& targets, int N, int V,
                              int Vp) {
  losses.assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    double max_logit = logits[at(n, 0, Vp)];
    for (int i = 0; i < V; ++i) max_logit = std::max(max_logit, logits[at(n, i, Vp)]);
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(logits[at(n, i, Vp)] - max_logit);
    losses[n] = std::log(sum) + max_logit - logits[at(n, targets[n], Vp)];
  }
}

// d(scale · sum losses) / d logits; 0 in the padding and in ignored rows.
inline void classifier_grad(Vec& dlogits, const Vec& logits, const std::vector<std::int32_t>& targets, double scale,
                            int N, int V, int Vp) {
  dlogits.assign(static_cast<std::size_t>(N) * Vp, 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    double max_logit = logits[at(n, 0, Vp)];
    for (int i = 0; i < V; ++i) max_logit = std::max(max_logit, logits[at(n, i, Vp)]);
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(logits[at(n, i, Vp)] - max_logit);
    for (int i = 0; i < V; ++i) {
      const double p = std::exp(logits[at(n, i, Vp)] - max_logit) / sum;
      dlogits[at(n, i, Vp)] = scale * (p - (i == targets[n] ? 1.0 : 0.0));
    }
  }
}

// torch.optim.AdamW (1.13, single-tensor path), one step t >= 1 of the elements
// [begin, end), in double.
inline void adamw_update_range(Vec& params, const Vec& grads, Vec& m, Vec& v, std::size_t begin, std::size_t end,
                               double lr, double beta1, double beta2, double eps, double weight_decay, int t) {
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  for (std::size_t i = begin; i < end; ++i) {
    params[i] *= 1.0 - lr * weight_decay;
    m[i] = beta1 * m[i] + (1.0 - beta1) * grads[i];
    v[i] = beta2 * v[i] + (1.0 - beta2) * grads[i] * grads[i];
    const double denom = std::sqrt(v[i]) / std::sqrt(bias_correction2) + eps;
    params[i] -= lr / bias_correction1 * m[i] / denom;
  }
}

// The same over all the elements.
inline void adamw_update(Vec& params, const Vec& grads, Vec& m, Vec& v, double lr, double beta1, double beta2,
                         double eps, double weight_decay, int t) {
  adamw_update_range(params, grads, m, v, 0, params.size(), lr, beta1, beta2, eps, weight_decay, t);
}

}  // namespace dufu::trainer::reference
