// Tensor parallelism (Megatron-style) against the serial model, run by ctest under
// mpirun -np 1, 2 and 4. Every rank builds the serial GPT and, for each tensor
// parallel size tp the world allows (1, 2, 4), a tensor-parallel GPT over a group of
// tp ranks from the same weights; the loss, this rank's columns of the logits, every
// gradient (gathered back to the serial layout) and five AdamW losses must agree
// within 1e-5 relative, with a vocabulary of 501 that no tp divides. The
// vocab-parallel cross-entropy is also checked alone against the fused serial
// classifier, over the group and with simulated ranks in one process, and the
// mapping between the serial and the sharded layouts is checked element by element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/launch_environment.h"
#include "dufu/common/topology.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/expect_error.h"
#include "support/float_compare.h"
#include "support/gpt_fixture.h"
#include "support/mpi_world.h"
#include "support/parallel_gradient_check.h"

namespace dufu::trainer {
namespace {

using dufu::testing::expect_error;

Communicator& world() { return dufu::testing::mpi_world(); }

constexpr int kB = 2;
constexpr int kT = 16;
constexpr int kVocab = 501;  // prime to 2 and 4: the last rank's slice ends in padding
// Per-step losses, logits and every gradient tensor within this of the serial run,
// relative (for a tensor, relative to its largest magnitude). The partial sums of the
// row-parallel projections and of the softmax denominators are added in another
// order than in the serial matmuls; the errors measured are ~1e-7.
constexpr double kTolerance = 1e-5;

GPTConfig small_config(int vocab_multiple) {
  return dufu::testing::small_gpt_config({.n_layer = 2,
                                          .n_head = 4,
                                          .d_model = 64,
                                          .vocab_size = kVocab,
                                          .vocab_multiple = vocab_multiple,
                                          .seq_length = kT});
}

// Next-token data with a few ignored targets; the same on every rank for a seed.
using Batch = dufu::testing::TokenBatch;
Batch make_batch(std::uint32_t seed) { return dufu::testing::next_token_batch(kB, kT, kVocab, seed, {3, kT + 7}); }

using dufu::testing::random_floats;
using dufu::testing::bitwise_equal;
using dufu::testing::relative_error;
using dufu::testing::scaled_error;

// Only world rank 0 prints the measured errors, once per configuration.
template <typename... Args>
void report(const char* format, Args... args) {
  if (world().rank() == 0) std::printf(format, args...);
}

// The tensor group of size tp this rank belongs to (pp = 1, so dp = world / tp).
// Collective over the world.
std::unique_ptr<Communicator> tensor_group(int tp) {
  const Topology topology(world().size(), tp, 1, world().rank());
  return world().subgroup(topology.tensor_group(), "tensor");
}

// The tensor-parallel sizes this world can run: 1, 2 and 4 where they divide it.
std::vector<int> tensor_parallel_sizes() {
  std::vector<int> sizes;
  for (const int tp : {1, 2, 4}) {
    if (world().size() % tp == 0) sizes.push_back(tp);
  }
  return sizes;
}

// ---- layout and sharding (no communication) ---------------------------------------

TEST(TensorParallelLayout, PaddedVocabularyIsAMultipleOfTheRanks) {
  GPTConfig config = small_config(128);
  EXPECT_EQ(config.padded_vocab_size(), 512);
  EXPECT_EQ(config.padded_vocab_size(2), 512);
  EXPECT_EQ(config.padded_vocab_size(3), 768);
  EXPECT_EQ(config.padded_vocab_size(4), 512);
  config.vocab_size = 50257;
  EXPECT_EQ(config.padded_vocab_size(), 50304);
  EXPECT_EQ(config.padded_vocab_size(4), 50688);  // a multiple of 512
  EXPECT_EQ(config.padded_vocab_size(8), 51200);  // of 1024
  config = small_config(1);
  EXPECT_EQ(config.padded_vocab_size(), 501);
  EXPECT_EQ(config.padded_vocab_size(2), 502);
  EXPECT_EQ(config.padded_vocab_size(4), 504);
  expect_error([&] { (void)config.padded_vocab_size(0); }, {"tensor_parallel_size must be at least 1"});
}

TEST(TensorParallelLayout, ShapesAndSplits) {
  const GPTConfig config = small_config(1);
  const std::vector<ParamTensor> layout = gpt_parameter_layout(config, 4);
  const auto find = [&](const std::string& name) -> const ParamTensor& {
    for (const ParamTensor& tensor : layout) {
      if (tensor.name == name) return tensor;
    }
    throw Error("no " + name);
  };
  using Shape = std::vector<std::size_t>;
  EXPECT_EQ(find("wte.weight").shape, (Shape{126, 64}));  // 504 / 4
  EXPECT_EQ(find("wpe.weight").shape, (Shape{16, 64}));
  EXPECT_EQ(find("h.1.attn.c_attn.weight").shape, (Shape{48, 64}));
  EXPECT_EQ(find("h.1.attn.c_attn.bias").shape, (Shape{48}));
  EXPECT_EQ(find("h.1.attn.c_proj.weight").shape, (Shape{64, 16}));
  EXPECT_EQ(find("h.1.attn.c_proj.bias").shape, (Shape{64}));
  EXPECT_EQ(find("h.1.mlp.c_fc.weight").shape, (Shape{64, 64}));
  EXPECT_EQ(find("h.1.mlp.c_fc.bias").shape, (Shape{64}));
  EXPECT_EQ(find("h.1.mlp.c_proj.weight").shape, (Shape{64, 64}));
  EXPECT_EQ(find("h.1.ln_2.weight").shape, (Shape{64}));
  EXPECT_EQ(find("h.1.attn.c_attn.weight").split, TensorSplit::kRows);
  EXPECT_EQ(find("h.1.attn.c_attn.weight").split_blocks, 3);
  EXPECT_EQ(find("h.1.mlp.c_proj.weight").split, TensorSplit::kColumns);
  EXPECT_EQ(find("h.1.mlp.c_proj.bias").split, TensorSplit::kReplicated);
  EXPECT_EQ(find("wte.weight").split, TensorSplit::kRows);
  EXPECT_TRUE(find("h.1.mlp.c_proj.weight").is_matrix);
  EXPECT_FALSE(find("h.1.mlp.c_fc.bias").is_matrix);
  // The pieces tile a buffer.
  std::size_t next = 0;
  for (const ParamTensor& tensor : layout) {
    EXPECT_EQ(tensor.offset, next) << tensor.name;
    next += tensor.size();
  }
  expect_error([&] { gpt_parameter_layout(config, 3); },
               {"n_head 4 is not divisible by the tensor parallel size 3", "HINT"});
}

// Every element of a full buffer goes to the right place of the right rank's piece
// and back, for tp that do and do not divide the vocabulary.
TEST(TensorParallelLayout, ShardAndUnshardPlaceEveryElement) {
  GPTConfig config = small_config(1);
  config.n_head = 12;  // divisible by 1, 2, 3 and 4
  config.d_model = 48;
  const std::vector<ParamTensor> full_layout = gpt_parameter_layout(config);
  const std::size_t full_size = full_layout.back().offset + full_layout.back().size();
  // Each element holds its own index, so a misplaced one is seen; wte's padding
  // rows (none here with vocab_multiple 1, but kept general) hold 0.
  std::vector<float> full(full_size);
  for (std::size_t i = 0; i < full_size; ++i) full[i] = static_cast<float>(i);
  const std::size_t C = 48;
  for (const int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "tp " << tp);
    const std::vector<ParamTensor> layout = gpt_parameter_layout(config, tp);
    const std::size_t local_size = layout.back().offset + layout.back().size();
    std::vector<float> assembled(full_size, -1.0f);
    for (int rank = 0; rank < tp; ++rank) {
      std::vector<float> local(local_size, -1.0f);
      shard_gpt_buffer(config, tp, rank, full, local);
      const std::size_t r = static_cast<std::size_t>(rank);
      const std::size_t ranks = static_cast<std::size_t>(tp);
      const auto at = [&](const std::vector<ParamTensor>& in, const std::string& name) {
        for (const ParamTensor& tensor : in) {
          if (tensor.name == name) return tensor.offset;
        }
        throw Error("no " + name);
      };
      // c_attn: local row j * C/tp + i (block j of q, k, v) is full row j * C + rank * C/tp + i.
      const std::size_t Cl = C / ranks;
      for (std::size_t block = 0; block < 3; ++block) {
        const std::size_t local_row = block * Cl + 1;
        const std::size_t full_row = block * C + r * Cl + 1;
        EXPECT_EQ(local[at(layout, "h.1.attn.c_attn.weight") + local_row * C + 5],
                  full[at(full_layout, "h.1.attn.c_attn.weight") + full_row * C + 5]);
        EXPECT_EQ(local[at(layout, "h.1.attn.c_attn.bias") + local_row],
                  full[at(full_layout, "h.1.attn.c_attn.bias") + full_row]);
      }
      // mlp.c_proj [C, 4C]: local column i of row o is full column rank * 4C/tp + i.
      const std::size_t Fl = 4 * C / ranks;
      EXPECT_EQ(local[at(layout, "h.0.mlp.c_proj.weight") + 7 * Fl + 2],
                full[at(full_layout, "h.0.mlp.c_proj.weight") + 7 * 4 * C + r * Fl + 2]);
      // wte: local row i is vocabulary id rank * Vl + i; ids from vocab_size on are 0.
      const std::size_t Vl = static_cast<std::size_t>(config.padded_vocab_size(tp)) / ranks;
      for (std::size_t i = 0; i < Vl; ++i) {
        const std::size_t id = r * Vl + i;
        const float want = id < kVocab ? full[at(full_layout, "wte.weight") + id * C + 3] : 0.0f;
        EXPECT_EQ(local[at(layout, "wte.weight") + i * C + 3], want) << "rank " << rank << " row " << i;
      }
      unshard_gpt_buffer(config, tp, rank, local, assembled);
    }
    EXPECT_TRUE(bitwise_equal(assembled, full));
  }
  std::vector<float> wrong(3);
  expect_error([&] { shard_gpt_buffer(config, 2, 0, full, wrong); }, {"shard_gpt_buffer", "floats"});
  expect_error([&] { shard_gpt_buffer(config, 2, 2, full, wrong); }, {"rank 2 is not in [0, 2)"});
}

// ---- the vocab-parallel cross-entropy ---------------------------------------------

struct ClassifierCase {
  int V;
  int vocab_multiple;
  int tp;
};

// Serial classifier_forward_backward on the full logits [N, Vp] against the three
// vocab-parallel phases on the ranks' column slices, with `reduce_max` and
// `reduce_sum` doing the all-reduces; returns {loss error, gradient error}, the
// largest over the ranks this process computes (`ranks`).
struct ClassifierErrors {
  double loss = 0.0;
  double gradient = 0.0;
};
template <typename ReduceMax, typename ReduceSum>
ClassifierErrors check_vocab_parallel_classifier(const ClassifierCase& c, const std::vector<int>& ranks,
                                                 ReduceMax reduce_max, ReduceSum reduce_sum) {
  const int N = 37;
  const int Vp = (c.V + c.vocab_multiple * c.tp - 1) / (c.vocab_multiple * c.tp) * (c.vocab_multiple * c.tp);
  const int Vl = Vp / c.tp;
  std::vector<float> logits = random_floats(static_cast<std::size_t>(N) * Vp, 11, -6.0f, 6.0f);
  std::mt19937 engine(12);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  for (auto& target : targets) target = static_cast<std::int32_t>(engine() % static_cast<std::uint32_t>(c.V));
  targets[0] = -1;
  targets[5] = -1;
  targets[6] = c.V - 1;  // in the last rank's slice, next to the padding
  targets[7] = 0;
  const float scale = 1.0f / 35.0f;

  // Each rank's columns, before the serial kernel overwrites the logits.
  const std::size_t count = ranks.size();
  std::vector<std::vector<float>> local(count, std::vector<float>(static_cast<std::size_t>(N) * Vl));
  for (std::size_t k = 0; k < count; ++k) {
    for (int n = 0; n < N; ++n) {
      for (int i = 0; i < Vl; ++i) {
        local[k][static_cast<std::size_t>(n) * Vl + i] = logits[static_cast<std::size_t>(n) * Vp + ranks[k] * Vl + i];
      }
    }
  }
  std::vector<float> losses(static_cast<std::size_t>(N));
  cpu_device().kernels().classifier_forward_backward(logits.data(), losses.data(), targets.data(), scale, N, c.V, Vp);

  std::vector<std::vector<float>> row_max(count, std::vector<float>(static_cast<std::size_t>(N)));
  std::vector<std::vector<double>> stats(count, std::vector<double>(2 * static_cast<std::size_t>(N)));
  std::vector<std::vector<float>> local_losses(count, std::vector<float>(static_cast<std::size_t>(N), -1.0f));
  for (std::size_t k = 0; k < count; ++k) {
    cpu_device().kernels().vocab_parallel_classifier_max(row_max[k].data(), local[k].data(), targets.data(), N, c.V,
                                                         ranks[k] * Vl, Vl);
  }
  reduce_max(row_max);
  for (std::size_t k = 0; k < count; ++k) {
    cpu_device().kernels().vocab_parallel_classifier_exp_sum(stats[k].data(), local[k].data(), row_max[k].data(),
                                                             targets.data(), N, c.V, ranks[k] * Vl, Vl);
  }
  reduce_sum(stats);
  ClassifierErrors errors;
  for (std::size_t k = 0; k < count; ++k) {
    cpu_device().kernels().vocab_parallel_classifier_finish(local[k].data(), local_losses[k].data(), stats[k].data(),
                                                            row_max[k].data(), targets.data(), scale, N, c.V,
                                                            ranks[k] * Vl, Vl);
    std::vector<float> want(static_cast<std::size_t>(N) * Vl);
    for (int n = 0; n < N; ++n) {
      EXPECT_EQ(local_losses[k][static_cast<std::size_t>(n)] == 0.0f, targets[static_cast<std::size_t>(n)] == -1)
          << "row " << n;
      errors.loss = std::max(errors.loss, relative_error(local_losses[k][static_cast<std::size_t>(n)],
                                                         losses[static_cast<std::size_t>(n)]));
      for (int i = 0; i < Vl; ++i) {
        want[static_cast<std::size_t>(n) * Vl + i] = logits[static_cast<std::size_t>(n) * Vp + ranks[k] * Vl + i];
        // Padding columns and ignored rows: exactly 0.
        if (ranks[k] * Vl + i >= c.V || targets[static_cast<std::size_t>(n)] == -1) {
          EXPECT_EQ(local[k][static_cast<std::size_t>(n) * Vl + i], 0.0f) << "row " << n << " column " << i;
        }
      }
    }
    errors.gradient = std::max(errors.gradient, scaled_error(local[k], want));
  }
  return errors;
}

const ClassifierCase kClassifierCases[] = {
    {kVocab, 1, 1},  {kVocab, 1, 2}, {kVocab, 1, 3},  {kVocab, 1, 4}, {kVocab, 8, 4},
    {kVocab, 128, 2}, {kVocab, 1, 5}, {5, 4, 4},  // V = 5 over 4 ranks of 4: two ranks hold only padding
};

// All the ranks in this process: the reductions are loops.
TEST(VocabParallelClassifier, SimulatedRanksMatchTheSerialClassifier) {
  for (const ClassifierCase& c : kClassifierCases) {
    SCOPED_TRACE(::testing::Message() << "V " << c.V << " multiple " << c.vocab_multiple << " tp " << c.tp);
    std::vector<int> ranks(static_cast<std::size_t>(c.tp));
    for (int r = 0; r < c.tp; ++r) ranks[static_cast<std::size_t>(r)] = r;
    const auto reduce_max = [](std::vector<std::vector<float>>& per_rank) {
      for (std::size_t i = 0; i < per_rank[0].size(); ++i) {
        float m = per_rank[0][i];
        for (const auto& values : per_rank) m = std::max(m, values[i]);
        for (auto& values : per_rank) values[i] = m;
      }
    };
    const auto reduce_sum = [](std::vector<std::vector<double>>& per_rank) {
      for (std::size_t i = 0; i < per_rank[0].size(); ++i) {
        double sum = per_rank[0][i];
        for (std::size_t k = 1; k < per_rank.size(); ++k) sum += per_rank[k][i];
        for (auto& values : per_rank) values[i] = sum;
      }
    };
    const ClassifierErrors errors = check_vocab_parallel_classifier(c, ranks, reduce_max, reduce_sum);
    EXPECT_LE(errors.loss, 1e-6);
    EXPECT_LE(errors.gradient, 1e-6);
  }
}

// One rank per process: the reductions are the tensor group's all-reduces.
TEST(VocabParallelClassifier, OverTheTensorGroupMatchesTheSerialClassifier) {
  for (const int tp : tensor_parallel_sizes()) {
    std::unique_ptr<Communicator> group = tensor_group(tp);
    for (const int vocab_multiple : {1, 128}) {
      const ClassifierCase c{kVocab, vocab_multiple, tp};
      SCOPED_TRACE(::testing::Message() << "tp " << tp << " multiple " << vocab_multiple);
      const auto reduce_max = [&](std::vector<std::vector<float>>& mine) { group->all_reduce(mine[0], ReduceOp::kMax); };
      const auto reduce_sum = [&](std::vector<std::vector<double>>& mine) { group->all_reduce(mine[0]); };
      const ClassifierErrors errors = check_vocab_parallel_classifier(c, {group->rank()}, reduce_max, reduce_sum);
      EXPECT_LE(errors.loss, 1e-6);
      EXPECT_LE(errors.gradient, 1e-6);
      report("vocab-parallel classifier, tp %d, vocab 501 padded to a multiple of %d: loss error %.2e, gradient %.2e\n",
             tp, vocab_multiple * tp, errors.loss, errors.gradient);
    }
  }
}

// ---- the tensor-parallel GPT against the serial one --------------------------------

class TensorParallelGPT : public ::testing::TestWithParam<int> {};  // vocab_multiple

TEST_P(TensorParallelGPT, MatchesTheSerialModel) {
  const GPTConfig config = small_config(GetParam());
  const std::uint32_t seed = 42;
  for (const int tp : tensor_parallel_sizes()) {
    SCOPED_TRACE(::testing::Message() << "tp " << tp << ", vocab_multiple " << config.vocab_multiple);
    std::unique_ptr<Communicator> group = tensor_group(tp);
    GPT serial(config);
    serial.init_gpt2(seed);
    GPT parallel(config, group.get());
    ASSERT_EQ(parallel.tensor_parallel_size(), tp);
    ASSERT_EQ(parallel.tensor_parallel_rank(), group->rank());

    // Initialisation: the serial weights, sliced; gather and load invert each other.
    parallel.init_gpt2(seed);
    EXPECT_TRUE(bitwise_equal(parallel.gather_full_parameters(), serial.params()));
    std::vector<float> local_init(parallel.params().begin(), parallel.params().end());
    parallel.load_full_parameters(serial.params());
    EXPECT_TRUE(bitwise_equal(parallel.params(), local_init));

    // Logits: this rank's columns of the serial logits, padding columns 0.
    const Batch batch = make_batch(1);
    EXPECT_TRUE(std::isnan(serial.forward(batch.tokens, {}, kB, kT)));
    EXPECT_TRUE(std::isnan(parallel.forward(batch.tokens, {}, kB, kT)));
    const int Vp = config.padded_vocab_size();
    const int Vl = parallel.local_vocab_size();
    EXPECT_EQ(Vl, config.padded_vocab_size(tp) / tp);
    EXPECT_EQ(parallel.vocab_begin(), group->rank() * Vl);
    const std::span<const float> local_logits = parallel.logits();
    ASSERT_EQ(local_logits.size(), static_cast<std::size_t>(kB * kT * Vl));
    std::vector<float> got;
    std::vector<float> want;
    for (int n = 0; n < kB * kT; ++n) {
      for (int i = 0; i < Vl; ++i) {
        const int id = parallel.vocab_begin() + i;
        const float value = local_logits[static_cast<std::size_t>(n * Vl + i)];
        if (id >= kVocab) {
          EXPECT_EQ(value, 0.0f) << "padding column " << id;
          continue;
        }
        got.push_back(value);
        want.push_back(serial.logits()[static_cast<std::size_t>(n * Vp + id)]);
      }
    }
    const double logits_error = scaled_error(got, want);
    EXPECT_LE(logits_error, kTolerance);

    // Loss and gradients.
    const float serial_loss = serial.forward(batch.tokens, batch.targets, kB, kT);
    const float parallel_loss = parallel.forward(batch.tokens, batch.targets, kB, kT);
    const double loss_error = relative_error(parallel_loss, serial_loss);
    EXPECT_LE(loss_error, kTolerance) << parallel_loss << " vs " << serial_loss;
    serial.zero_grad();
    serial.backward();
    parallel.zero_grad();
    parallel.backward();
    const std::vector<float> grads = parallel.gather_full_gradients();
    ASSERT_EQ(grads.size(), serial.num_parameters());
    const double grad_error = dufu::testing::expect_gradients_near_serial(serial, grads, kTolerance, "");
    if (tp == 1) {
      // A group of one is the serial model, bit for bit.
      EXPECT_EQ(parallel_loss, serial_loss);
      EXPECT_TRUE(bitwise_equal(parallel.grads(), serial.grads()));
    }
    // Replicated parameters get bitwise the same gradient on every rank (gpt.cc's
    // backward relies on it instead of reducing them): compare with rank 0's.
    dufu::testing::expect_replicated_gradients_equal_across(parallel, *group);
    // The gradient norm over the group counts every element once.
    const double norm_squared = parallel.full_sum_of_squares(parallel.grads());
    EXPECT_LE(relative_error(norm_squared, cpu_device().kernels().sum_of_squares(grads.data(), grads.size())), 1e-12);

    // Five AdamW steps, each rank on its own pieces, with new batches.
    AdamW serial_optimizer(serial, AdamWOptions{});
    AdamW parallel_optimizer(parallel, AdamWOptions{});
    double adamw_error = 0.0;
    for (int step = 0; step < 5; ++step) {
      const Batch next = make_batch(static_cast<std::uint32_t>(100 + step));
      serial.zero_grad();
      parallel.zero_grad();
      const float serial_step_loss = serial.forward(next.tokens, next.targets, kB, kT);
      const float parallel_step_loss = parallel.forward(next.tokens, next.targets, kB, kT);
      serial.backward();
      parallel.backward();
      serial_optimizer.step(serial.params(), serial.grads(), 3e-3f);
      parallel_optimizer.step(parallel.params(), parallel.grads(), 3e-3f);
      const double error = relative_error(parallel_step_loss, serial_step_loss);
      EXPECT_LE(error, kTolerance) << "step " << step << ": " << parallel_step_loss << " vs " << serial_step_loss;
      adamw_error = std::max(adamw_error, error);
      report("  tp %d, vocab multiple %d, AdamW step %d: loss %.7f (serial %.7f)\n", tp, config.vocab_multiple, step,
             static_cast<double>(parallel_step_loss), static_cast<double>(serial_step_loss));
    }
    report("tp %d, vocab_multiple %d (padded vocab %d): loss error %.2e, logits %.2e, gradients %.2e, "
           "5 AdamW losses %.2e\n",
           tp, config.vocab_multiple, config.padded_vocab_size(tp), loss_error, logits_error, grad_error,
           adamw_error);
  }
}

INSTANTIATE_TEST_SUITE_P(VocabMultiple, TensorParallelGPT, ::testing::Values(1, 128),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "VocabMultiple" + std::to_string(info.param);
                         });

