// The training program. One step: micro-batches forward and backward with the
// gradient accumulating, clip, AdamW at the scheduled rate; then the log line, the
// metrics record, evaluation and checkpoint when due. Resume restores the weights,
// the moments, the step and the loader position, which together determine everything
// that follows, so the loss sequence continues bitwise.
#include "dufu/trainer/training_run.h"

#include <omp.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "dufu/common/atomic_file.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/file_lock.h"
#include "dufu/common/human_units.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/log.h"
#include "dufu/common/topology.h"
#include "dufu/dataprep/blend_builder.h"
#include "dufu/dataprep/data_loader.h"
#include "dufu/dataprep/sampler.h"
#include "dufu/trainer/checkpoint.h"
#include "dufu/trainer/data_parallel_optimizer.h"
#include "dufu/trainer/flops.h"
#include "dufu/trainer/gpt.h"
#include "dufu/trainer/lr_schedule.h"
#include "dufu/trainer/optimizer.h"
#include "dufu/trainer/parallel_checkpoint.h"
#include "dufu/trainer/pipeline_schedule.h"
#include "dufu/trainer/training_config.h"

namespace dufu::trainer {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// SIGINT/SIGTERM (Ctrl-C, a scheduler's preemption) ask the loop to stop at the next
// step boundary, after a checkpoint; a second signal kills as usual.
std::atomic<bool> g_stop_requested{false};

extern "C" void request_stop(int signal_number) {
  g_stop_requested.store(true);
  std::signal(signal_number, SIG_DFL);
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_requested.store(false);
    previous_int_ = std::signal(SIGINT, request_stop);
    previous_term_ = std::signal(SIGTERM, request_stop);
  }
  ~StopSignals() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*previous_int_)(int) = SIG_DFL;
  void (*previous_term_)(int) = SIG_DFL;
};

// metrics.jsonl: one JSON object per line, flushed as written so a killed run keeps
// every finished step. On resume the records after the checkpoint's step are dropped
// (they belong to steps that will run again), so the file reads as one run.
class MetricsLog {
 public:
  MetricsLog(const std::string& path, std::int64_t resume_step) : path_(path) {
    std::string kept;
    if (resume_step > 0 && fs::exists(path)) kept = records_up_to(path, resume_step);
    AtomicFile rewritten(path);
    rewritten.write(kept.data(), kept.size());
    rewritten.commit();
    file_ = std::fopen(path.c_str(), "ab");
    if (file_ == nullptr) DUFU_FAIL("cannot append to ", path, ": ", errno_message(errno));
  }
  ~MetricsLog() {
    if (file_ != nullptr) std::fclose(file_);
  }
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const JsonWriter& record) {
    const std::string line = record.str() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
      DUFU_FAIL("cannot write to ", path_, ": ", errno_message(errno));
    }
  }

 private:
  static std::string records_up_to(const std::string& path, std::int64_t last_step) {
    std::ifstream in(path, std::ios::binary);
    std::string kept;
    std::string line;
    simdjson::dom::parser parser;
    while (std::getline(in, line)) {
      simdjson::dom::element record;
      // A line cut short by a kill mid-write is dropped with the steps after it.
      if (parser.parse(line).get(record) != simdjson::SUCCESS) break;
      std::int64_t step = 0;
      if (record["step"].get_int64().get(step) != simdjson::SUCCESS) break;
      if (step > last_step) break;
      kept += line;
      kept += '\n';
    }
    return kept;
  }

  std::string path_;
  std::FILE* file_ = nullptr;
};

// A loader batch [rows, T + 1] as the model's inputs (the first T tokens of each row)
// and targets (the last T): next-token prediction.
struct ModelBatch {
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
};

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
                             std::span<const std::int32_t> targets, int B, int T);

