// The batches of a training run (see training_batches.h).
#include "training_batches.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/dataprep/packed_documents.h"
#include "dufu/dataprep/sampler.h"

namespace dufu::trainer {

void split_batch(const dataprep::Batch& batch, ModelBatch& out, const DocumentMasking& masking) {
  const std::size_t T = batch.columns - 1;
  out.inputs.resize(batch.rows * T);
  out.targets.resize(batch.rows * T);
  for (std::size_t row = 0; row < batch.rows; ++row) {
    const std::int32_t* tokens = batch.tokens.data() + row * batch.columns;
    std::copy(tokens, tokens + T, out.inputs.begin() + static_cast<std::ptrdiff_t>(row * T));
    std::copy(tokens + 1, tokens + 1 + T, out.targets.begin() + static_cast<std::ptrdiff_t>(row * T));
  }
  out.positions.clear();
  out.document_starts.clear();
  if (!masking.enabled()) return;
  if (masking.eod_mask_loss) {
    for (std::size_t i = 0; i < out.inputs.size(); ++i) {
      if (out.inputs[i] == masking.eod_id) out.targets[i] = -1;
    }
  }
  if (!masking.reset_position_ids && !masking.reset_attention_mask) return;
  DUFU_CHECK(!batch.cu_seqlens.empty(), "document masking on a loader batch without its documents");
  if (masking.reset_position_ids) out.positions = batch.position_ids;
  if (masking.reset_attention_mask) {
    out.document_starts = dataprep::document_starts_from_cu_seqlens(batch.cu_seqlens, batch.rows, T);
  }
}

std::int64_t counted_targets(std::span<const std::int32_t> targets) {
  return std::count_if(targets.begin(), targets.end(), [](std::int32_t target) { return target != -1; });
}

std::unique_ptr<dataprep::InfiniteDataLoader> make_loader(const std::shared_ptr<const dataprep::TokenDataset>& dataset,
                                                          const TrainingOptions& options, const Topology& topology,
                                                          dataprep::LoaderState start) {
  dataprep::LoaderOptions loader_options;
  loader_options.micro_batch = static_cast<std::uint64_t>(options.micro_batch);
  loader_options.workers = options.loader_workers;
  loader_options.prefetch_batches = options.prefetch_batches;
  if (options.documents.reset_position_ids || options.documents.reset_attention_mask) {
    loader_options.document_eod_id = options.documents.eod_id;
  }
  // The datasets are already shuffled by their shuffle index (Megatron's design), so
  // the global order is 0, 1, 2, ...; Megatron's pretraining sampler gives each
  // data-parallel rank its micro-batch slice of every global batch, so the samples of
  // a step are the same whatever the number of ranks.
  auto sampler = dataprep::make_megatron_pretraining_sampler(
      dataset->size(), loader_options.micro_batch, static_cast<std::uint64_t>(topology.coordinates().dp_rank),
      static_cast<std::uint64_t>(topology.data_parallel_size()));
  return std::make_unique<dataprep::InfiniteDataLoader>(dataset, std::move(sampler), loader_options, start);
}

double pipeline_forward_loss(GPT& model, Communicator& pipeline_group, std::span<const std::int32_t> tokens,
                             std::span<const std::int32_t> targets, int B, int T, const BatchDocuments& documents) {
  const PipelineStage& stage = model.pipeline_stage();
  const float scale = 1.0f / static_cast<float>(B * T);  // a forward alone: only its returned mean matters
  if (stage.num_stages == 1) return model.forward(tokens, targets, B, T, scale, documents);
  constexpr int kEvalTag = 201;
  // The previous stage's activations arrive in the model's device memory (a GPU's
  // through NCCL), where forward_stage reads its input.
  DeviceBuffer<float> input;
  if (!stage.is_first()) {
    input = DeviceBuffer<float>(model.device(), static_cast<std::size_t>(B) * T * model.config().d_model);
    pipeline_group.recv(input.span(), stage.stage - 1, kEvalTag);
  }
  const float loss = model.forward_stage(0, stage.is_first() ? tokens : std::span<const std::int32_t>(), input.span(),
                                         stage.is_last() ? targets : std::span<const std::int32_t>(), B, T, scale,
                                         documents);
  if (!stage.is_last()) pipeline_group.send(model.stage_output(0), stage.stage + 1, kEvalTag);
  double result = stage.is_last() ? static_cast<double>(loss) : 0.0;
  pipeline_group.broadcast(std::span<double>(&result, 1), stage.num_stages - 1);
  return result;
}

double validation_loss(GPT& model, Communicator& pipeline_group,
                       const std::shared_ptr<const dataprep::TokenDataset>& dataset, const TrainingOptions& options) {
  const Topology single(1, 1, 1, 0);
  auto loader = make_loader(dataset, options, single, {});
  const int T = options.model.seq_length;
  ModelBatch batch;
  double sum = 0.0;
  double weights = 0.0;
  for (int i = 0; i < options.eval_batches; ++i) {
    split_batch(loader->next(), batch, options.documents);
    const double weight = options.documents.eod_mask_loss ? static_cast<double>(counted_targets(batch.targets)) : 1.0;
    sum += weight * pipeline_forward_loss(model, pipeline_group, batch.inputs, batch.targets, options.micro_batch, T,
                                          batch.documents());
    weights += weight;
  }
  return sum / std::max(weights, 1.0);
}

}  // namespace dufu::trainer
