// The training program (see trainer.h). One step: micro-batches forward and backward
// with the gradient accumulating, clip, AdamW at the scheduled rate; then the metrics
// record and the report, evaluation and checkpoint when due. Resume restores the
// weights, the moments, the step and the loader position, which together determine
// everything that follows, so the loss sequence continues bitwise.
#include "dufu/trainer/trainer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <utility>
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
#include "dufu/trainer/checkpoint.h"
#include "dufu/trainer/data_parallel_optimizer.h"
#include "dufu/trainer/device.h"
#include "dufu/trainer/flops.h"
#include "dufu/trainer/gpt.h"
#include "dufu/trainer/lr_schedule.h"
#include "dufu/trainer/parallel_checkpoint.h"
#include "dufu/trainer/pipeline_schedule.h"
#include "dufu/trainer/rank_groups.h"
#include "dufu/trainer/run_tokenizer.h"
#include "dufu/trainer/shard_identity.h"
#include "dufu/trainer/training_config.h"
#include "dufu/trainer/training_memory.h"
#include "metrics_log.h"
#include "training_batches.h"

namespace dufu::trainer {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The device of train.device. One that cannot run here (no CUDA backend in this
// build, or no GPU) is refused with its reason, in one line, before anything is created.
Device& training_device(DeviceKind kind) {
  const DeviceAvailability availability = device_availability(kind);
  if (!availability.available) DUFU_FAIL("train.device = \"", device_kind_name(kind), "\": ", availability.reason);
  return device_of_kind(kind);
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

// Which rank holds which layers and shards: rank 0 knows the whole layout, so no rank
// needs to report its own.
LayoutReport describe_layout(const Topology& topology, const GPTConfig& model, const std::vector<int>& layer_split) {
  LayoutReport report;
  report.topology = topology.describe();
  const int tp = topology.tensor_parallel_size();
  const int local_vocab = model.padded_vocab_size(tp) / tp;
  for (int rank = 0; rank < topology.world_size(); ++rank) {
    const auto c = topology.coordinates_of(rank);
    const PipelineStage stage = pipeline_stage(layer_split, c.pp_rank);
    RankLayout& entry = report.ranks.emplace_back();
    entry.rank = rank;
    entry.tp_rank = c.tp_rank;
    entry.dp_rank = c.dp_rank;
    entry.pp_rank = c.pp_rank;
    entry.first_layer = stage.first_layer;
    entry.last_layer = stage.first_layer + layer_split[static_cast<std::size_t>(c.pp_rank)] - 1;
    entry.embeddings = stage.is_first();
    entry.head = stage.is_last();
    entry.first_head = c.tp_rank * model.n_head / tp;
    entry.last_head = (c.tp_rank + 1) * model.n_head / tp - 1;
    entry.first_vocab_row = c.tp_rank * local_vocab;
    entry.last_vocab_row = (c.tp_rank + 1) * local_vocab - 1;
  }
  return report;
}

}  // namespace

// Declared in the order the run builds them, so they are destroyed in reverse.
struct Trainer::State {
  TrainingOptions options;
  std::string config_toml;
  std::vector<AgreedSetting> shared_settings;  // what every rank must have alike
  std::string resume_from;
  TrainingReporter& reporter;
  const std::atomic<bool>* stop_requested;
  int T = 0;
  std::unique_ptr<Communicator> world;
  std::optional<Topology> topology;
  int dp = 1;
  int accumulation = 1;
  // Rank 0 speaks for the run: the reports, metrics.jsonl, config.toml and checkpoints
  // (every rank holds the same weights and moments, the gradients being summed
  // bitwise identically everywhere).
  bool is_main = false;
  bool ready = false;  // setup() found steps to do
  std::unique_ptr<FileLock> run_lock;
  dataprep::BuiltBlend train_blend;
  ShardWatch shard_watch;  // the training shards as this rank opened them
  std::shared_ptr<const dataprep::TokenDataset> valid_dataset;
  RankGroups groups;
  std::unique_ptr<GPT> model;
  std::unique_ptr<DataParallelOptimizer> optimizer;
  TrainingState state;
  RankPlace place;
  std::unique_ptr<dataprep::InfiniteDataLoader> loader;
  std::unique_ptr<MetricsLog> metrics;
  double flops_per_token = 0.0;
  // Measured, not looked up: the peak of this machine as it is now (each rank measures
  // its own, all at once, so ranks sharing a machine see their share). A peak taken
  // while other processes held the cores would make MFU read above 100% once they
  // leave, so a step that beats it triggers a new measurement (the best one is kept).
  double peak_flops = 0.0;
  double tokens_per_step = 0.0;
  ModelBatch batch;
  std::vector<ModelBatch> step_batches;
  PipelineBuffers pipeline_buffers;  // kept across steps: a step allocates nothing
  float dloss_scale = 1.0f;
  // What a step allocates from the user's sizes, for the message if it does not fit.
  std::string activations_what;
  double activations_bytes = 0.0;

  State(const Config& config, std::string resume, TrainingReporter& reporter_, const std::atomic<bool>* stop)
      : options(training_options(config)),
        config_toml(config.to_toml()),
        shared_settings(rank_shared_settings(config)),
        resume_from(std::move(resume)),
        reporter(reporter_),
        stop_requested(stop) {}

  // Every group this rank communicates in, for the traffic counts.
  std::vector<Communicator*> all_groups() const {
    return {world.get(), groups.data.get(), groups.tensor.get(), groups.pipeline.get(), groups.embedding.get()};
  }

  // Loads the checkpoint and takes over its state; returns where the loader starts.
  dataprep::LoaderState resume(const std::string& checkpoint);
  // The gradient of the step's micro-batches, accumulated; returns the sum of their
  // losses.
  double forward_backward();
};

Trainer::Trainer(const Config& config, std::string resume_from, TrainingReporter& reporter,
                 const std::atomic<bool>* stop_requested)
    : s_(std::make_unique<State>(config, std::move(resume_from), reporter, stop_requested)) {}

Trainer::~Trainer() = default;

std::int64_t Trainer::completed_steps() const { return s_->state.step; }

bool Trainer::setup() {
  State& s = *s_;
  const TrainingOptions& options = s.options;
  Device& device = training_device(options.device);
  if (options.threads > 0) omp_set_num_threads(options.threads);
  s.T = options.model.seq_length;

  s.world = make_communicator();
  // Before any rank writes: ranks started with other settings (an MPMD command line),
  // or whose data paths name other files (node-local copies), would each train on
  // something else; the configuration first, then the shards it names.
  const bool reports = s.world->rank() == 0;
  if (const std::optional<std::string> difference = rank_disagreement(*s.world, s.shared_settings)) {
    throw RanksStopped(*difference, reports);
  }
  std::vector<std::string> prefixes;
  for (const auto& [weight, prefix] : options.train_data.shards) prefixes.push_back(prefix);
  std::vector<ShardIdentity> shards;
  std::vector<AgreedSetting> shard_settings;
  for (const std::string& prefix : prefixes) {
    shards.push_back(shard_identity(prefix));
    shard_settings.push_back(agreed_setting(shards.back()));
  }
  if (const std::optional<std::string> difference = rank_disagreement(*s.world, shard_settings)) {
    throw RanksStopped(*difference, reports);
  }
  std::vector<std::string> unrecorded;  // shards without a sidecar among shards with one
  const std::optional<dataprep::RecordedTokenizer> tokenizer = data_tokenizer(prefixes, &unrecorded);
  s.topology.emplace(s.world->size(), options.tensor_parallel_size, options.pipeline_parallel_size, s.world->rank());
  const Topology& topology = *s.topology;
  s.dp = topology.data_parallel_size();
  if (options.global_batch % (options.micro_batch * s.dp) != 0) {
    DUFU_FAIL("train.global_batch (", options.global_batch, ") must be a multiple of train.micro_batch (",
              options.micro_batch, ") x the data-parallel size (", s.dp, ")");
  }
  s.accumulation = options.accumulation_steps(s.dp);
  s.is_main = s.world->rank() == 0;
  const auto coordinates = topology.coordinates();
  const int tp = topology.tensor_parallel_size();
  const int pp = topology.pipeline_parallel_size();
  const std::vector<int> layer_split = pipeline_layer_split(options.model.n_layer, pp, options.pipeline_num_layers);
  const PipelineStage stage = pp > 1 ? pipeline_stage(layer_split, coordinates.pp_rank) : PipelineStage{};

  // The sizes are the user's: what cannot fit is refused before anything is allocated.
  const double parameters = rank_parameter_count(options.model, tp, stage);
  const int slots = pp > 1 ? pp - coordinates.pp_rank : 1;
  s.activations_what = str_cat("the activations of ", slots, " micro-batch", slots > 1 ? "es" : "", " of ",
                               options.micro_batch, " x ", s.T, " tokens (train.micro_batch x model.seq_length)");
  const MemoryPlan plan = rank_memory_plan(options.model, options.micro_batch, s.T, tp, s.dp, stage, slots,
                                           options.prefetch_batches, options.precision, options.zero_stage == 1,
                                           device);
  s.activations_bytes = plan.activations;
  const double model_bytes = plan.model();
  const std::string model_what = str_cat("the model (", human_count(parameters),
                                         " parameters on this rank, with their gradients and AdamW moments)");
  check_memory(model_what, model_bytes);
  check_memory(str_cat(model_what, " and ", s.activations_what), plan.total());
  const double device_capacity = device.memory_capacity_bytes();
  check_plan_fits_device(plan, device_capacity, device.describe());
  // One line per distinct piece of the model (its first data-parallel replica's).
  if (coordinates.dp_rank == 0) {
    DUFU_LOG_INFO("train", "memory plan of this rank: ", plan.describe(device_capacity), " on ", device.describe());
  }

  if (s.is_main) {
    fs::create_directories(options.run_dir);
    s.run_lock = FileLock::try_lock((fs::path(options.run_dir) / ".lock").string());
    if (!s.run_lock) DUFU_FAIL("run.dir ", options.run_dir, " is in use by another training process");
    // Holding the lock, every partial checkpoint there is a dead process's.
    remove_checkpoint_leftovers(options.run_dir);
    s.reporter.effective_config(s.config_toml);
    AtomicFile saved((fs::path(options.run_dir) / "config.toml").string());
    saved.write(s.config_toml.data(), s.config_toml.size());
    saved.commit();
    if (tokenizer) s.state.tokenizer = install_run_tokenizer(options.run_dir, *tokenizer);
    s.state.tokenizer_dir = options.run_dir;
    for (const std::string& prefix : unrecorded) {
      s.reporter.warning(str_cat("'", prefix, "' records no tokenizer (no sidecar); the run records the other "
                                 "shards' ", tokenizer->record.describe()));
    }
  }
  s.world->barrier();

  // Data first: a bad blend should fail before any time goes into the model.
  s.train_blend = dataprep::build_blend(options.train_data);
  if (options.eval_interval > 0) s.valid_dataset = dataprep::build_blend(options.valid_data).dataset;
  if (s.is_main) DUFU_LOG_INFO("train", "training data: ", s.train_blend.dataset->describe());
  TrainingState& state = s.state;
  s.shard_watch = ShardWatch(prefixes);
  // What the checkpoints record of the data, to tell on resume whether it changed.
  if (s.is_main) state.shards = shards;

  // On a GPU the groups are NCCL communicators (one GPU per rank), on the CPU MPI ones.
  s.groups = make_rank_groups(*s.world, topology, device);
  if (s.is_main) s.reporter.layout(describe_layout(topology, options.model, layer_split));
  try {
    s.model = std::make_unique<GPT>(options.model, tp > 1 ? s.groups.tensor.get() : nullptr, stage, &device);
    s.model->set_precision(options.precision);
    s.optimizer = std::make_unique<DataParallelOptimizer>(*s.model, options.adamw, *s.groups.data,
                                                          options.zero_stage == 1, s.groups.pipeline.get(),
                                                          s.groups.tensor.get(),
                                                          bucket_elements_for(options.dp_bucket_mb));
  } catch (const std::bad_alloc&) {
    fail_out_of_memory(model_what, model_bytes);
  }
  state.init_seed = options.init_seed;
  state.data_seed = options.train_data.seed;
  state.model = options.model;
  state.layout.tensor_parallel_size = tp;
  state.layout.pipeline_parallel_size = pp;
  state.layout.data_parallel_size = s.dp;
  state.layout.optimizer_sharded = s.optimizer->sharded();
  if (pp > 1) state.layout.pipeline_layers = layer_split;
  s.place = RankPlace{coordinates.tp_rank, coordinates.pp_rank, coordinates.dp_rank};

  const std::string found = agree_on_checkpoint(*s.world, s.resume_from, options.run_dir);
  dataprep::LoaderState loader_start;
  if (!found.empty()) {
    loader_start = s.resume(found);
  } else {
    s.model->init_gpt2(options.init_seed);
  }
  state.config_toml = s.config_toml;

  if (state.step >= options.steps) {
    if (s.is_main) s.reporter.nothing_to_do(state.step, options.steps);
    return false;
  }

  s.loader = make_loader(s.train_blend.dataset, options, topology, loader_start);
  if (s.is_main) {
    s.metrics = std::make_unique<MetricsLog>((fs::path(options.run_dir) / "metrics.jsonl").string(), state.step);
  }
  s.flops_per_token = gpt_training_flops_per_token(options.model, s.T);
  s.peak_flops = measure_sgemm_peak_flops(0.3);
  s.tokens_per_step = static_cast<double>(options.global_batch) * s.T;
  if (s.is_main) {
    RunSummary summary;
    summary.parameters = stage_size(options.model, PipelineStage{});
    summary.n_layer = options.model.n_layer;
    summary.d_model = options.model.d_model;
    summary.n_head = options.model.n_head;
    summary.vocab_size = options.model.vocab_size;
    summary.padded_vocab_size = options.model.padded_vocab_size();
    summary.seq_length = s.T;
    summary.micro_batch = options.micro_batch;
    summary.accumulation = s.accumulation;
    summary.data_parallel_size = s.dp;
    summary.tokens_per_step = s.tokens_per_step;
    summary.threads = omp_get_max_threads();
    summary.peak_flops = s.peak_flops;
    summary.flops_per_token = s.flops_per_token;
    s.reporter.run_summary(summary);
  }
  s.step_batches.resize(pp > 1 ? static_cast<std::size_t>(s.accumulation) : 0);
  s.dloss_scale = 1.0f / static_cast<float>(static_cast<double>(options.micro_batch) * s.T * s.accumulation * s.dp);
  s.ready = true;
  return true;
}

dataprep::LoaderState Trainer::State::resume(const std::string& checkpoint) {
  const TrainingState saved = read_checkpoint_state(checkpoint, FileCheck::kTrust);
  if (is_main) {
    if (const std::optional<std::string> change = shard_change(saved.shards, state.shards, checkpoint)) {
      if (!options.allow_changed_shards) {
        DUFU_FAIL(*change, "; HINT: resume with the shards the run was trained on, or set "
                  "data.allow_changed_shards=true to continue on the changed data (its samples differ)");
      }
      reporter.warning(str_cat("resuming as data.allow_changed_shards=true says, although the ", *change));
    }
  }
  if (const std::optional<std::string> change = tokenizer_change(saved, state, checkpoint)) DUFU_FAIL(*change);
  load_parallel_checkpoint(checkpoint, saved, place, dp, *model, *optimizer);
  if (saved.data_seed != state.data_seed) {
    DUFU_LOG_WARN("train", "data.seed is ", state.data_seed, " but the checkpoint was trained with ", saved.data_seed,
                  ": the data order changes from here on");
  }
  state.step = saved.step;
  state.consumed_samples = saved.consumed_samples;
  state.consumed_tokens = saved.consumed_tokens;
  state.skipped_steps = saved.skipped_steps;
  state.init_seed = saved.init_seed;
  // The loader position counts this rank's samples. Megatron's global order does not
  // depend on the data-parallel size, so within the first epoch the position under
  // another size follows from the consumed samples; past it the epochs' dropped
  // tails differ, and only the same size continues exactly.
  const dataprep::LoaderState saved_loader = dataprep::parse_loader_state(saved.train_loader_state);
  const std::uint64_t micro = static_cast<std::uint64_t>(options.micro_batch);
  const std::uint64_t rank_epoch = train_blend.dataset->size() / (micro * dp) * micro;
  const std::uint64_t per_rank = saved.consumed_samples / static_cast<std::uint64_t>(dp);
  dataprep::LoaderState loader_start;
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
    DUFU_FAIL(checkpoint, ": its loader is past the first epoch of a run with another data-parallel size or "
              "data size, where the order cannot be carried over; resume with the data-parallel size it was "
              "trained with");
  }
  if (is_main) DUFU_LOG_INFO("train", "resuming from ", checkpoint, " at step ", state.step);
  return loader_start;
}

double Trainer::State::forward_backward() {
  GPT& gpt = *model;
  gpt.zero_grad();
  double loss_sum = 0.0;
  if (topology->pipeline_parallel_size() == 1) {
    for (int micro = 0; micro < accumulation; ++micro) {
      split_batch(loader->next(), batch);
      loss_sum += gpt.forward(batch.inputs, batch.targets, options.micro_batch, T, dloss_scale);
      gpt.backward();
    }
    return loss_sum;
  }
  // Every stage of a pipeline reads the same batches (same data-parallel rank); the
  // first uses the tokens, the last the targets.
  std::vector<PipelineMicroBatch> views;
  for (int micro = 0; micro < accumulation; ++micro) {
    ModelBatch& micro_batch = step_batches[static_cast<std::size_t>(micro)];
    split_batch(loader->next(), micro_batch);
    views.push_back({micro_batch.inputs, micro_batch.targets});
  }
  return pipeline_train_step(gpt, *groups.pipeline, groups.embedding.get(), views, options.micro_batch, T, dloss_scale,
                             pipeline_buffers);
}

StepReport Trainer::step() {
  State& s = *s_;
  DUFU_CHECK(s.ready, "Trainer::step without a successful setup()");
  const TrainingOptions& options = s.options;
  TrainingState& state = s.state;
  const auto start = Clock::now();
  for (Communicator* group : s.all_groups()) {
    if (group != nullptr) group->reset_traffic();
  }
  double loss_sum = 0.0;
  try {
    loss_sum = s.forward_backward();
  } catch (const std::bad_alloc&) {
    fail_out_of_memory(s.activations_what, s.activations_bytes);  // the first step allocates them
  }
  if (s.dp > 1) loss_sum = s.groups.data->all_reduce_value(loss_sum, ReduceOp::kSum);
  const double loss = loss_sum / (s.accumulation * s.dp);
  const double grad_norm = s.optimizer->reduce_gradients_and_clip(options.grad_clip);
  const double lr = learning_rate(options.schedule, state.step);
  const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
  if (finite) {
    s.optimizer->step(static_cast<float>(lr));
  } else if (options.on_nonfinite == NonFiniteAction::kStop) {
    DUFU_FAIL("step ", state.step + 1, ": the ", std::isfinite(loss) ? "gradient norm" : "loss", " is ",
              std::isfinite(loss) ? grad_norm : loss,
              "; the run stops without updating (train.on_nonfinite=skip skips such steps instead)");
  } else {
    ++state.skipped_steps;
    if (s.is_main) {
      s.reporter.warning(str_cat("step ", state.step + 1, ": loss ", loss, ", gradient norm ", grad_norm,
                                 ": not finite, update skipped (", state.skipped_steps, " skipped so far)"));
    }
  }
  ++state.step;
  state.consumed_samples += static_cast<std::uint64_t>(options.global_batch);
  state.consumed_tokens += static_cast<std::uint64_t>(s.tokens_per_step);

  StepReport report;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const Communicator* group : s.all_groups()) {
    if (group == nullptr) continue;
    report.comm_bytes += group->traffic().total_bytes();
    report.comm_seconds += group->traffic().seconds;
  }
  report.tokens_per_second = s.tokens_per_step / report.seconds;
  if (s.flops_per_token * report.tokens_per_second / s.world->size() > s.peak_flops) {
    s.peak_flops = std::max(s.peak_flops, measure_sgemm_peak_flops(0.2));
    DUFU_LOG_INFO("train", "sgemm peak re-measured: ", s.peak_flops / 1e9, " GFLOP/s");
  }
  report.mfu = s.flops_per_token * report.tokens_per_second / (s.peak_flops * s.world->size());
  report.step = state.step;
  report.steps = options.steps;
  report.loss = loss;
  report.lr = lr;
  report.grad_norm = grad_norm;
  report.consumed_samples = state.consumed_samples;
  report.consumed_tokens = state.consumed_tokens;
  report.skipped = !finite;
  report.world_size = s.world->size();
  report.log_due = state.step % options.log_interval == 0 || state.step == options.steps;

