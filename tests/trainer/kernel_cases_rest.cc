// Kernel test rows of the classifier, the vocabulary-parallel pieces, the glue ops, bf16 rounding, norms and AdamW
// (kernel_cases.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dufu/trainer/device.h"
#include "dufu/trainer/kernel_math.h"
#include "dufu/trainer/kernel_partition.h"
#include "dufu/trainer/kernel_table.h"
#include "kernel_cases.h"
#include "kernel_reference.h"
#include "kernel_test_support.h"

namespace dufu::trainer::testing {

namespace ref = reference;

namespace {

// The classifier's inputs (serial and vocab-parallel): logits whose padding columns are
// NaN (a kernel that reads them fails), one ignored target, the mean's scale.
struct ClassifierInputs {
  std::vector<float> logits;
  std::vector<std::int32_t> targets;
  float scale;
  explicit ClassifierInputs(const Shape& s)
      : logits(random_floats(static_cast<std::size_t>(s.N()) * s.Vp, 50, -4.0f, 4.0f)),
        targets(random_tokens(s.N(), s.V, 51)),
        scale(1.0f / static_cast<float>(s.N())) {
    for (int n = 0; n < s.N(); ++n) {
      for (int i = s.V; i < s.Vp; ++i) logits[static_cast<std::size_t>(n) * s.Vp + i] = kNaN;  // must not be read
    }
    if (s.N() > 1) targets[1] = -1;
  }
};

Outputs run_classifier(const Shape& s, Device* device, int) {
  const int N = s.N();
  ClassifierInputs inputs(s);
  auto& [logits, targets, scale] = inputs;
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

template <Operands kOperands = Operands::kFp32>
Outputs run_vocab_parallel_embedding_forward(const Shape& s, Device* device, int) {
  const EmbeddingInputs inputs(s);
  const auto& tokens = inputs.tokens;
  const auto wte = on_grid<kOperands>(inputs.wte);
  const auto wpe = on_grid<kOperands>(inputs.wpe);
  const auto wpe_bits = bf16_bits(wpe);
  if (device != nullptr) {
    const KernelTable& k = device->kernels();
    const int Vl = vocab_slice(s);
    std::vector<float> sum(static_cast<std::size_t>(s.N()) * s.C, 0.0f);
    for (int rank = 0; rank < kVocabRanks; ++rank) {
      DeviceArgs d(*device);
      const auto slice = rows_of(wte, s.C, rank * Vl, Vl);
      std::vector<float> out(sum.size(), kNaN);
      if constexpr (kOperands == Operands::kBf16) {
        const auto slice_bits = bf16_bits(slice);
        k.vocab_parallel_embedding_forward_bf16(d.out(out), d.in(tokens), d.in(slice_bits),
                                                rank == 0 ? d.in(wpe_bits) : nullptr, rank * Vl, Vl, s.B, s.T, s.C);
      } else {
        k.vocab_parallel_embedding_forward(d.out(out), d.in(tokens), d.in(slice), rank == 0 ? d.in(wpe) : nullptr,
                                           rank * Vl, Vl, s.B, s.T, s.C);
      }
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
  ClassifierInputs inputs(s);
  auto& [logits, targets, scale] = inputs;
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

// The float a bf16 of these bits stands for: its bits are the float's upper half.
double float_of_bf16_bits(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return static_cast<double>(value);
}

// store_bf16 both rounds in place and stores: the stored bits must stand for the
// rounded value, which must be the nearest bf16.
Outputs run_store_bf16(const Shape& s, Device* device, int) {
  auto values = random_floats(static_cast<std::size_t>(s.N()) * s.C, 62, -50.0f, 50.0f);
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3e38f, 1e-40f, -0.0f};
  for (std::size_t i = 0; i < std::size(specials) && i < values.size(); ++i) values[i] = specials[i];
  Vec rounded(values.size());
  Vec stored(values.size());
  if (device != nullptr) {
    DeviceArgs d(*device);
    auto in_place = values;
    std::vector<std::uint16_t> bits(values.size(), 0xffff);
    device->kernels().store_bf16(d.out(bits), d.out(in_place), values.size());
    d.finish();
    for (std::size_t i = 0; i < values.size(); ++i) {
      rounded[i] = in_place[i];
      stored[i] = float_of_bf16_bits(bits[i]);
    }
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) rounded[i] = stored[i] = nearest_bf16(values[i]);
  }
  return {{"values", rounded}, {"stored", stored}};
}

// to_bf16 leaves its input alone and writes the bits of the nearest bf16.
Outputs run_to_bf16(const Shape& s, Device* device, int) {
  const auto values = random_floats(static_cast<std::size_t>(s.N()) * s.C, 64, -50.0f, 50.0f);
  Vec bits_as_values(values.size());
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<std::uint16_t> bits(values.size(), 0xffff);
    device->kernels().to_bf16(d.out(bits), d.in(values), values.size());
    d.finish();
    for (std::size_t i = 0; i < values.size(); ++i) bits_as_values[i] = float_of_bf16_bits(bits[i]);
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) bits_as_values[i] = nearest_bf16(values[i]);
  }
  return {{"bits", bits_as_values}};
}

// Random bf16 bit patterns of every kind but NaN and infinity, which the harness's
// tolerances cannot compare.
Outputs run_load_bf16(const Shape& s, Device* device, int) {
  const auto draws = random_tokens(static_cast<std::size_t>(s.N()) * s.C, 0xffff, 63);
  std::vector<std::uint16_t> bits(draws.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    bits[i] = static_cast<std::uint16_t>(draws[i]);
    if (!std::isfinite(float_of_bf16_bits(bits[i]))) bits[i] = 0x3f80;  // 1.0
  }
  Vec loaded(bits.size());
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> values(bits.size(), kNaN);
    device->kernels().load_bf16(d.out(values), d.in(bits), bits.size());
    d.finish();
    loaded = widen(values);
  } else {
    for (std::size_t i = 0; i < bits.size(); ++i) loaded[i] = float_of_bf16_bits(bits[i]);
  }
  return {{"values", loaded}};
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

}  // namespace

std::vector<OpCase> other_op_cases() {
  return {
      {"classifier_forward_backward", run_classifier, {1e-6, 2e-5}, false, true},
      {"vocab_parallel_embedding_forward", run_vocab_parallel_embedding_forward, {1e-6, 1e-6}, true, true},
      {"vocab_parallel_embedding_forward_bf16",
       run_vocab_parallel_embedding_forward<Operands::kBf16>,
       {1e-6, 1e-6},
       true,
       true},
      {"vocab_parallel_embedding_backward", run_vocab_parallel_embedding_backward, {1e-5, 1e-5}, true, true},
      {"vocab_parallel_classifier", run_vocab_parallel_classifier, {1e-6, 2e-5}, false, true},
      {"add", run_add, {0.0, 1e-7}, true, true},
      {"masked_mean_loss", run_masked_mean_loss, {0.0, 1e-6}, true, true},
      {"round_to_bf16", run_round_to_bf16, {0.0, 0.0}, true, true},
      {"store_bf16", run_store_bf16, {0.0, 0.0}, true, true},
      {"load_bf16", run_load_bf16, {0.0, 0.0}, true, true},
      {"to_bf16", run_to_bf16, {0.0, 0.0}, true, true},
      {"sum_of_squares", run_sum_of_squares, {0.0, 1e-12}, true, true},
      {"scale_in_place", run_scale_in_place, {0.0, 1e-7}, true, true},
      {"adamw_update", run_adamw, {1e-7, 1e-6}, true, true},
  };
}

}  // namespace dufu::trainer::testing
