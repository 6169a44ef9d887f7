// Per-element math of the GPT-2 kernels, shared by the CPU implementations (src/cpu/)
// and the CUDA ones (src/cuda/): each formula is written once, here, so the CPU tests
// also cover what the GPU runs. Only inline, dependency-free functions belong here.
#pragma once

#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define DUFU_HOST_DEVICE __host__ __device__
#else
#define DUFU_HOST_DEVICE
#endif

namespace dufu::trainer {

// GPT-2 and torch.nn.LayerNorm's default.
inline constexpr float kLayerNormEps = 1e-5f;

// exp(x) in plain float arithmetic (Cephes' expf: range reduction by ln 2, a degree-6
// polynomial, the exponent set through the bits), within 1e-7 relative of exp. It
// exists because a loop calling libm's expf cannot be vectorized without -ffast-math,
// and the softmaxes and GELU run it billions of times. Finite inputs are clamped to
// [-87.3, 88.3], where the result stays a normal float (exp(-inf) is ~1e-38, not 0);
// NaN stays NaN. Softmax arguments are <= 0.
DUFU_HOST_DEVICE inline float exp_approx(float x) {
  // The clamp works on the bits with masks rather than with float compares and
  // selects: under the default -ftrapping-math, GCC turns the latter into branches
  // it then refuses to vectorize.
  const int kHigh = 0x42b0999a;  // 88.3f
  const int kLow = 0xc2ae999a;   // -87.3f
  const int kLowMagnitude = 0x42ae999a;
  const int kInfinity = 0x7f800000;  // magnitudes above it are NaN
  int bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const int magnitude = bits & 0x7fffffff;
  const int above = -static_cast<int>((bits > kHigh) & (bits <= kInfinity));
  const int below = -static_cast<int>((bits < 0) & (magnitude > kLowMagnitude) & (magnitude <= kInfinity));
  bits = (bits & ~(above | below)) | (kHigh & above) | (kLow & below);
  std::memcpy(&x, &bits, sizeof(x));
  // n = round(x / ln 2): adding 1.5 * 2^23 pushes the fraction out, and leaves n in
  // the low bits of the sum, from where it becomes the exponent of 2^n below.
  const float kRound = 12582912.0f;
  const int kRoundBits = 0x4b400000;
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  // r = x - n ln 2, with ln 2 split in two so that n * 0.693359375 is exact.
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  const int exponent_bits = (shifted_bits - kRoundBits + 127) << 23;  // 2^n, n in [-126, 127]
  float two_to_n;
  std::memcpy(&two_to_n, &exponent_bits, sizeof(two_to_n));
  return p * two_to_n;
}

// GELU, tanh approximation (GPT-2's "gelu_new", torch's approximate="tanh"):
// 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3). Since
// 0.5 (1 + tanh(u)) = sigmoid(2u), it is computed as x * sigmoid(2u): one exp, and no
// 1 - tanh^2 cancellation in the derivative.
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

DUFU_HOST_DEVICE inline float gelu_tanh(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + exp_approx(-2.0f * u));
}

// d gelu_tanh / dx = s + 2 x s (1 - s) du/dx with s = sigmoid(2u); s (1 - s) is taken
// as e s^2 (e = exp(-2u)), exact where 1 - s would round to 0.
DUFU_HOST_DEVICE inline float gelu_tanh_grad(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float du = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  const float e = exp_approx(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  return s + 2.0f * x * (e * s * s) * du;
}

// The scalars of one AdamW step, computed once per step rather than per element.
struct AdamWStep {
  float beta1;
  float beta2;
  float eps;
  float decay;                  // 1 - lr * weight_decay
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

// Mirrors torch.optim.AdamW 1.13 (single-tensor path): the bias corrections are
// computed in double, like Python floats, then rounded once.
DUFU_HOST_DEVICE inline AdamWStep make_adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                                                  int t) {
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  AdamWStep step{};
  step.beta1 = beta1;
  step.beta2 = beta2;
  step.eps = eps;
  step.decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  step.step_size = static_cast<float>(lr / bias_correction1);
  step.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  return step;
}

// One parameter's update, in torch's order of operations: decoupled decay, moments,
// then param -= step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
DUFU_HOST_DEVICE inline void adamw_element(float& param, float grad, float& m, float& v, const AdamWStep& s) {
  m = m * s.beta1 + (1.0f - s.beta1) * grad;
  v = v * s.beta2 + (1.0f - s.beta2) * grad * grad;
  const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
  param = param * s.decay - s.step_size * (m / denom);
}

}  // namespace dufu::trainer
