// Kernel test rows of the ops over the vocabulary: the classifier (softmax, loss and its
// gradient) and the vocabulary-parallel embedding and classifier of tensor parallelism
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

// The classifier at GPT-2's vocabulary as the model pads it (V = 50257, Vp = 50304):
// rows of 50k logits, many tiles per CUDA thread, 16-byte groups whose last real one
// straddles V; up to 4 of the shape's rows, the second ignored.
Outputs run_classifier_gpt2_vocabulary(const Shape& s, Device* device, int calls) {
  Shape gpt2 = s;
  gpt2.B = 1;
  gpt2.T = std::min(s.N(), 4);
  gpt2.V = 50257;
  gpt2.Vp = 50304;
  return run_classifier(gpt2, device, calls);
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
        k.vocab_parallel_embedding_forward(d.out(out), d.in(tokens), nullptr, d.in(slice_bits),
                                                rank == 0 ? d.in(wpe_bits) : nullptr, rank * Vl, Vl, s.B, s.T, s.C);
      } else {
        k.vocab_parallel_embedding_forward(d.out(out), d.in(tokens), nullptr, d.in(slice), rank == 0 ? d.in(wpe) : nullptr,
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

// kPositions: position ids that restart in each packed document (document masking):
// every row reaches dwpe, whichever rank holds its token's row.
template <bool kPositions = false>
Outputs run_vocab_parallel_embedding_backward(const Shape& s, Device* device, int calls) {
  const auto [few_tokens, dout, dwte0, dwpe0] = EmbeddingGradInputs(s);
  // With positions, tokens from the whole vocabulary: rows of both ranks' tokens.
  const std::vector<std::int32_t> tokens = kPositions ? random_tokens(s.N(), s.V, 48) : few_tokens;
  const PackedRows packed = packed_rows(s.B, s.T, 47);
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
                                            kPositions ? d.in(packed.positions) : nullptr, rank * Vl, Vl, s.B, s.T,
                                            s.C);
      }
      d.finish();
      const std::size_t first = static_cast<std::size_t>(rank) * Vl * s.C;
      for (std::size_t i = 0; i < slice.size() && first + i < dwte.size(); ++i) dwte[first + i] = slice[i];
    }
    return {{"dwte (ranks' rows)", widen(dwte)}, {"dwpe (rank 0)", widen(dwpe)}};
  }
  Vec dwte(dwte0.size(), 0.0), dwpe(dwpe0.size(), 0.0);
  ref::embedding_backward(dwte, dwpe, widen(dout), tokens, s.B, s.T, s.C, kPositions ? &packed.positions : nullptr);
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

}  // namespace

std::vector<OpCase> vocabulary_op_cases() {
  return {
      {"classifier_forward_backward", run_classifier, {1e-6, 2e-5}, false, true},
      {"classifier_gpt2_vocabulary", run_classifier_gpt2_vocabulary, {1e-6, 2e-5}, false, true},
      {"vocab_parallel_embedding_forward", run_vocab_parallel_embedding_forward, {1e-6, 1e-6}, true, true},
      {"vocab_parallel_embedding_forward_bf16",
       run_vocab_parallel_embedding_forward<Operands::kBf16>,
       {1e-6, 1e-6},
       true,
       true},
      {"vocab_parallel_embedding_backward", run_vocab_parallel_embedding_backward, {1e-5, 1e-5}, true, true},
      {"vocab_parallel_embedding_backward_positions", run_vocab_parallel_embedding_backward<true>, {1e-5, 1e-5}, true,
       true},
      {"vocab_parallel_classifier", run_vocab_parallel_classifier, {1e-6, 2e-5}, false, true},
  };
}

}  // namespace dufu::trainer::testing