  if (s.is_main) {
    JsonWriter record;
    record.begin_object()
        .key("type").value("train")
        .key("step").value(report.step)
        .key("loss").value(report.loss)
        .key("lr").value(report.lr)
        .key("grad_norm").value(report.grad_norm)
        .key("tokens_per_second").value(report.tokens_per_second)
        .key("ms_per_step").value(report.seconds * 1e3)
        .key("mfu").value(report.mfu)
        .key("consumed_samples").value(report.consumed_samples)
        .key("consumed_tokens").value(report.consumed_tokens)
        .key("skipped").value(report.skipped)
        .key("comm_bytes").value(report.comm_bytes)
        .key("comm_seconds").value(report.comm_seconds)
        .end_object();
    s.metrics->write(record);
    s.reporter.step(report);
  }
  return report;
}

bool Trainer::evaluation_due() const {
  const State& s = *s_;
  return s.valid_dataset && (s.state.step % s.options.eval_interval == 0 || s.state.step == s.options.steps);
}

EvalReport Trainer::evaluate() {
  State& s = *s_;
  DUFU_CHECK(s.ready && s.valid_dataset, "Trainer::evaluate without a successful setup() or with eval.interval 0");
  EvalReport report;
  report.step = s.state.step;
  report.val_loss = validation_loss(*s.model, *s.groups.pipeline, s.valid_dataset, s.options);
  report.val_perplexity = std::exp(report.val_loss);
  if (s.is_main) {
    JsonWriter record;
    record.begin_object()
        .key("type").value("eval")
        .key("step").value(report.step)
        .key("val_loss").value(report.val_loss)
        .key("val_perplexity").value(report.val_perplexity)
        .end_object();
    s.metrics->write(record);
    s.reporter.evaluation(report);
  }
  return report;
}

