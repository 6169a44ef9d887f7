// The batches of a training run: the loader over a dataset in Megatron's global
// order, a loader batch as the model's inputs and targets, and the loss of a batch
// without backward (evaluation) through the pipeline's stages. Internal to the
// trainer library.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/topology.h"
#include "dufu/dataprep/data_loader.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/run/training_config.h"

namespace dufu::trainer {

// A loader batch [rows, T + 1] as the model's inputs (the first T tokens of each row)
// and targets (the last T): next-token prediction. Under document masking (a switch
// of `masking` on: the loader then hands the documents out, make_loader) also the
// position ids and document starts the switches ask for, and under eod_mask_loss the
// targets after an end-of-document input ignored (-1).
struct ModelBatch {
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
  std::vector<std::int32_t> positions;        // empty unless reset_position_ids
  std::vector<std::int32_t> document_starts;  // empty unless reset_attention_mask
  BatchDocuments documents() const { return {positions, document_starts}; }
};
void split_batch(const dataprep::Batch& batch, ModelBatch& out, const DocumentMasking& masking = {});
// The targets the loss counts (not -1).
std::int64_t counted_targets(std::span<const std::int32_t> targets);

// The loader of this rank's micro-batches of `dataset` (its data-parallel slice of
// every global batch), from `start`.
std::unique_ptr<dataprep::InfiniteDataLoader> make_loader(const std::shared_ptr<const dataprep::TokenDataset>& dataset,
                                                          const TrainingOptions& options, const Topology& topology,
                                                          dataprep::LoaderState start);

// The loss of one micro-batch without backward, through the pipeline's stages; the
// last stage's loss on every rank of the pipeline group.
double pipeline_forward_loss(GPT& model, Communicator& pipeline_group, std::span<const std::int32_t> tokens,
                             std::span<const std::int32_t> targets, int B, int T,
                             const BatchDocuments& documents = {});

// Mean loss of the model over the first eval_batches micro-batches of the validation
// split: the same samples at every evaluation, so the curve compares like with like.
// Under data.eod_mask_loss the mean over all their positions that count, as in training.
// Every rank evaluates the same batches (the weights are the same on every rank).
double validation_loss(GPT& model, Communicator& pipeline_group,
                       const std::shared_ptr<const dataprep::TokenDataset>& dataset, const TrainingOptions& options);

}  // namespace dufu::trainer
