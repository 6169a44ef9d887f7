// Kernel test rows of the ops of a training step around the layers: the glue between
// them (the residual add of a pipeline stage, the mean of the per-row losses), the
// gradient's sum of squares and scaling (clipping), and the AdamW update
// (kernel_cases.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

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

}  // namespace

std::vector<OpCase> step_op_cases() {
  return {
      {"add", run_add, {0.0, 1e-7}, true, true},
      {"masked_mean_loss", run_masked_mean_loss, {0.0, 1e-6}, true, true},
      {"sum_of_squares", run_sum_of_squares, {0.0, 1e-12}, true, true},
      {"scale_in_place", run_scale_in_place, {0.0, 1e-7}, true, true},
      {"adamw_update", run_adamw, {1e-7, 1e-6}, true, true},
  };
}

}  // namespace dufu::trainer::testing