// train.recompute under tensor parallelism: a fully recomputed layer repeats the
// attention projection's all-reduce, and the gradients are the stored model's bits.
TEST(TensorParallelRecompute, RecomputationGivesTheSameBits) {
  const GPTConfig config = small_config(1);
  for (const int tp : tensor_parallel_sizes()) {
    for (const auto& [precision, recompute] : {std::pair{Precision::kFp32, Recompute::kFull},
                                              std::pair{Precision::kBf16, Recompute::kFull},
                                              std::pair{Precision::kBf16, Recompute::kSelective}}) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << ", " << precision_name(precision) << ", recompute "
                                        << recompute_name(recompute));
      std::unique_ptr<Communicator> group = tensor_group(tp);
      GPT stored(config, group.get(), {}, nullptr, GPTRecipe{.precision = precision});
      GPT recomputed(config, group.get(), {}, nullptr, GPTRecipe{.precision = precision, .recompute = recompute});
      for (GPT* model : {&stored, &recomputed}) {
        model->init_gpt2(17);
        model->zero_grad();
      }
      for (int micro = 0; micro < 2; ++micro) {
        const Batch batch = make_batch(static_cast<std::uint32_t>(300 + micro));
        const float want = stored.forward(batch.tokens, batch.targets, kB, kT, 0.01f);
        const float got = recomputed.forward(batch.tokens, batch.targets, kB, kT, 0.01f);
        EXPECT_EQ(got, want) << "micro-batch " << micro;
        stored.backward();
        recomputed.backward();
      }
      EXPECT_TRUE(bitwise_equal(recomputed.grads(), stored.grads()));
    }
  }
}

TEST(TensorParallelGPTErrors, HeadsMustSplitEvenly) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  std::unique_ptr<Communicator> group = tensor_group(2);
  GPTConfig config = small_config(1);
  config.n_head = 3;
  config.d_model = 48;
  // Thrown on every rank alike, before any communication.
  expect_error([&] { GPT model(config, group.get()); },
               {"n_head 3 is not divisible by the tensor parallel size 2", "HINT"});
}

}  // namespace
}  // namespace dufu::trainer