// Mean loss of the model over the first eval_batches micro-batches of the validation
// split: the same samples at every evaluation, so the curve compares like with like.
// Every rank evaluates the same batches (the weights are the same on every rank).
double evaluate(GPT& model, Communicator& pipeline_group, const std::shared_ptr<const dataprep::TokenDataset>& dataset,
                const TrainingOptions& options) {
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

std::string format_rate(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", value);
  return text;
}

// The groups a rank trains in (FORMATS.md section 7): the other tensor-parallel
// shards of its stage, the other data-parallel replicas of its shard, the stages of
// its pipeline, and the first and last stage of that pipeline (the tied embedding;
// null on middle stages).
struct RankGroups {
  std::unique_ptr<Communicator> tensor;
  std::unique_ptr<Communicator> data;
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> embedding;
};

RankGroups make_rank_groups(Communicator& world, const Topology& topology) {
  const auto c = topology.coordinates();
  const int tp = topology.tensor_parallel_size();
  const int dp = topology.data_parallel_size();
  const bool holds_embedding = c.pp_rank == 0 || c.pp_rank + 1 == topology.pipeline_parallel_size();
  RankGroups groups;
  groups.tensor = world.split(c.pp_rank * dp + c.dp_rank, c.tp_rank, "tensor");
  groups.data = world.split(c.pp_rank * tp + c.tp_rank, c.dp_rank, "data");
  groups.pipeline = world.split(c.dp_rank * tp + c.tp_rank, c.pp_rank, "pipeline");
  groups.embedding = world.split(holds_embedding ? c.dp_rank * tp + c.tp_rank : -1, c.pp_rank, "embedding");
  return groups;
}

std::size_t stage_size(const GPTConfig& config, const PipelineStage& stage) {
  std::size_t total = 0;
  for (const ParamTensor& tensor : gpt_stage_layout(config, gpt_parameter_layout(config), stage)) {
    total += tensor.size();
  }
  return total;
}

// The checkpoint to resume from, found and verified by world rank 0 alone (reading
// every file once, not once per rank) and passed to the others; empty for none.
std::string agree_on_checkpoint(Communicator& world, const std::string& resume_from, const std::string& run_dir) {
  std::string found;
  if (world.rank() == 0) {
    if (!resume_from.empty()) {
      const std::optional<std::string> checkpoint = find_usable_checkpoint(resume_from);
      if (!checkpoint) DUFU_FAIL("--resume ", resume_from, ": no checkpoint there");
      found = *checkpoint;
    } else if (fs::exists(run_dir)) {
      found = find_usable_checkpoint(run_dir).value_or("");
    }
  }
  if (world.size() == 1) return found;
  std::int64_t length = static_cast<std::int64_t>(found.size());
  world.broadcast(std::span<std::int64_t>(&length, 1), 0);
  std::vector<std::uint8_t> bytes(found.begin(), found.end());
  bytes.resize(static_cast<std::size_t>(length));
  world.broadcast(bytes, 0);
  return std::string(bytes.begin(), bytes.end());
}

// The loss of one micro-batch without backward, through the pipeline's stages; the
// last stage's loss on every rank of the pipeline group.
double pipeline_forward_loss(GPT& model, Communicator& pipeline_group, std::span<const std::int32_t> tokens,
                             std::span<const std::int32_t> targets, int B, int T) {
  const PipelineStage& stage = model.pipeline_stage();
  if (stage.num_stages == 1) return model.forward(tokens, targets, B, T);
  constexpr int kEvalTag = 201;
  std::vector<float> input;
  if (!stage.is_first()) {
    input.resize(static_cast<std::size_t>(B) * T * model.config().d_model);
    pipeline_group.recv(input, stage.stage - 1, kEvalTag);
  }
  const float loss = model.forward_stage(0, stage.is_first() ? tokens : std::span<const std::int32_t>(), input,
                                         stage.is_last() ? targets : std::span<const std::int32_t>(), B, T,
                                         1.0f / static_cast<float>(B * T));
  if (!stage.is_last()) pipeline_group.send(model.stage_output(0), stage.stage + 1, kEvalTag);
  double result = stage.is_last() ? static_cast<double>(loss) : 0.0;
  pipeline_group.broadcast(std::span<double>(&result, 1), stage.num_stages - 1);
  return result;
}

}  // namespace

