// What the tensor- and pipeline-parallel tests (GPT-2's and Llama's) compare against
// the serial model in the same way: every gradient tensor in the serial layout within
// a tolerance of the serial one, the replicated tensors' gradients the same bits on
// every rank of a tensor group, micro-batches run by gradient accumulation on the
// serial model, and a pipeline stage's gradients assembled to the full layout.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/gpt_pieces.h"
#include "dufu/trainer/parallel/pipeline_schedule.h"
#include "support/float_compare.h"
#include "support/gpt_fixture.h"

namespace dufu::testing {

// Each tensor of `gradients` (the serial layout) within `tolerance` of the serial
// model's gradient, relative to that tensor's largest magnitude; a failure names
// `context` and the tensor. Returns the largest error.
inline double expect_gradients_near_serial(const trainer::GPT& serial, std::span<const float> gradients,
                                           double tolerance, const std::string& context) {
  double largest = 0.0;
  for (const trainer::ParamTensor& tensor : serial.parameter_tensors()) {
    const double error = scaled_error(gradients.subspan(tensor.offset, tensor.size()),
                                      serial.grads().subspan(tensor.offset, tensor.size()));
    EXPECT_LE(error, tolerance) << context << tensor.name;
    largest = std::max(largest, error);
  }
  return largest;
}

// Replicated parameters get bitwise the same gradient on every rank of the tensor
// group (the model's backward relies on it instead of reducing them): each rank
// compares its own with rank 0's. Collective over `group`.
inline void expect_replicated_gradients_equal_across(const trainer::GPT& parallel, Communicator& group) {
  for (const trainer::ParamTensor& tensor : parallel.parameter_tensors()) {
    if (tensor.split != trainer::TensorSplit::kReplicated) continue;
    const std::span<const float> mine = parallel.grads().subspan(tensor.offset, tensor.size());
    std::vector<float> rank0(mine.begin(), mine.end());
    group.broadcast(rank0, 0);
    EXPECT_TRUE(bitwise_equal(mine, rank0)) << tensor.name;
  }
}

// The micro-batches of one step, for the pipeline schedule and for the serial model,
// and the scale that makes their summed loss the mean over every counted target. Not
// copyable or movable: `pipeline` views `batches`.
class MicroBatches {
 public:
  MicroBatches(int count, const std::function<TokenBatch(int)>& make_batch) {
    std::size_t counted = 0;
    for (int i = 0; i < count; ++i) {
      batches.push_back(make_batch(i));
      counted += static_cast<std::size_t>(std::count_if(batches.back().targets.begin(), batches.back().targets.end(),
                                                        [](std::int32_t t) { return t != -1; }));
    }
    for (const TokenBatch& batch : batches) pipeline.push_back({batch.tokens, batch.targets});
    scale = 1.0f / static_cast<float>(counted);
  }
  MicroBatches(const MicroBatches&) = delete;
  MicroBatches& operator=(const MicroBatches&) = delete;

  std::vector<TokenBatch> batches;
  std::vector<trainer::PipelineMicroBatch> pipeline;
  float scale = 0.0f;
};

// Gradient accumulation over `micro` on the serial model, from zeroed gradients;
// returns the summed loss.
inline double serial_accumulated_loss(trainer::GPT& serial, const MicroBatches& micro, int B, int T) {
  serial.zero_grad();
  double loss = 0.0;
  for (const TokenBatch& batch : micro.batches) {
    loss += serial.forward(batch.tokens, batch.targets, B, T, micro.scale);
    serial.backward();
  }
  return loss;
}

// A pipeline stage's gathered gradients (`staged`, model.gather_full_gradients())
// in the full layout of `serial`, summed over the pipeline group: each stage's own
// tensors, a tied head's copy of wte on the last stage left out (it holds the same sum
// as the first's). Collective over `pipeline`.
inline std::vector<float> pipeline_full_gradients(const trainer::GPT& serial, const trainer::GPT& model,
                                                  std::span<const float> staged, Communicator& pipeline) {
  std::vector<float> full(serial.num_parameters(), 0.0f);
  trainer::unstage_gpt_buffer(model.config(), model.pipeline_stage(), staged, full);
  if (model.pipeline_stage().holds_wte_copy()) {
    const trainer::ParamTensor& wte = serial.tensor("wte.weight");
    std::fill_n(full.begin() + static_cast<std::ptrdiff_t>(wte.offset), wte.size(), 0.0f);
  }
  pipeline.all_reduce(full);
  return full;
}

}  // namespace dufu::testing
