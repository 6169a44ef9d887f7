// Per-element math of the Llama-family kernels (RMSNorm, rotary position embedding,
// SwiGLU), shared by the CPU implementations (src/cpu/) and the CUDA ones (src/cuda/)
// like kernel_math.h: each formula is written once, so the CPU tests cover what the
// GPU runs. Only inline, dependency-free functions belong here.
#pragma once

#include <cmath>

#include "device/kernel_math.h"

namespace dufu::trainer {

// ---- RMSNorm -------------------------------------------------------------------------

// 1 / sqrt(mean(x^2) + eps) of a row of C values whose squares sum to sum_sq.
DUFU_HOST_DEVICE inline float rmsnorm_rstd(float sum_sq, int C, float eps) {
  return 1.0f / std::sqrt(sum_sq / static_cast<float>(C) + eps);
}

// dx of one element: with norm = x * rstd and dnorm = weight * dout,
// dx = rstd * (dnorm - norm * mean(dnorm * norm)), the mean over the row (the one
// projection RMSNorm removes: onto norm itself; LayerNorm also removes the mean).
DUFU_HOST_DEVICE inline float rmsnorm_dx(float dnorm, float norm, float dnorm_norm_mean, float rstd) {
  return (dnorm - norm * dnorm_norm_mean) * rstd;
}

// ---- rotary position embedding (HF Llama's rotate_half convention) -------------------
//
// Head dimension hs (even) is cut into halves: element i < hs/2 pairs with i + hs/2,
// and the pair at position t turns by the angle t * inv_freq(i), with
// inv_freq(i) = theta^(-2i/hs). The angle is formed as HF forms it, in float
// (float(t) * float inv_freq), and its cosine and sine are taken in double and rounded
// once, so the CPU and the GPU get the same bits.

// HF's float32 steps: exponent = float(2i) / hs, theta^exponent rounded to float (as
// torch's float pow, itself within an ulp of exact, gives it), then 1 / that in float.
DUFU_HOST_DEVICE inline float rotary_inv_freq(int i, int hs, float theta) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(hs);
  const float power = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(exponent)));
  return 1.0f / power;
}

// cos and sin of pair i's angle at position t.
DUFU_HOST_DEVICE inline void rotary_cos_sin(int t, int i, int hs, float theta, float& cos_out, float& sin_out) {
  const float angle = static_cast<float>(t) * rotary_inv_freq(i, hs, theta);
  cos_out = static_cast<float>(std::cos(static_cast<double>(angle)));
  sin_out = static_cast<float>(std::sin(static_cast<double>(angle)));
}

// Turns the pair (x1 = x[i], x2 = x[i + hs/2]) by the angle whose cos and sin are
// given: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1). The backward is
// the transpose, the turn by -angle: the same call with -sin.
DUFU_HOST_DEVICE inline void rotate_pair(float& x1, float& x2, float cos_a, float sin_a) {
  const float a = x1;
  const float b = x2;
  x1 = a * cos_a - b * sin_a;
  x2 = b * cos_a + a * sin_a;
}

// ---- SwiGLU --------------------------------------------------------------------------

// silu(g) = g * sigmoid(g); exp_approx keeps the loop vectorizable (kernel_math.h).
DUFU_HOST_DEVICE inline float swiglu(float gate, float up) { return gate / (1.0f + exp_approx(-gate)) * up; }

// The gradients of out = silu(gate) * up: dup = dout * silu(gate) and
// dgate = dout * up * silu'(gate), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
DUFU_HOST_DEVICE inline void swiglu_grad(float dout, float gate, float up, float& dgate, float& dup) {
  const float s = 1.0f / (1.0f + exp_approx(-gate));
  dup = dout * gate * s;
  dgate = dout * up * (s * (1.0f + gate * (1.0f - s)));
}

}  // namespace dufu::trainer
