// The Llama-family model (model.arch = llama) tensor and pipeline parallel against
// the serial model, under mpirun with 2 and 4 ranks, at the tolerance of the GPT-2
// tests (tensor_parallel_test, pipeline_parallel_test: 1e-5 relative, a gradient
// tensor relative to its largest magnitude, from the same weights). Tensor parallel:
// every tp the world and the K/V heads allow (q heads and K/V head groups split
// together, gate and up column-parallel, o_proj and down row-parallel, wte and the
// untied lm_head by vocabulary rows): the loss and every gathered gradient, and three
// AdamW steps. Pipeline: pp 2 and tp 2 x pp 2 by the 1F1B schedule with 4
// micro-batches against gradient accumulation, the untied head on the last stage only.
// Each for an untied and a tied head, with every head its own K/V head and grouped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
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

using dufu::testing::bitwise_equal;
using dufu::testing::expect_gradients_near_serial;
using dufu::testing::expect_replicated_gradients_equal_across;
using dufu::testing::MicroBatches;
using dufu::testing::pipeline_full_gradients;
using dufu::testing::relative_error;
using dufu::testing::serial_accumulated_loss;

Communicator& world() { return dufu::testing::mpi_world(); }

constexpr int kB = 2;
constexpr int kT = 16;
constexpr int kVocab = 501;  // prime to 2 and 4: the last rank's slice of wte and lm_head ends in padding
constexpr int kLayers = 4;
// As in tensor_parallel_test and pipeline_parallel_test (whose comments derive it).
constexpr double kTolerance = 1e-5;

struct LlamaShape {
  int n_head;
  int n_kv_head;
  bool tied;
};

// 4 layers of d_model 64; 4 heads each with its K/V head, or 8 heads over 4 K/V heads
// (so tp 4 still holds whole K/V heads); a SwiGLU of 96.
GPTConfig llama_model(const LlamaShape& shape) {
  GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = kLayers, .n_head = shape.n_head, .d_model = 64, .vocab_size = kVocab, .vocab_multiple = 8,
       .seq_length = kT});
  config.arch = Architecture::kLlama;
  config.n_kv_head = shape.n_kv_head;
  config.ffn_hidden = 96;
  config.tie_embeddings = shape.tied;
  config.validate();
  return config;
}

std::string shape_name(const LlamaShape& shape) {
  return std::string(shape.n_kv_head == shape.n_head ? "MultiHead" : "Grouped") + (shape.tied ? "Tied" : "Untied");
}

using Batch = dufu::testing::TokenBatch;
Batch make_batch(std::uint32_t seed) { return dufu::testing::next_token_batch(kB, kT, kVocab, seed, {3, kT + 7}); }

template <typename... Args>
void report(const char* format, Args... args) {
  if (world().rank() == 0) std::printf(format, args...);
}

class LlamaParallelTest : public ::testing::TestWithParam<LlamaShape> {
 protected:
  GPTConfig config() const { return llama_model(GetParam()); }
};

TEST_P(LlamaParallelTest, TensorParallelMatchesTheSerialModel) {
  const GPTConfig config = this->config();
  for (const int tp : {1, 2, 4}) {
    if (world().size() % tp != 0) continue;
    SCOPED_TRACE(::testing::Message() << "tp " << tp);
    const Topology topology(world().size(), tp, 1, world().rank());
    std::unique_ptr<Communicator> group = world().subgroup(topology.tensor_group(), "tensor");
    GPT serial(config);
    serial.init_gpt2(42);
    GPT parallel(config, group.get());
    parallel.init_gpt2(42);
    EXPECT_TRUE(bitwise_equal(parallel.gather_full_parameters(), serial.params()));
    AdamW serial_optimizer(serial, AdamWOptions{});
    AdamW parallel_optimizer(parallel, AdamWOptions{});
    double loss_error = 0.0;
    double grad_error = 0.0;
    for (int step = 0; step < 3; ++step) {
      // From the serial weights every step (pipeline_parallel_test says why).
      parallel.load_full_parameters(serial.params());
      const Batch batch = make_batch(static_cast<std::uint32_t>(step + 1));
      serial.zero_grad();
      parallel.zero_grad();
      const float serial_loss = serial.forward(batch.tokens, batch.targets, kB, kT);
      const float parallel_loss = parallel.forward(batch.tokens, batch.targets, kB, kT);
      serial.backward();
      parallel.backward();
      const double error = relative_error(parallel_loss, serial_loss);
      EXPECT_LE(error, kTolerance) << "step " << step << ": " << parallel_loss << " vs " << serial_loss;
      loss_error = std::max(loss_error, error);
      const std::vector<float> grads = parallel.gather_full_gradients();
      ASSERT_EQ(grads.size(), serial.num_parameters());
      const std::string context = "step " + std::to_string(step) + " ";
      grad_error = std::max(grad_error, expect_gradients_near_serial(serial, grads, kTolerance, context));
      if (tp == 1) {
        EXPECT_EQ(parallel_loss, serial_loss);
        EXPECT_TRUE(bitwise_equal(parallel.grads(), serial.grads()));
      }
      // Replicated tensors (the RMSNorm weights) get the same bits on every rank.
      expect_replicated_gradients_equal_across(parallel, *group);
      serial_optimizer.step(serial.params(), serial.grads(), 3e-3f);
      parallel_optimizer.step(parallel.params(), parallel.grads(), 3e-3f);
    }
    report("llama %s, tp %d: 3 steps' losses within %.2e, gradients %.2e\n", shape_name(GetParam()).c_str(), tp,
           loss_error, grad_error);
  }
}