std::string Trainer::save() {
  State& s = *s_;
  DUFU_CHECK(s.ready, "Trainer::save without a successful setup()");
  s.state.train_loader_state = s.loader->state().to_string();
  // No checkpoint records shards that changed under the run (the identities are the
  // ones taken at the start).
  s.shard_watch.check();
  const std::string path = save_parallel_checkpoint(s.options.run_dir, *s.world, s.place, *s.model, *s.optimizer,
                                                    s.state, s.options.checkpoint_keep);
  if (s.is_main) s.reporter.checkpoint_saved(path);
  return path;
}

RunOutcome Trainer::run() {
  State& s = *s_;
  DUFU_CHECK(s.ready, "Trainer::run without a successful setup()");
  const TrainingOptions& options = s.options;
  RunOutcome outcome;
  while (s.state.step < options.steps) {
    outcome.last_loss = step().loss;
    if (evaluation_due()) evaluate();
    // Every rank must take the same decision, so a stop request seen by one stops all.
    const bool requested = s.stop_requested != nullptr && s.stop_requested->load();
    const bool signalled =
        s.world->all_reduce_value(static_cast<std::int32_t>(requested), ReduceOp::kMax) != 0;
    const bool exiting = s.state.step == options.exit_at_step;
    const bool stopping = signalled || exiting;
    if (s.state.step == options.steps || stopping ||
        (options.checkpoint_interval > 0 && s.state.step % options.checkpoint_interval == 0)) {
      save();
    }
    if (exiting) {
      if (s.is_main) s.reporter.stopped(StopReason::kExitAtStep, s.state.step);
      break;
    }
    if (stopping) {
      if (s.is_main) s.reporter.stopped(StopReason::kSignal, s.state.step);
      outcome.interrupted = true;
      break;
    }
  }
  s.world->barrier();
  outcome.step = s.state.step;
  return outcome;
}

}  // namespace dufu::trainer