RunOutcome run_training(const Config& config, const std::string& resume_from) {
  const TrainingOptions options = training_options(config);
  if (options.threads > 0) omp_set_num_threads(options.threads);
  const int T = options.model.seq_length;

  const std::unique_ptr<Communicator> world = make_communicator();
  const Topology topology(world->size(), options.tensor_parallel_size, options.pipeline_parallel_size, world->rank());
  const int dp = topology.data_parallel_size();
  if (options.global_batch % (options.micro_batch * dp) != 0) {
    DUFU_FAIL("train.global_batch (", options.global_batch, ") must be a multiple of train.micro_batch (",
              options.micro_batch, ") x the data-parallel size (", dp, ")");
  }
  const int accumulation = options.accumulation_steps(dp);
  // Rank 0 speaks for the run: the log, metrics.jsonl, config.toml and checkpoints
  // (every rank holds the same weights and moments, the gradients being summed
  // bitwise identically everywhere).
  const bool is_main = world->rank() == 0;

  std::unique_ptr<FileLock> run_lock;
  if (is_main) {
    fs::create_directories(options.run_dir);
    run_lock = FileLock::try_lock((fs::path(options.run_dir) / ".lock").string());
    if (!run_lock) DUFU_FAIL("run.dir ", options.run_dir, " is in use by another training process");
    std::printf("# effective configuration\n%s\n", config.to_toml().c_str());
    std::fflush(stdout);
    AtomicFile saved((fs::path(options.run_dir) / "config.toml").string());
    const std::string toml = config.to_toml();
    saved.write(toml.data(), toml.size());
    saved.commit();
  }
  world->barrier();

  // Data first: a bad blend should fail before any time goes into the model.
  const dataprep::BuiltBlend train_blend = dataprep::build_blend(options.train_data);
  std::shared_ptr<const dataprep::TokenDataset> valid_dataset;
  if (options.eval_interval > 0) valid_dataset = dataprep::build_blend(options.valid_data).dataset;
  if (is_main) DUFU_LOG_INFO("train", "training data: ", train_blend.dataset->describe());

  const auto coordinates = topology.coordinates();
  const int tp = topology.tensor_parallel_size();
  const int pp = topology.pipeline_parallel_size();
  const RankGroups groups = make_rank_groups(*world, topology);
  const std::unique_ptr<Communicator>& tensor_group = groups.tensor;
  const std::unique_ptr<Communicator>& data_group = groups.data;
  const std::vector<int> layer_split =
      pipeline_layer_split(options.model.n_layer, pp, options.pipeline_num_layers);
  if (is_main) {
    // Which rank holds which layers and shards, once, from rank 0 (it knows the whole
    // layout, so no rank needs to report).
    std::printf("layout: %s\n", topology.describe().c_str());
    const int local_vocab = options.model.padded_vocab_size(tp) / tp;
    for (int rank = 0; rank < topology.world_size(); ++rank) {
      const auto c = topology.coordinates_of(rank);
      const PipelineStage stage = pipeline_stage(layer_split, c.pp_rank);
      const int last_layer = stage.first_layer + layer_split[static_cast<std::size_t>(c.pp_rank)] - 1;
      std::printf("  rank %d: tp %d, dp %d, pp %d | layers %d-%d%s%s | heads %d-%d | vocab rows %d-%d\n", rank,
                  c.tp_rank, c.dp_rank, c.pp_rank, stage.first_layer, last_layer,
                  stage.is_first() ? " + embeddings" : "", stage.is_last() ? " + ln_f, head" : "",
                  c.tp_rank * options.model.n_head / tp, (c.tp_rank + 1) * options.model.n_head / tp - 1,
                  c.tp_rank * local_vocab, (c.tp_rank + 1) * local_vocab - 1);
    }
    std::fflush(stdout);
  }
  GPT model(options.model, tp > 1 ? tensor_group.get() : nullptr,
            pp > 1 ? pipeline_stage(layer_split, coordinates.pp_rank) : PipelineStage{});
  DataParallelOptimizer optimizer(model, options.adamw, *data_group, options.zero_stage == 1, groups.pipeline.get(),
                                  tensor_group.get());
  TrainingState state;
  state.init_seed = options.init_seed;
  state.data_seed = options.train_data.seed;
  state.model = options.model;
  state.layout.tensor_parallel_size = tp;
  state.layout.pipeline_parallel_size = pp;
  state.layout.data_parallel_size = dp;
  state.layout.optimizer_sharded = optimizer.sharded();
  if (pp > 1) state.layout.pipeline_layers = layer_split;
  const RankPlace place{coordinates.tp_rank, coordinates.pp_rank, coordinates.dp_rank};

  const std::string found = agree_on_checkpoint(*world, resume_from, options.run_dir);
  const std::optional<std::string> checkpoint =
      found.empty() ? std::nullopt : std::optional<std::string>(found);
  dataprep::LoaderState loader_start;
  if (checkpoint) {
    const TrainingState saved = read_checkpoint_state(*checkpoint, FileCheck::kTrust);
    load_parallel_checkpoint(*checkpoint, saved, place, dp, model, optimizer);
    if (saved.data_seed != state.data_seed) {
      DUFU_LOG_WARN("train", "data.seed is ", state.data_seed, " but the checkpoint was trained with ", saved.data_seed,
                    ": the data order changes from here on");
    }
    state.step = saved.step;
    state.consumed_samples = saved.consumed_samples;
    state.consumed_tokens = saved.consumed_tokens;
    state.skipped_steps = saved.skipped_steps;
    state.init_seed = saved.init_seed;
    // The loader position counts this rank's samples: it carries over to a run with
    // the same number of data-parallel ranks only.
    const dataprep::LoaderState saved_loader = dataprep::parse_loader_state(saved.train_loader_state);
    // The loader position counts this rank's samples. Megatron's global order does not
    // depend on the data-parallel size, so within the first epoch the position under
    // another size follows from the consumed samples; past it the epochs' dropped
    // tails differ, and only the same size continues exactly.
    const std::uint64_t micro = static_cast<std::uint64_t>(options.micro_batch);
    const std::uint64_t rank_epoch = train_blend.dataset->size() / (micro * dp) * micro;
    const std::uint64_t per_rank = saved.consumed_samples / static_cast<std::uint64_t>(dp);
    if (saved_loader.next.epoch * rank_epoch + saved_loader.next.position == per_rank) {
      loader_start = saved_loader;
    } else if (saved_loader.next.epoch == 0 && per_rank < rank_epoch) {
      loader_start.next = {0, per_rank};
      loader_start.batches_served = per_rank / micro;
      if (is_main) {
        DUFU_LOG_INFO("train", "the data-parallel size changed: continuing after ", saved.consumed_samples,
                      " consumed samples (", per_rank, " per rank)");
      }
    } else {
      DUFU_FAIL(*checkpoint, ": its loader is past the first epoch of a run with another data-parallel size or "
                "data size, where the order cannot be carried over; resume with the data-parallel size it was "
                "trained with");
    }
    if (is_main) DUFU_LOG_INFO("train", "resuming from ", *checkpoint, " at step ", state.step);
  } else {
    model.init_gpt2(options.init_seed);
  }
  state.config_toml = config.to_toml();

  RunOutcome outcome;
  outcome.step = state.step;
  if (state.step >= options.steps) {
    if (is_main) {
      std::printf("nothing to do: the run is at step %lld of %lld\n", static_cast<long long>(state.step),
                  static_cast<long long>(options.steps));
    }
    return outcome;
  }

  auto loader = make_loader(train_blend.dataset, options, topology, loader_start);
  std::unique_ptr<MetricsLog> metrics;
  if (is_main) metrics = std::make_unique<MetricsLog>((fs::path(options.run_dir) / "metrics.jsonl").string(), state.step);

  const double flops_per_token = gpt_training_flops_per_token(options.model, T);
  // Measured, not looked up: the peak of this machine as it is now (each rank measures
  // its own, all at once, so ranks sharing a machine see their share). A peak taken
  // while other processes held the cores would make MFU read above 100% once they
  // leave, so a step that beats it triggers a new measurement (the best one is kept).
  double peak_flops = measure_sgemm_peak_flops(0.3);
  const double tokens_per_step = static_cast<double>(options.global_batch) * T;
  if (is_main) {
    std::printf("model: %s parameters, %d layers, d_model %d, %d heads, vocab %d (padded %d), seq %d\n",
                human_count(static_cast<double>(stage_size(options.model, PipelineStage{}))).c_str(),
                options.model.n_layer,
                options.model.d_model, options.model.n_head, options.model.vocab_size,
                options.model.padded_vocab_size(), T);
    std::printf("batch: %d x %d x %d samples (micro-batch x accumulation x data-parallel) = %.0f tokens per step; "
                "%d threads per rank; sgemm peak %.1f GFLOP/s per rank; %.3f GFLOP per token\n",
                options.micro_batch, accumulation, dp, tokens_per_step, omp_get_max_threads(), peak_flops / 1e9,
                flops_per_token / 1e9);
    std::fflush(stdout);
  }

  StopSignals stop_signals;
  ModelBatch batch;
  std::vector<ModelBatch> step_batches(pp > 1 ? static_cast<std::size_t>(accumulation) : 0);
  const float dloss_scale =
      1.0f / static_cast<float>(static_cast<double>(options.micro_batch) * T * accumulation * dp);
  auto save = [&]() {
    state.train_loader_state = loader->state().to_string();
    const std::string path =
        save_parallel_checkpoint(options.run_dir, *world, place, model, optimizer, state, options.checkpoint_keep);
    if (is_main) {
      std::printf("checkpoint: %s\n", path.c_str());
      std::fflush(stdout);
    }
  };

  while (state.step < options.steps) {
    const auto start = Clock::now();
    for (Communicator* group : {world.get(), data_group.get(), tensor_group.get(), groups.pipeline.get(),
                                groups.embedding.get()}) {
      if (group != nullptr) group->reset_traffic();
    }
    model.zero_grad();
    double loss_sum = 0.0;
    if (pp == 1) {
      for (int micro = 0; micro < accumulation; ++micro) {
        split_batch(loader->next(), batch);
        loss_sum += model.forward(batch.inputs, batch.targets, options.micro_batch, T, dloss_scale);
        model.backward();
      }
    } else {
      // Every stage of a pipeline reads the same batches (same data-parallel rank);
      // the first uses the tokens, the last the targets.
      std::vector<PipelineMicroBatch> views;
      for (int micro = 0; micro < accumulation; ++micro) {
        split_batch(loader->next(), step_batches[static_cast<std::size_t>(micro)]);
        views.push_back({step_batches[static_cast<std::size_t>(micro)].inputs,
                         step_batches[static_cast<std::size_t>(micro)].targets});
      }
      loss_sum = pipeline_train_step(model, *groups.pipeline, groups.embedding.get(), views, options.micro_batch, T,
                                     dloss_scale);
    }
    if (dp > 1) loss_sum = data_group->all_reduce_value(loss_sum, ReduceOp::kSum);
    const double loss = loss_sum / (accumulation * dp);
    const double grad_norm = optimizer.reduce_gradients_and_clip(options.grad_clip);
    const double lr = learning_rate(options.schedule, state.step);
    const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
    if (finite) {
      optimizer.step(static_cast<float>(lr));
    } else if (options.on_nonfinite == NonFiniteAction::kStop) {
      DUFU_FAIL("step ", state.step + 1, ": the ", std::isfinite(loss) ? "gradient norm" : "loss", " is ",
                std::isfinite(loss) ? grad_norm : loss,
                "; the run stops without updating (train.on_nonfinite=skip skips such steps instead)");
    } else {
      ++state.skipped_steps;
      if (is_main) {
        DUFU_LOG_WARN("train", "step ", state.step + 1, ": loss ", loss, ", gradient norm ", grad_norm,
                      ": not finite, update skipped (", state.skipped_steps, " skipped so far)");
      }
    }
    ++state.step;
    state.consumed_samples += static_cast<std::uint64_t>(options.global_batch);
    state.consumed_tokens += static_cast<std::uint64_t>(tokens_per_step);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::uint64_t comm_bytes = 0;
    double comm_seconds = 0.0;
    for (const Communicator* group :
         {world.get(), data_group.get(), tensor_group.get(), groups.pipeline.get(), groups.embedding.get()}) {
      if (group == nullptr) continue;
      comm_bytes += group->traffic().total_bytes();
      comm_seconds += group->traffic().seconds;
    }
    const double tokens_per_second = tokens_per_step / seconds;
    if (flops_per_token * tokens_per_second / world->size() > peak_flops) {
      peak_flops = std::max(peak_flops, measure_sgemm_peak_flops(0.2));
      DUFU_LOG_INFO("train", "sgemm peak re-measured: ", peak_flops / 1e9, " GFLOP/s");
    }
    const double mfu = flops_per_token * tokens_per_second / (peak_flops * world->size());
    outcome.last_loss = loss;

    if (is_main) {
      JsonWriter record;
      record.begin_object()
          .key("type").value("train")
          .key("step").value(state.step)
          .key("loss").value(loss)
          .key("lr").value(lr)
          .key("grad_norm").value(grad_norm)
          .key("tokens_per_second").value(tokens_per_second)
          .key("ms_per_step").value(seconds * 1e3)
          .key("mfu").value(mfu)
          .key("consumed_samples").value(state.consumed_samples)
          .key("consumed_tokens").value(state.consumed_tokens)
          .key("skipped").value(!finite)
          .key("comm_bytes").value(comm_bytes)
          .key("comm_seconds").value(comm_seconds)
          .end_object();
      metrics->write(record);
      if (state.step % options.log_interval == 0 || state.step == options.steps) {
        const std::string comm =
            world->size() > 1 ? str_cat(" | comm ", human_bytes(static_cast<double>(comm_bytes)), " ",
                             format_rate(100.0 * comm_seconds / seconds), "%")
                   : "";
        std::printf("step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | %.1f ms | MFU %.1f%%%s%s\n",
                    static_cast<long long>(state.step), static_cast<long long>(options.steps), loss, lr, grad_norm,
                    format_rate(tokens_per_second).c_str(), seconds * 1e3, 100.0 * mfu, comm.c_str(),
                    finite ? "" : " | skipped");
        std::fflush(stdout);
      }
    }

    if (valid_dataset && (state.step % options.eval_interval == 0 || state.step == options.steps)) {
      const double val_loss = evaluate(model, *groups.pipeline, valid_dataset, options);
      if (is_main) {
        JsonWriter eval_record;
        eval_record.begin_object()
            .key("type").value("eval")
            .key("step").value(state.step)
            .key("val_loss").value(val_loss)
            .key("val_perplexity").value(std::exp(val_loss))
            .end_object();
        metrics->write(eval_record);
        std::printf("eval at step %lld | val loss %.4f | val perplexity %.2f\n", static_cast<long long>(state.step),
                    val_loss, std::exp(val_loss));
        std::fflush(stdout);
      }
    }

    // Every rank must take the same decision, so a signal seen by one stops all.
    const bool signalled =
        world->all_reduce_value(static_cast<std::int32_t>(g_stop_requested.load()), ReduceOp::kMax) != 0;
    const bool exiting = state.step == options.exit_at_step;
    const bool stopping = signalled || exiting;
    if (state.step == options.steps || stopping ||
        (options.checkpoint_interval > 0 && state.step % options.checkpoint_interval == 0)) {
      save();
    }
    if (exiting) {
      if (is_main) {
        std::printf("stopping at step %lld as train.exit_at_step says; resume with train.exit_at_step=0\n",
                    static_cast<long long>(state.step));
      }
      break;
    }
    if (stopping) {
      if (is_main) {
        std::printf("stopped by a signal at step %lld; resume with the same command\n",
                    static_cast<long long>(state.step));
      }
      outcome.interrupted = true;
      break;
    }
  }
  world->barrier();
  outcome.step = state.step;
  return outcome;
}

}  // namespace dufu::trainer