TEST_P(LlamaParallelTest, PipelineMatchesTheSerialModel) {
  const GPTConfig config = this->config();
  constexpr int kMicroBatches = 4;
  for (const int tp : {1, 2}) {
    constexpr int pp = 2;
    if (world().size() % (tp * pp) != 0) continue;
    SCOPED_TRACE(::testing::Message() << "tp " << tp << ", pp " << pp);
    const Topology topology(world().size(), tp, pp, world().rank());
    std::unique_ptr<Communicator> tensor = world().subgroup(topology.tensor_group(), "tensor");
    std::unique_ptr<Communicator> pipeline = world().subgroup(topology.pipeline_group(), "pipeline");
    std::unique_ptr<Communicator> embedding = world().subgroup(topology.embedding_group(), "embedding");
    const PipelineStage stage =
        pipeline_stage(pipeline_layer_split(kLayers, pp), topology.coordinates().pp_rank);
    GPT serial(config);
    serial.init_gpt2(42);
    GPT model(config, tensor.get(), stage);
    model.init_gpt2(42);
    EXPECT_EQ(model.pipeline_stage().holds_wte_copy(), config.tie_embeddings && !stage.is_first());
    AdamW serial_optimizer(serial, AdamWOptions{});
    double loss_error = 0.0;
    double grad_error = 0.0;
    for (int step = 0; step < 2; ++step) {
      const MicroBatches micro(kMicroBatches,
                               [step](int i) { return make_batch(static_cast<std::uint32_t>(100 * step + i + 1)); });
      const double serial_loss = serial_accumulated_loss(serial, micro, kB, kT);
      model.zero_grad();
      const double loss = pipeline_train_step(model, *pipeline, embedding.get(), micro.pipeline, kB, kT, micro.scale);
      const double error = relative_error(loss, serial_loss);
      EXPECT_LE(error, kTolerance) << "step " << step << ": " << loss << " vs " << serial_loss;
      loss_error = std::max(loss_error, error);

      // Every gradient in the full layout, summed over the stages (a tied head's copy
      // of wte on the last stage left out: it holds the same sum as the first's).
      const std::vector<float> full = pipeline_full_gradients(serial, model, model.gather_full_gradients(), *pipeline);
      const std::string context = "step " + std::to_string(step) + " ";
      grad_error = std::max(grad_error, expect_gradients_near_serial(serial, full, kTolerance, context));
      // The next step from the serial model's updated weights.
      serial_optimizer.step(serial.params(), serial.grads(), 3e-3f);
      std::vector<float> staged_weights(model.num_full_parameters());
      stage_gpt_buffer(config, model.pipeline_stage(), serial.params(), staged_weights);
      model.load_full_parameters(staged_weights);
    }
    report("llama %s, tp %d x pp %d, %d micro-batches: losses within %.2e, gradients %.2e\n",
           shape_name(GetParam()).c_str(), tp, pp, kMicroBatches, loss_error, grad_error);
  }
}

TEST(LlamaParallelErrors, KeyValueHeadsMustSplitEvenly) {
  GPTConfig config = llama_model({8, 2, false});
  dufu::testing::expect_error([&] { (void)gpt_parameter_layout(config, 4); },
                              {"n_kv_head 2 is not divisible by the tensor parallel size 4", "HINT"});
}

INSTANTIATE_TEST_SUITE_P(Shapes, LlamaParallelTest,
                         ::testing::Values(LlamaShape{4, 4, false}, LlamaShape{4, 4, true}, LlamaShape{8, 4, false},
                                           LlamaShape{8, 4, true}),
                         [](const ::testing::TestParamInfo<LlamaShape>& info) { return shape_name(info.param); });

}  // namespace
}  // namespace dufu::trainer
