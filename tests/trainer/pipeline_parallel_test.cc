// Pipeline parallelism against the serial model, run by ctest under mpirun -np 2 and
// 4. For every layout the world allows (pp 2 and 4 with tp 1, and tp 2 x pp 2) each
// rank builds the serial GPT and its stage of the pipelined one from the same seed,
// runs five AdamW steps of 2, 4 and 6 micro-batches (the serial model by gradient
// accumulation, the pipeline by the 1F1B schedule) and checks, at every step from the
// serial model's weights (see kTolerance), the losses within 1e-5 relative and every
// gradient (assembled to the full layout) within 1e-5 of its largest value; the two
// copies of the tied wte staying equal through the pipeline's own updates, and the
// activation slots on stage 0 being min(stages, micro-batches). The layer split and
// its errors are checked without communication.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/launch_environment.h"
#include "dufu/common/topology.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/parallel/pipeline_schedule.h"
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
constexpr int kT = 8;
constexpr int kVocab = 101;
constexpr int kLayers = 4;
// Losses and gradients within this of the serial run, relative (a gradient tensor
// relative to its largest magnitude), computed from the same weights. The pipeline
// sums the tied wte's gradient in another order (head and embedding parts apart, then
// added), tensor parallel adds partial sums, and the BLAS kernels the CPU picks sum
// in their own order: a reordered float sum of n terms moves by at most n u times the
// sum of their magnitudes (u = 6e-8); the largest sums here are the 2 x 8 tokens x 6
// micro-batches = 96 terms of a weight gradient, 96 u = 5.8e-6 < 1e-5 (measured: at
// most 7.4e-7 at every step, tp 2 included, with OpenBLAS's Haswell and Sandybridge
// kernels alike).
//
// Why from the same weights, every step: after an AdamW step the two models' weights
// differ by far more than the sums' rounding. AdamW's update lr m/(sqrt(v) + eps) does
// not scale with the gradient, so a relative difference r in one element's gradient
// moves that weight by about lr r, and where the element is as small as its own
// rounding (r of order 1, its sign can flip) by up to 2 lr = 6e-3, four orders above
// the 1e-7 the sums differ by. The next gradients differ by the Hessian times that,
// which depends on the data and on which sums happen to cancel under the kernels'
// order: 1.5e-5 after two steps with the Sandybridge kernels, 1.4e-5 after four with
// Haswell's under the sanitizers, while other kernels stayed below 1e-5. No fixed
// tolerance bounds that, so each step starts the pipeline from the serial weights.
constexpr double kTolerance = 1e-5;

GPTConfig small_config() {
  return dufu::testing::small_gpt_config(
      {.n_layer = kLayers, .n_head = 2, .d_model = 32, .vocab_size = kVocab, .vocab_multiple = 1, .seq_length = kT});
}

// Next-token data with one ignored target; the same on every rank for a seed.
using Batch = dufu::testing::TokenBatch;
Batch make_batch(std::uint32_t seed) {
  return dufu::testing::next_token_batch(kB, kT, kVocab, seed, {seed % (kB * kT)});
}

using dufu::testing::bitwise_equal;
using dufu::testing::relative_error;

template <typename... Args>
void report(const char* format, Args... args) {
  if (world().rank() == 0) std::printf(format, args...);
}

// ---- the layer split (no communication) --------------------------------------------

