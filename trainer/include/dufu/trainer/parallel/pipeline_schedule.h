// One training step of a pipeline-parallel GPT: the micro-batches go through the
// stages by the non-interleaved 1F1B schedule (PipeDream-flush, Narayanan et al. 2021;
// Megatron-LM's forward_backward_pipelining_without_interleaving), activations and
// their gradients travel point to point between neighbouring stages, and at the end
// the two copies of the tied wte (first and last stage) get their summed gradient.
// Each stage keeps at most num_stages - stage micro-batches in flight, so activation
// memory is bounded by the number of stages, not of micro-batches.
#pragma once

#include <cstdint>
#include <span>

#include "dufu/trainer/model/gpt.h"

namespace dufu {
class Communicator;
}

namespace dufu::trainer {

// One micro-batch [B, T]: the first stage reads tokens, the last targets; other
// stages may leave either empty.
struct PipelineMicroBatch {
  std::span<const std::int32_t> tokens;
  std::span<const std::int32_t> targets;
  BatchDocuments documents = {};  // packed documents (every stage reads them), or none
  double loss_weight = 1.0;  // of its loss in the step's returned sum
};

// Micro-batches a stage holds activations for at once under 1F1B: the warm-up
// forwards (num_stages - stage - 1) plus one, at most the micro-batch count.
int pipeline_in_flight(int num_stages, int stage, int num_micro_batches);

// Collective over `pipeline_group` (the model's stages in stage order: group rank =
// model.pipeline_stage().stage) and then over `embedding_group` (the first and last
// stage; nullptr on middle stages, or a group of one when there is one stage). Runs
// forward and backward of every micro-batch, each with dloss_scale (as GPT::forward:
// 1 / the non-ignored targets of the whole step gives the gradient of the step's mean
// loss), adding to model.grads() (zero them before); then sums the wte gradients of
// the first and last stage into both. Returns the sum over the micro-batches of their
// mean losses (what GPT::forward returns), each times its loss_weight, on every rank
// of the pipeline group.
//
// Throws dufu::Error before any communication when the group does not match the
// model's stages, a micro-batch lacks the tokens or targets its stage needs, or the
// embedding group is missing on the first or last stage; errors inside forward or
// backward (bad token values) throw on the stage that sees them and leave the others
// waiting, so treat them as fatal (dufu::abort_all).
double pipeline_train_step(GPT& model, Communicator& pipeline_group, Communicator* embedding_group,
                           std::span<const PipelineMicroBatch> micro_batches, int B, int T, float dloss_scale);

// The device memory that crosses stage boundaries in a step: the activations received
// from the previous stage, the gradient received from the next and the one sent back.
// On the model's device (a GPU's, moved by NCCL), allocated by the first step and kept
// by the caller, so later steps of the same shape allocate nothing.
struct PipelineBuffers {
  DeviceBuffer<float> input;
  DeviceBuffer<float> output_grad;
  DeviceBuffer<float> input_grad;
};
// The same step with the caller's buffers (the overload above makes fresh ones).
double pipeline_train_step(GPT& model, Communicator& pipeline_group, Communicator* embedding_group,
                           std::span<const PipelineMicroBatch> micro_batches, int B, int T, float dloss_scale,
                           PipelineBuffers& buffers);

// The last step of pipeline_train_step alone: sums the wte gradient of the first and
// last stage over embedding_group into both (no-op on middle stages and for one
// stage).
void all_reduce_tied_embedding_gradient(GPT& model, Communicator* embedding_group);

}  // namespace dufu::trainer
