// The loss and gradients of one batch from a checkpoint `train import-hf` wrote, in the
// checkpoint's own (tp, pp) layout under mpirun (one process for the serial layout),
// for tests/trainer/hf_import_test.sh to compare with transformers
// (tests/reference/hf_import_check.py compare). Each rank loads its piece as a run
// does (load_parallel_checkpoint) and the step runs through the 1F1B schedule; the
// gradients are assembled to the serial layout and world rank 0 writes them, with the
// loss, under dufu's names.
//   hf_import_batch CHECKPOINT BATCH.bin B T OUT.safetensors
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/topology.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "dufu/trainer/checkpoint/parallel_checkpoint.h"
#include "dufu/trainer/checkpoint/safetensors.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/gpt_pieces.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "dufu/trainer/parallel/pipeline_schedule.h"

namespace {

using namespace dufu;
using namespace dufu::trainer;

std::vector<std::int32_t> read_batch(const std::string& path, std::size_t count) {
  std::vector<std::int32_t> values(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(std::int32_t)));
  if (!in || in.peek() != EOF) DUFU_FAIL(path, ": not ", count, " int32 values");
  return values;
}

void run(const std::string& checkpoint, const std::string& batch_path, int B, int T, const std::string& out) {
  std::unique_ptr<Communicator> world = make_communicator();
  const TrainingState saved = read_checkpoint_state(checkpoint);
  const CheckpointLayout& layout = saved.layout;
  const GPTConfig& config = saved.model;
  const int tp = layout.tensor_parallel_size, pp = layout.pipeline_parallel_size;
  if (world->size() != tp * pp) DUFU_FAIL("the checkpoint's layout needs ", tp * pp, " ranks, got ", world->size());
  const Topology topology(world->size(), tp, pp, world->rank());
  std::unique_ptr<Communicator> tensor = world->subgroup(topology.tensor_group(), "tensor");
  std::unique_ptr<Communicator> pipeline = world->subgroup(topology.pipeline_group(), "pipeline");
  std::unique_ptr<Communicator> embedding = world->subgroup(topology.embedding_group(), "embedding");
  std::unique_ptr<Communicator> data = world->subgroup(topology.data_group(), "data");
  const RankCoordinates at = topology.coordinates();
  const PipelineStage stage = pipeline_stage(pipeline_layer_split(config.n_layer, pp, layout.pipeline_layers), at.pp_rank);
  GPT model(config, tensor.get(), stage);
  DataParallelOptimizer optimizer(model, AdamWOptions{}, *data, 0, pipeline.get(), tensor.get());
  load_parallel_checkpoint(checkpoint, saved, RankPlace{at.tp_rank, at.pp_rank, at.dp_rank}, 1, model, optimizer);

  const std::size_t count = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  const std::vector<std::int32_t> batch = read_batch(batch_path, 2 * count);
  const std::span<const std::int32_t> tokens(batch.data(), count), targets(batch.data() + count, count);
  std::size_t counted = 0;
  for (const std::int32_t target : targets) counted += target != -1 ? 1 : 0;
  const PipelineMicroBatch micro[] = {{tokens, targets}};
  model.zero_grad();
  const double loss = pipeline_train_step(model, *pipeline, embedding.get(), micro, B, T,
                                          1.0f / static_cast<float>(counted));

  // Every stage's own tensors (the last stage's copy of wte left out), summed over the
  // pipeline: the serial model's gradient.
  const std::vector<float> staged = model.gather_full_gradients();
  GPT serial(config);
  std::vector<float> full(serial.num_parameters(), 0.0f);
  unstage_gpt_buffer(config, stage, staged, full);
  const ParamTensor& wte = serial.tensor("wte.weight");
  if (stage.holds_wte_copy()) std::fill_n(full.begin() + static_cast<std::ptrdiff_t>(wte.offset), wte.size(), 0.0f);
  pipeline->all_reduce(full);
  if (world->rank() != 0) return;
  std::vector<safetensors::TensorRef> refs;
  for (const ParamTensor& tensor_info : serial.parameter_tensors()) {
    refs.push_back({tensor_info.name, safetensors::Dtype::kF32,
                    std::vector<std::uint64_t>(tensor_info.shape.begin(), tensor_info.shape.end()),
                    full.data() + tensor_info.offset});
  }
  refs.push_back({"loss", safetensors::Dtype::kF64, {}, &loss});
  safetensors::write(out, refs);
  std::printf("loss %.8f (tp %d, pp %d)\n", loss, tp, pp);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: hf_import_batch CHECKPOINT BATCH.bin B T OUT.safetensors\n");
    return 2;
  }
  try {
    run(argv[1], argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argv[5]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_import_batch: %s\n", e.what());
    return 1;
  }
  return 0;
}
