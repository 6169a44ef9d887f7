// AdamW step time on a GPT's parameter layout (GPT-2 124M by default): AdamW::step,
// one OpenMP parallel region over the whole buffer, against the baseline it replaced,
// one adamw_update call (and so one parallel region, one fork/join) per parameter
// tensor, reimplemented here. Both run in the same process, interleaved, on buffers
// of their own; the program first checks that the two give bitwise identical
// parameters and moments, then reports the median time of each, the GB/s it
// reaches (7 floats moved per parameter: params, grads, m, v read; params, m, v
// written) and the ratio. Threads: OpenMP's (OMP_NUM_THREADS).
//
// The case that motivated the single pass is a core shared with another busy process,
// where every fork/join can wait for a descheduled thread: run it once idle and once
// next to e.g. `sh -c 'while :; do :; done' &`.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using dufu::trainer::AdamW;
using dufu::trainer::AdamWOptions;
using dufu::trainer::AdamWSegment;
using dufu::trainer::ParamTensor;

// The baseline: the optimizer's state and its per-tensor step, as AdamW::step was.
struct PerTensorAdamW {
  std::vector<ParamTensor> layout;
  AdamWOptions options;
  std::vector<float> m, v;
  int t = 0;

  void step(float* params, const float* grads, float lr) {
    ++t;
    for (const ParamTensor& tensor : layout) {
      const AdamWSegment one[] = {{tensor.size(), tensor.is_matrix ? options.weight_decay : 0.0f}};
      const std::size_t at = tensor.offset;
      dufu::trainer::cpu_device().kernels().adamw_update(params + at, grads + at, m.data() + at, v.data() + at,
                                                         std::span<const AdamWSegment>(one), lr, options.beta1,
                                                         options.beta2, options.eps, t, 1.0f);
    }
  }
};

bool same_bits(const std::vector<float>& a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"AdamW step: one parallel pass vs one parallel region per tensor"};
  dufu::trainer::GPTConfig config = dufu::trainer::gpt2_small();
  int repeats = 15;
  int check_steps = 2;
  app.add_option("--layers", config.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--d-model", config.d_model, "model width")->capture_default_str();
  app.add_option("--heads", config.n_head, "attention heads")->capture_default_str();
  app.add_option("--repeats", repeats, "timed steps of each variant, interleaved")->capture_default_str();
  app.add_option("--check-steps", check_steps, "steps compared bitwise before timing")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  config.validate();

  const std::vector<ParamTensor> layout = dufu::trainer::gpt_parameter_layout(config);
  const std::size_t n = layout.back().offset + layout.back().size();
  const AdamWOptions options;  // GPT-2's: betas (0.9, 0.95), eps 1e-8, decay 0.1 on matrices
  const float lr = 6e-4f;

  std::mt19937 rng(1337);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> grads(n);
  for (float& g : grads) g = normal(rng);
  std::vector<float> params_one_pass(n);
  for (float& p : params_one_pass) p = normal(rng);
  std::vector<float> params_per_tensor = params_one_pass;

  AdamW one_pass(layout, n, options);
  PerTensorAdamW per_tensor{layout, options, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};

  // Correctness first: the same steps from the same state give the same bits.
  for (int step = 0; step < check_steps; ++step) {
    one_pass.step(params_one_pass, grads, lr);
    per_tensor.step(params_per_tensor.data(), grads.data(), lr);
  }
  if (!same_bits(params_per_tensor, params_one_pass) || !same_bits(per_tensor.m, one_pass.m()) ||
      !same_bits(per_tensor.v, one_pass.v())) {
    std::fprintf(stderr, "adamw_benchmark: the one-pass step differs from the per-tensor step; not timing\n");
    return 1;
  }

  std::vector<double> seconds_one_pass, seconds_per_tensor;
  for (int r = 0; r < repeats; ++r) {
    // Alternate which goes first, so a slow spell of the machine hits both.
    for (int k = 0; k < 2; ++k) {
      const bool run_one_pass = (r + k) % 2 == 0;
      const auto start = Clock::now();
      if (run_one_pass) {
        one_pass.step(params_one_pass, grads, lr);
      } else {
        per_tensor.step(params_per_tensor.data(), grads.data(), lr);
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      (run_one_pass ? seconds_one_pass : seconds_per_tensor).push_back(seconds);
    }
  }

  const double bytes = 7.0 * sizeof(float) * static_cast<double>(n);
  const double baseline = median(seconds_per_tensor), fast = median(seconds_one_pass);
  std::printf("AdamW step over %zu parameters in %zu tensors, %d OpenMP threads, %d steps each (bitwise equal: yes)\n",
              n, layout.size(), omp_get_max_threads(), repeats);
  std::printf("  per-tensor regions (baseline): median %8.2f ms  %6.2f GB/s  (min %.2f, max %.2f)\n", 1e3 * baseline,
              bytes / baseline / 1e9, 1e3 * *std::min_element(seconds_per_tensor.begin(), seconds_per_tensor.end()),
              1e3 * *std::max_element(seconds_per_tensor.begin(), seconds_per_tensor.end()));
  std::printf("  one parallel pass:             median %8.2f ms  %6.2f GB/s  (min %.2f, max %.2f)\n", 1e3 * fast,
              bytes / fast / 1e9, 1e3 * *std::min_element(seconds_one_pass.begin(), seconds_one_pass.end()),
              1e3 * *std::max_element(seconds_one_pass.begin(), seconds_one_pass.end()));
  std::printf("adamw_benchmark params=%zu tensors=%zu threads=%d baseline_ms=%.3f one_pass_ms=%.3f speedup=%.3f\n", n,
              layout.size(), omp_get_max_threads(), 1e3 * baseline, 1e3 * fast, baseline / fast);
  return 0;
}