TEST(PipelineLayerSplit, EvenAndExplicit) {
  EXPECT_EQ(pipeline_layer_split(4, 2), (std::vector<int>{2, 2}));
  EXPECT_EQ(pipeline_layer_split(4, 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(pipeline_layer_split(7, 3), (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(pipeline_layer_split(12, 1), (std::vector<int>{12}));
  const int list[] = {1, 3};
  EXPECT_EQ(pipeline_layer_split(4, 2, list), (std::vector<int>{1, 3}));
  const int ids[] = {0, 1, 1, 1, 2};
  EXPECT_EQ(pipeline_layer_split_from_stage_ids(5, 3, ids), (std::vector<int>{1, 3, 1}));

  const std::vector<int> split{1, 2, 1};
  const PipelineStage middle = pipeline_stage(split, 1);
  EXPECT_EQ(middle.first_layer, 1);
  EXPECT_EQ(middle.num_layers, 2);
  EXPECT_FALSE(middle.holds_wte());
  EXPECT_TRUE(pipeline_stage(split, 2).holds_wte_copy());
  EXPECT_FALSE(pipeline_stage(split, 0).holds_wte_copy());
}

TEST(PipelineLayerSplit, Errors) {
  expect_error([] { pipeline_layer_split(4, 5); }, {"5 is more stages than the model's 4 layers", "HINT"});
  expect_error([] { pipeline_layer_split(4, 0); }, {"at least 1"});
  const int short_list[] = {1, 2};
  expect_error([&] { pipeline_layer_split(4, 2, short_list); }, {"sums to 3", "n_layer 4", "HINT"});
  const int zero[] = {0, 4};
  expect_error([&] { pipeline_layer_split(4, 2, zero); }, {"stage 0 0 layers"});
  const int three[] = {1, 1, 2};
  expect_error([&] { pipeline_layer_split(4, 2, three); }, {"3 entries for 2 pipeline stages"});
  const int gap[] = {0, 2, 2, 2};
  expect_error([&] { pipeline_layer_split_from_stage_ids(4, 3, gap); }, {"layer 1 has stage 2"});
  const int unused[] = {0, 0, 1, 1};
  expect_error([&] { pipeline_layer_split_from_stage_ids(4, 3, unused); }, {"end at stage 1 of 3"});
  const int too_few[] = {0, 1};
  expect_error([&] { pipeline_layer_split_from_stage_ids(4, 2, too_few); }, {"2 ids for n_layer 4"});
  PipelineStage bad;
  bad.stage = 1;
  bad.num_stages = 2;
  bad.first_layer = 3;
  bad.num_layers = 2;
  expect_error([&] { GPT model(small_config(), nullptr, bad); }, {"layers [3, 5)"});
}

// The stages' buffers tile the model, wte on both ends; a stage refuses whole-model
// calls and arguments that do not fit its place.
TEST(PipelineLayout, StagesTileTheModel) {
  const GPTConfig config = small_config();
  GPT serial(config);
  serial.init_gpt2(5);
  const std::vector<int> split = pipeline_layer_split(kLayers, 3);
  std::vector<float> assembled(serial.num_parameters(), -1.0f);
  std::size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    GPT stage(config, nullptr, pipeline_stage(split, s));
    stage.init_gpt2(5);
    std::vector<float> staged(stage.num_parameters());
    stage_gpt_buffer(config, stage.pipeline_stage(), serial.params(), staged);
    EXPECT_TRUE(bitwise_equal(staged, stage.params())) << "stage " << s;
    unstage_gpt_buffer(config, stage.pipeline_stage(), stage.params(), assembled);
    total += stage.num_parameters();
    EXPECT_EQ(stage.parameter_tensors().front().name, s == 1 ? "h.2.ln_1.weight" : "wte.weight");
    if (s == 1) {
      expect_error([&] { stage.forward(std::vector<std::int32_t>(kB * kT), {}, kB, kT); },
                   {"pipeline stage 1 of 3", "HINT"});
      expect_error([&] { stage.forward_stage(0, std::vector<std::int32_t>(kB * kT), {}, {}, kB, kT, 1.0f); },
                   {"not tokens"});
      const std::vector<float> input(kB * kT * 32);
      expect_error([&] { stage.forward_stage(0, {}, input, std::vector<std::int32_t>(kB * kT), kB, kT, 1.0f); },
                   {"no LM head", "HINT"});
      expect_error([&] { stage.backward_stage(0, input); }, {"no forward"});
    }
  }
  EXPECT_TRUE(bitwise_equal(assembled, serial.params()));
  const std::size_t wte = serial.tensor("wte.weight").size();
  EXPECT_EQ(total, serial.num_parameters() + wte);
}

// ---- the pipelined GPT against the serial one ---------------------------------------

struct Layout {
  int tp;
  int pp;
};

std::vector<Layout> layouts() {
  std::vector<Layout> result;
  for (const Layout layout : {Layout{1, 2}, Layout{1, 4}, Layout{2, 2}}) {
    if (world().size() % (layout.tp * layout.pp) == 0) result.push_back(layout);
  }
  return result;
}

TEST(PipelineParallelGPT, MatchesTheSerialModel) {
  const GPTConfig config = small_config();
  const std::uint32_t seed = 42;
  const float lr = 3e-3f;
  for (const Layout layout : layouts()) {
    const Topology topology(world().size(), layout.tp, layout.pp, world().rank());
    std::unique_ptr<Communicator> tensor = world().subgroup(topology.tensor_group(), "tensor");
    std::unique_ptr<Communicator> pipeline = world().subgroup(topology.pipeline_group(), "pipeline");
    std::unique_ptr<Communicator> embedding = world().subgroup(topology.embedding_group(), "embedding");
    const std::vector<int> split = pipeline_layer_split(kLayers, layout.pp);
    const PipelineStage stage = pipeline_stage(split, topology.coordinates().pp_rank);
    ASSERT_EQ(pipeline->rank(), stage.stage);
    for (const int micro_batches : {2, 4, 6}) {
      SCOPED_TRACE(::testing::Message() << "tp " << layout.tp << ", pp " << layout.pp << ", " << micro_batches
                                        << " micro-batches");
      GPT serial(config);
      serial.init_gpt2(seed);
      GPT model(config, tensor.get(), stage);
      model.init_gpt2(seed);
      {
        std::vector<float> staged(model.num_full_parameters());
        stage_gpt_buffer(config, stage, serial.params(), staged);
        EXPECT_TRUE(bitwise_equal(model.gather_full_parameters(), staged));
      }
      AdamW serial_optimizer(serial, AdamWOptions{});
      AdamW optimizer(model, AdamWOptions{});
      double loss_error = 0.0;
      double grad_error = 0.0;
      for (int step = 0; step < 5; ++step) {
        if (step > 0) {
          std::vector<float> staged(model.num_full_parameters());
          stage_gpt_buffer(config, stage, serial.params(), staged);
          model.load_full_parameters(staged);
        }
        const dufu::testing::MicroBatches micro(
            micro_batches, [step](int i) { return make_batch(static_cast<std::uint32_t>(1000 * step + i + 1)); });
        const double serial_loss = dufu::testing::serial_accumulated_loss(serial, micro, kB, kT);
        model.zero_grad();
        const double loss = pipeline_train_step(model, *pipeline, embedding.get(), micro.pipeline, kB, kT, micro.scale);
        const double error = relative_error(loss / micro_batches, serial_loss / micro_batches);
        EXPECT_LE(error, kTolerance) << "step " << step << ": " << loss << " vs " << serial_loss;
        loss_error = std::max(loss_error, error);

        // Every gradient, assembled to the full layout: each stage's own tensors (the
        // last stage's wte copy left out), summed over the pipeline group.
        const std::vector<float> staged = model.gather_full_gradients();
        const std::vector<float> full = dufu::testing::pipeline_full_gradients(serial, model, staged, *pipeline);
        const std::string context = "step " + std::to_string(step) + " ";
        grad_error =
            std::max(grad_error, dufu::testing::expect_gradients_near_serial(serial, full, kTolerance, context));
        // The last stage's copy of wte got the same summed gradient.
        if (stage.holds_wte_copy()) {
          const ParamTensor& wte = serial.tensor("wte.weight");
          EXPECT_TRUE(bitwise_equal(
              std::span<const float>(staged).subspan(model.full_parameter_tensors().front().offset, wte.size()),
              std::span<const float>(full).subspan(wte.offset, wte.size())));
        }
        // The gradient norm over the pipeline counts wte once.
        const double norm_squared = pipeline->all_reduce_value(model.full_sum_of_squares(model.grads()));
        EXPECT_LE(relative_error(norm_squared,
                                 cpu_device().kernels().sum_of_squares(serial.grads().data(), serial.num_parameters())),
                  1e-5);

        serial_optimizer.step(serial.params(), serial.grads(), lr);
        optimizer.step(model.params(), model.grads(), lr);
        report("  tp %d pp %d, %d micro-batches, step %d: loss %.7f (serial %.7f)\n", layout.tp, layout.pp,
               micro_batches, step, loss / micro_batches, serial_loss / micro_batches);
      }
      // The two copies of wte stay equal through the updates.
      if (stage.holds_wte() && layout.pp > 1) {
        const ParamTensor& wte = model.tensor("wte.weight");
        std::vector<float> mine(model.params().begin() + static_cast<std::ptrdiff_t>(wte.offset),
                                model.params().begin() + static_cast<std::ptrdiff_t>(wte.offset + wte.size()));
        std::vector<float> first = mine;
        embedding->broadcast(first, 0);
        EXPECT_TRUE(bitwise_equal(mine, first));
      }
      // Activation memory: stage s keeps min(stages - s, micro-batches) slots.
      EXPECT_EQ(model.activation_slots(), std::min(layout.pp - stage.stage, micro_batches));
      if (stage.is_first()) {
        EXPECT_EQ(model.activation_slots(), std::min(layout.pp, micro_batches));
      }
      report("tp %d pp %d, %d micro-batches: 5 AdamW steps' losses within %.2e, gradients %.2e, stage 0 slots %d\n",
             layout.tp, layout.pp, micro_batches, loss_error, grad_error, std::min(layout.pp, micro_batches));
    }
  }
}

TEST(PipelineParallelGPT, ScheduleErrors) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const Topology topology(world().size(), 1, 2, world().rank());
  std::unique_ptr<Communicator> pipeline = world().subgroup(topology.pipeline_group(), "pipeline");
  std::unique_ptr<Communicator> embedding = world().subgroup(topology.embedding_group(), "embedding");
  // A model of three stages on a group of two: refused on every rank before any message.
  const std::vector<int> split = pipeline_layer_split(kLayers, 3);
  GPT model(small_config(), nullptr, pipeline_stage(split, pipeline->rank()));
  const Batch batch = make_batch(1);
  const PipelineMicroBatch micro[] = {{batch.tokens, batch.targets}};
  expect_error([&] { pipeline_train_step(model, *pipeline, embedding.get(), micro, kB, kT, 1.0f); },
               {"pipeline_train_step", "of 3", "of 2"});
  // Missing targets on the last stage, tokens on the first.
  GPT two(small_config(), nullptr, pipeline_stage(pipeline_layer_split(kLayers, 2), pipeline->rank()));
  const PipelineMicroBatch empty[] = {{}};
  expect_error([&] { pipeline_train_step(two, *pipeline, embedding.get(), empty, kB, kT, 1.0f); },
               {"micro-batch 0 has 0 tokens and 0 targets"});
}

}  // namespace
}  // namespace dufu::trainer

