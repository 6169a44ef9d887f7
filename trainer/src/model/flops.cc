#include "dufu/trainer/model/flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "dufu/trainer/device/device.h"

namespace dufu::trainer {

double gpt_training_flops_per_token(const GPTConfig& config, int T) {
  const double C = config.d_model;
  const double L = config.n_layer;
  // Per block, the weights each token multiplies: GPT-2's c_attn 3C·C, c_proj C·C,
  // c_fc 4C·C and mlp c_proj 4C·C = 12·C²; Llama's q and o C·C each, k and v
  // NKV·hs·C each, gate, up and down F·C each.
  const double kv = static_cast<double>(config.kv_heads()) * config.head_size();
  const double F = config.mlp_hidden();
  const double block = config.is_llama() ? C * (2.0 * C + 2.0 * kv + 3.0 * F) : 12.0 * C * C;
  const double matmul_weights = L * block + static_cast<double>(config.padded_vocab_size()) * C;
  const double attention = 12.0 * L * C * static_cast<double>(T);
  return 6.0 * matmul_weights + attention;
}

double measure_sgemm_peak_flops(double seconds, Device& device) {
  constexpr int kRows = 1024, kIn = 768, kOut = 3072;
  DeviceBuffer<float> x(device, static_cast<std::size_t>(kRows) * kIn);
  DeviceBuffer<float> weight(device, static_cast<std::size_t>(kOut) * kIn);
  DeviceBuffer<float> out(device, static_cast<std::size_t>(kRows) * kOut);
  device.fill(x.data(), 0.5f, x.size());
  device.fill(weight.data(), 0.25f, weight.size());
  const auto matmul = device.kernels().matmul_forward;
  const double flops = 2.0 * kRows * kIn * kOut;
  using Clock = std::chrono::steady_clock;
  matmul(out.data(), x.data(), weight.data(), nullptr, kRows, kIn, kOut);  // warm caches and threads
  device.synchronize();
  double best = 0.0;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int runs = 0;
  do {
    const auto start = Clock::now();
    matmul(out.data(), x.data(), weight.data(), nullptr, kRows, kIn, kOut);
    device.synchronize();
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, flops / elapsed);
    ++runs;
  } while (Clock::now() < deadline || runs < 3);
  return best;
}

}  // namespace dufu::trainer
