// The non-interleaved 1F1B pipeline schedule over GPT stages (pipeline_schedule.h),
// written as Megatron-LM writes it: warm-up forwards, a steady phase alternating one
// forward and one backward, and cool-down backwards. Communication is blocking; each
// exchange where a stage both sends and receives with one neighbour is one send_recv,
// and the pairs line up across neighbours (see the comment in the function), so the
// schedule cannot deadlock.
#include "dufu/trainer/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"

namespace dufu::trainer {

namespace {

// Message tags: one-way activations and gradients, and the paired exchanges.
constexpr int kActivationTag = 11;
constexpr int kGradientTag = 12;
constexpr int kExchangeTag = 13;

}  // namespace

int pipeline_in_flight(int num_stages, int stage, int num_micro_batches) {
  return std::min(num_stages - stage, num_micro_batches);
}

void all_reduce_tied_embedding_gradient(GPT& model, Communicator* embedding_group) {
  const PipelineStage& stage = model.pipeline_stage();
  if (!stage.shares_wte_gradient()) return;
  DUFU_CHECK(embedding_group != nullptr && embedding_group->size() == 2);
  const ParamTensor& wte = model.tensor("wte.weight");
  embedding_group->all_reduce(model.tensor_gradient(wte));
}

double pipeline_train_step(GPT& model, Communicator& pipeline_group, Communicator* embedding_group,
                           std::span<const PipelineMicroBatch> micro_batches, int B, int T, float dloss_scale) {
  PipelineBuffers buffers;
  return pipeline_train_step(model, pipeline_group, embedding_group, micro_batches, B, T, dloss_scale, buffers);
}

double pipeline_train_step(GPT& model, Communicator& pipeline_group, Communicator* embedding_group,
                           std::span<const PipelineMicroBatch> micro_batches, int B, int T, float dloss_scale,
                           PipelineBuffers& buffers) {
  const PipelineStage& stage = model.pipeline_stage();
  const int stages = stage.num_stages;
  const int me = stage.stage;
  if (pipeline_group.size() != stages || pipeline_group.rank() != me) {
    DUFU_FAIL("pipeline_train_step: the model is stage ", me, " of ", stages, ", the pipeline group ",
              pipeline_group.describe(), " makes it stage ", pipeline_group.rank(), " of ", pipeline_group.size());
  }
  if (stage.shares_wte_gradient() && (embedding_group == nullptr || embedding_group->size() != 2)) {
    DUFU_FAIL("pipeline_train_step: stage ", me, " of ", stages, " needs the embedding group of the first and ",
              "last stage to sum the tied wte gradient");
  }
  const int M = static_cast<int>(micro_batches.size());
  if (M < 1) DUFU_FAIL("pipeline_train_step: no micro-batches");
  const std::size_t rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  for (int i = 0; i < M; ++i) {
    const PipelineMicroBatch& batch = micro_batches[static_cast<std::size_t>(i)];
    if ((stage.is_first() && batch.tokens.size() != rows) || (stage.is_last() && batch.targets.size() != rows)) {
      DUFU_FAIL("pipeline_train_step: micro-batch ", i, " has ", batch.tokens.size(), " tokens and ",
                batch.targets.size(), " targets for a batch of ", B, " x ", T, "; stage ", me, " of ", stages,
                " needs the ", stage.is_first() ? "tokens" : "", stage.is_first() && stage.is_last() ? " and " : "",
                stage.is_last() ? "targets" : "");
    }
  }

  const int previous = me - 1;  // group ranks of the neighbours, when they exist
  const int next = me + 1;
  const int in_flight = pipeline_in_flight(stages, me, M);
  const std::size_t stream = rows * static_cast<std::size_t>(model.config().d_model);
  Device& device = model.device();
  const auto sized = [&](DeviceBuffer<float>& buffer, std::size_t count) {
    if (buffer.size() != count) buffer = DeviceBuffer<float>(device, count);
    return buffer.span();
  };
  const std::span<float> input = sized(buffers.input, stage.is_first() ? 0 : stream);  // from the previous stage
  const std::span<float> output_grad = sized(buffers.output_grad, stage.is_last() ? 0 : stream);  // from the next stage
  const std::span<float> input_grad =
      sized(buffers.input_grad, stage.is_first() ? 0 : stream);  // for the previous stage
  double loss_sum = 0.0;
  int forwarded = 0;
  int backwarded = 0;

  const auto forward = [&] {
    const PipelineMicroBatch& batch = micro_batches[static_cast<std::size_t>(forwarded)];
    model.forward_stage_keeping_loss(forwarded % in_flight,
                                     stage.is_first() ? batch.tokens : std::span<const std::int32_t>(), input,
                                     stage.is_last() ? batch.targets : std::span<const std::int32_t>(), B, T,
                                     dloss_scale, batch.documents);
    ++forwarded;
  };
  const auto backward = [&] {
    const std::span<const float> grad = model.backward_stage(backwarded % in_flight, output_grad);
    if (!grad.empty()) device.copy(input_grad.data(), grad.data(), grad.size_bytes());
    ++backwarded;
  };
  const auto output = [&] { return model.stage_output((forwarded - 1) % in_flight); };

  // Between stages s and s + 1 the messages pair up as follows (w = warm-up forwards
  // of stage s, w - 1 of stage s + 1; r = M - w): stage s sends its w warm-up outputs
  // one way, which stage s + 1 receives in its w - 1 warm-up steps and one receive
  // before the steady phase; then each steady step of s (send output, receive a
  // gradient) meets a steady step of s + 1 (send a gradient, receive the next input)
  // as one exchange, r times; stage s + 1's last steady gradient and its cool-down
  // gradients go one way to the cool-down of s. Every blocking call meets its
  // counterpart, so there is no cycle of waits.
  const int warmup = std::min(stages - me - 1, M);
  const int steady = M - warmup;
  for (int i = 0; i < warmup; ++i) {
    if (!stage.is_first()) pipeline_group.recv(input, previous, kActivationTag);
    forward();
    pipeline_group.send(output(), next, kActivationTag);  // warmup > 0 only before the last stage
  }
  if (steady > 0 && !stage.is_first()) pipeline_group.recv(input, previous, kActivationTag);
  for (int i = 0; i < steady; ++i) {
    forward();
    if (!stage.is_last()) pipeline_group.send_recv(output(), next, output_grad, next, kExchangeTag);
    backward();
    if (stage.is_first()) continue;
    if (i + 1 == steady) {
      pipeline_group.send(input_grad, previous, kGradientTag);
    } else {
      pipeline_group.send_recv(input_grad, previous, input, previous, kExchangeTag);
    }
  }
  for (int i = 0; i < warmup; ++i) {
    pipeline_group.recv(output_grad, next, kGradientTag);
    backward();
    if (!stage.is_first()) pipeline_group.send(input_grad, previous, kGradientTag);
  }
  DUFU_CHECK(forwarded == M && backwarded == M);

  all_reduce_tied_embedding_gradient(model, embedding_group);
  if (stage.is_last()) {
    // The losses come back once, when the stage has queued all its work.
    const std::vector<float> losses = model.read_kept_losses();
    DUFU_CHECK(losses.size() == static_cast<std::size_t>(M), "pipeline_train_step: ", losses.size(),
               " losses kept for ", M, " micro-batches (a forward_keeping_loss before the step left its loss unread)");
    for (int i = 0; i < M; ++i) {
      loss_sum += static_cast<double>(losses[static_cast<std::size_t>(i)]) *
                  micro_batches[static_cast<std::size_t>(i)].loss_weight;
    }
  }
  if (stages > 1) {
    double loss = loss_sum;
    pipeline_group.broadcast(std::span<double>(&loss, 1), stages - 1);
    loss_sum = loss;
  }
  return loss_sum;
}

}  // namespace dufu::trainer
