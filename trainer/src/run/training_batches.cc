// The batches of a training run (see training_batches.h).
#include "training_batches.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "dufu/dataprep/sampler.h"

namespace dufu::trainer {

void split_batch(const dataprep::Batch& batch, ModelBatch& out) {
  const std::size_t T = batch.columns - 1;
  out.inputs.resize(batch.rows * T);
  out.targets.resize(batch.rows * T);
  for (std::size_t row = 0; row < batch.rows; ++row) {
    const std::int32_t* tokens = batch.tokens.data() + row * batch.columns;
    std::copy(tokens, tokens + T, out.inputs.begin() + static_cast<std::ptrdiff_t>(row * T));
    std::copy(tokens + 1, tokens + 1 + T, out.targets.begin() + static_cast<std::ptrdiff_t>(row * T));
  }
}

std::unique_ptr<dataprep::InfiniteDataLoader> make_loader(const std::shared_ptr<const dataprep::TokenDataset>& dataset,
                                                          const TrainingOptions& options, const Topology& topology,
                                                          dataprep::LoaderState start) {
  dataprep::LoaderOptions loader_options;
  loader_options.micro_batch = static_cast<std::uint64_t>(options.micro_batch);
  loader_options.workers = options.loader_workers;
  loader_options.prefetch_batches = options.prefetch_batches;
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
                             std::span<const std::int32_t> targets, int B, int T) {
  const PipelineStage& stage = model.pipeline_stage();
  if (stage.num_stages == 1) return model.forward(tokens, targets, B, T);
  constexpr int kEvalTag = 201;
  // The previous stage's activations arrive in the model's device memory (a GPU's
  // through NCCL), where forward_stage reads its input.
  DeviceBuffer<float> input;
  if (!stage.is_first()) {
    input = DeviceBuffer<float>(model.device(), static_cast<std::size_t>(B) * T * model.config().d_model);
    pipeline_group.recv(input.span(), stage.stage - 1, kEvalTag);
  }
  const float loss = model.forward_stage(0, stage.is_first() ? tokens : std::span<const std::int32_t>(), input.span(),
                                         stage.is_last() ? targets : std::span<const std::int32_t>(), B, T,
                                         1.0f / static_cast<float>(B * T));
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
  for (int i = 0; i < options.eval_batches; ++i) {
    split_batch(loader->next(), batch);
    sum += pipeline_forward_loss(model, pipeline_group, batch.inputs, batch.targets, options.micro_batch, T);
  }
  return sum / options.eval_batches;
}

}  // namespace dufu::trainer
