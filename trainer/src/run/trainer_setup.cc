// Setting a training run up (Trainer::setup, trainer.h), in the steps setup() lists:
// the device, the ranks and their agreement, the memory plan, the run directory, the
// data, the model, and the checkpoint to resume from. Resume restores the weights, the
// moments, the step and the loader position, which together determine everything that
// follows, so the loss sequence continues bitwise.
#include <omp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_files.h"
#include "init_from_length.h"
#include "dufu/common/atomic_file.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/file_lock.h"
#include "dufu/common/human_units.h"
#include "dufu/common/log.h"
#include "dufu/common/topology.h"
#include "dufu/dataprep/blend_builder.h"
#include "dufu/dataprep/data_loader.h"
#include "dufu/dataprep/shard_sidecar.h"
#include "dufu/dataprep/tokenizer.h"
#include "dufu/dataprep/tokenizer_record.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/parallel_checkpoint.h"
#include "dufu/trainer/checkpoint/shard_identity.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/flops.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/gpt_pieces.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "dufu/trainer/parallel/rank_groups.h"
#include "dufu/trainer/run/training_config.h"
#include "dufu/trainer/run/training_memory.h"
#include "trainer_state.h"

namespace dufu::trainer {

namespace {

namespace fs = std::filesystem;

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
// `what` names the setting that gave resume_from, for the error when it holds none.
std::string agree_on_checkpoint(Communicator& world, const std::string& resume_from, const std::string& run_dir,
                                const char* what = "--resume") {
  std::string found;
  if (world.rank() == 0) {
    if (!resume_from.empty()) {
      const std::optional<std::string> checkpoint = find_usable_checkpoint(resume_from);
      if (!checkpoint) DUFU_FAIL(what, " ", resume_from, ": no checkpoint there");
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

// Creates run.dir (and its parents) and checks the run can write in it, refusing in
// one line naming run.dir, the path and why.
void create_run_dir(const std::string& run_dir) {
  std::error_code error;
  const fs::file_status status = fs::status(run_dir, error);
  if (fs::exists(status) && !fs::is_directory(status)) {
    DUFU_FAIL("run.dir ", run_dir, ": ", fs::is_regular_file(status) ? "is a file, not a directory"
                                                                     : "is not a directory");
  }
  if (!fs::create_directories(run_dir, error) && error) {
    // The nearest existing ancestor says why: a file where a directory must be, or
    // one that cannot be written.
    fs::path ancestor = fs::path(run_dir).parent_path();
    std::error_code ignored;
    while (!ancestor.empty() && !fs::exists(fs::symlink_status(ancestor, ignored))) ancestor = ancestor.parent_path();
    if (!ancestor.empty() && fs::exists(ancestor, ignored) && !fs::is_directory(ancestor, ignored)) {
      DUFU_FAIL("run.dir ", run_dir, ": cannot create it: ", ancestor.string(), " is a file, not a directory");
    }
    DUFU_FAIL("run.dir ", run_dir, ": cannot create it: ", error.message());
  }
  if (::access(run_dir.c_str(), W_OK | X_OK) != 0) {
    DUFU_FAIL("run.dir ", run_dir, ": cannot write in it (", errno_message(errno), ")");
  }
}

// What run.dir held before a start claimed it (creating it and its parents, the lock
// file, the run's tokenizer/), so that a refused start takes back what it wrote: the
// directory it created, or in one that was there the entries that were not. Nothing
// it wrote is overwritten: install_run_tokenizer refuses a tokenizer/ that differs, and
// config.toml is written once the start is accepted.
class RunDirSnapshot {
 public:
  explicit RunDirSnapshot(const std::string& run_dir) : run_dir_(run_dir) {
    std::error_code error;
    // The topmost directory the start will create: run.dir or an ancestor of it.
    for (fs::path path(run_dir); !path.empty() && !fs::exists(fs::symlink_status(path, error));
         path = path.parent_path()) {
      created_ = path;
    }
    if (!created_.empty()) return;
    for (const fs::directory_entry& entry : fs::directory_iterator(run_dir, error)) {
      entries_.insert(entry.path().filename().string());
    }
  }
  void take_back() const {
    std::error_code ignored;
    if (!created_.empty()) {
      fs::remove_all(created_, ignored);
      return;
    }
    std::vector<fs::path> added;
    for (const fs::directory_entry& entry : fs::directory_iterator(run_dir_, ignored)) {
      if (!entries_.contains(entry.path().filename().string())) added.push_back(entry.path());
    }
    for (const fs::path& path : added) fs::remove_all(path, ignored);
  }

 private:
  std::string run_dir_;
  fs::path created_;
  std::set<std::string> entries_;
};

// The knobs that define the model (checkpoint_files::kModelFields: every model.*
// knob but init_seed and init_from, which only start a run) must be the checkpoint's,
// for model.init_from and resume alike: a changed n_head, rope_theta or norm_eps keeps
// every tensor's shape, and the weights would run as another model.
void refuse_model_change(const GPTConfig& saved, const GPTConfig& run, const std::string& subject,
                         const std::string& hint_tail) {
  if (const checkpoint_files::ModelField* field = checkpoint_files::first_difference(saved, run)) {
    const std::string theirs = field->text(saved);
    DUFU_FAIL(subject, ": the checkpoint's model has model.", field->name, " = ", theirs, ", the run ",
              field->text(run), "; HINT: set model.", field->name, "=", theirs, " (see the checkpoint's config.toml)",
              hint_tail);
  }
}

}  // namespace

bool Trainer::setup() {
  State& s = *s_;
  s.open_device();
  const std::vector<ShardIdentity> shards = s.join_ranks();
  s.find_data_tokenizer();
  s.lay_out_ranks();
  const State::MemoryNeed model_memory = s.check_memory_plan();
  std::optional<RunDirSnapshot> before_claim;
  if (s.is_main) before_claim.emplace(s.options.run_dir);
  dataprep::LoaderState loader_start;
  try {
    s.claim_run_dir();
    s.open_data(shards);
    s.build_model(model_memory);
    loader_start = s.start_or_resume();
  } catch (...) {
    // Only a start that holds the lock wrote there: without it the new entries would be
    // another process's.
    if (before_claim && s.run_lock) {
      s.run_lock.reset();
      try {
        before_claim->take_back();
      } catch (...) {
        // The refusal is what the user must read; a leftover is only untidy.
      }
    }
    throw;
  }
  // Written once resuming is known to be possible: a refused run leaves the run's own.
  if (s.is_main) {
    AtomicFile saved((fs::path(s.options.run_dir) / "config.toml").string());
    saved.write(s.config_toml.data(), s.config_toml.size());
    saved.commit();
  }
  if (s.state.step >= s.options.steps) {
    if (s.is_main) s.reporter.nothing_to_do(s.state.step, s.options.steps);
    return false;
  }
  s.prepare_steps(loader_start);
  s.ready = true;
  return true;
}

void Trainer::State::open_device() {
  device = &training_device(options.device);
  if (options.threads > 0) omp_set_num_threads(options.threads);
  T = options.model.seq_length;
}

std::vector<ShardIdentity> Trainer::State::join_ranks() {
  set_collective_timeout(options.collective_timeout, "dist.collective_timeout");
  world = make_communicator();
  // Before any rank writes: ranks started with other settings (an MPMD command line),
  // or whose data paths name other files (node-local copies), would each train on
  // something else; the configuration first, then the shards it names.
  const bool reports = world->rank() == 0;
  if (const std::optional<std::string> difference = rank_disagreement(*world, shared_settings)) {
    throw RanksStopped(*difference, reports);
  }
  std::vector<ShardIdentity> shards;
  std::vector<AgreedSetting> shard_settings;
  for (const std::string& prefix : training_prefixes()) {
    shards.push_back(shard_identity(prefix));
    shard_settings.push_back(agreed_setting(shards.back()));
  }
  if (const std::optional<std::string> difference = rank_disagreement(*world, shard_settings)) {
    throw RanksStopped(*difference, reports);
  }
  return shards;
}

void Trainer::State::find_data_tokenizer() {
  data_tokenizer = dufu::trainer::data_tokenizer(training_prefixes(), &shards_without_tokenizer);
  find_end_of_document_token();
  if (!data_tokenizer) return;
  // Before anything is written: a model whose vocabulary cannot hold the data's ids
  // would stop at the first batch, and no tool could read its checkpoints. A larger
  // one is padding (Megatron pads its vocabulary too): those rows are never a label.
  const dataprep::TokenizerSpec spec =
      dataprep::choose_tokenizer({}, data_tokenizer, data_tokenizer->recorded_by, "no sidecar");
  const std::int64_t pieces = dataprep::Tokenizer::load(spec).vocab_size();
  if (options.model.vocab_size < pieces) {
    DUFU_FAIL("model.vocab_size = ", options.model.vocab_size, " is smaller than the ", pieces,
              " pieces of the tokenizer '", spec.model, "' that ", data_tokenizer->recorded_by,
              " records: the model cannot hold the data's ids; HINT: set model.vocab_size=", pieces,
              " (or more: the rows past the tokenizer's are padding)");
  }
}

void Trainer::State::find_end_of_document_token() {
  DocumentMasking& masking = options.documents;
  if (!masking.enabled()) return;
  if (masking.eod_id == -1) {
    // The token preprocess appended (its --eod-id, or the tokenizer's), as each
    // shard's sidecar records it: all must agree.
    std::optional<std::int64_t> recorded;
    for (const std::string& prefix : training_prefixes()) {
      const std::optional<dataprep::ShardSidecar> sidecar = dataprep::read_shard_sidecar(prefix);
      if (!sidecar || !sidecar->eod_id) {
        DUFU_FAIL("document masking (data.reset_position_ids, data.reset_attention_mask, data.eod_mask_loss) needs ",
                  "the end-of-document token, and '", prefix, "' records none; HINT: set data.eod_id");
      }
      if (recorded && *recorded != *sidecar->eod_id) {
        DUFU_FAIL("document masking: the shards record different end-of-document tokens (", *recorded, " and ",
                  *sidecar->eod_id, " in '", prefix, "'); HINT: set data.eod_id");
      }
      recorded = sidecar->eod_id;
    }
    masking.eod_id = static_cast<std::int32_t>(*recorded);
  }
  if (masking.eod_id >= options.model.vocab_size) {
    DUFU_FAIL("data.eod_id = ", masking.eod_id, " is outside the model's vocabulary (model.vocab_size = ",
              options.model.vocab_size, ")");
  }
}

void Trainer::State::lay_out_ranks() {
  topology.emplace(world->size(), options.tensor_parallel_size, options.pipeline_parallel_size, world->rank());
  dp = topology->data_parallel_size();
  check_global_batch(options, dp);
  accumulation = options.accumulation_steps(dp);
  is_main = world->rank() == 0;
  const int pp = topology->pipeline_parallel_size();
  layer_split = pipeline_layer_split(options.model.n_layer, pp, options.pipeline_num_layers);
  stage = pp > 1 ? pipeline_stage(layer_split, topology->coordinates().pp_rank) : PipelineStage{};
}

Trainer::State::MemoryNeed Trainer::State::check_memory_plan() {
  // The sizes are the user's: what cannot fit is refused before anything is allocated.
  const auto coordinates = topology->coordinates();
  const int tp = topology->tensor_parallel_size();
  const double parameters = rank_parameter_count(options.model, tp, stage);
  const int slots = pipeline_slots(stage);
  activations_what = str_cat("the activations of ", slots, " micro-batch", slots > 1 ? "es" : "", " of ",
                             options.micro_batch, " x ", T, " tokens (train.micro_batch x model.seq_length)");
  MemoryPlan plan = rank_memory_plan(options.model, options.micro_batch, T, tp, dp, stage, slots,
                                     options.prefetch_batches, options.precision, options.zero_stage, *device,
                                     options.recompute, static_cast<double>(bucket_elements_for(options.dp_bucket_mb)),
                                     options.overlap_reduction);
  if (options.optimizer_offload) {
    offload_to_host(plan);
    check_memory("the offloaded fp32 master weights and AdamW moments (optim.offload = cpu)", plan.host);
  }
  activations_bytes = plan.activations;
  const MemoryNeed model_memory{str_cat("the model (", human_count(parameters),
                                        " parameters on this rank, with their gradients and AdamW moments)"),
                                plan.model()};
  check_memory(model_memory.what, model_memory.bytes);
  check_memory(str_cat(model_memory.what, " and ", activations_what),
               plan.total() - (plan.device_is_host ? plan.save_staging : 0.0));
  // A save that cannot get its host copy would end the run at its first checkpoint.
  check_memory(str_cat(plan.device_is_host ? "all that and " : "", "a checkpoint save's host copy of this rank's "
                       "weights and AdamW moments"),
               plan.host_total());
  // train.memory_limit caps the plan below what the device has (a cap above it cannot
  // help: the allocations would fail), so that "does not fit" is the same on any machine.
  const double device_capacity = device->memory_capacity_bytes();
  const bool capped = options.memory_limit_bytes > 0.0 && options.memory_limit_bytes < device_capacity;
  const double cap = capped ? options.memory_limit_bytes : device_capacity;
  const std::string where =
      capped ? str_cat(device->describe(), " under train.memory_limit = ", human_bytes(cap)) : device->describe();
  check_plan_fits_device(plan, cap, where);
  // One line per distinct piece of the model (its first data-parallel replica's).
  if (coordinates.dp_rank == 0) {
    DUFU_LOG_INFO("train", "memory plan of this rank: ", plan.describe(cap), " on ", where);
  }
  return model_memory;
}

void Trainer::State::claim_run_dir() {
  if (is_main) {
    create_run_dir(options.run_dir);
    run_lock = FileLock::try_lock((fs::path(options.run_dir) / ".lock").string());
    if (!run_lock) DUFU_FAIL("run.dir ", options.run_dir, " is in use by another training process");
    // Holding the lock, every partial checkpoint there is a dead process's.
    remove_checkpoint_leftovers(options.run_dir);
    reporter.effective_config(config_toml);
    if (data_tokenizer) state.tokenizer = install_run_tokenizer(options.run_dir, *data_tokenizer);
    state.tokenizer_dir = options.run_dir;
    for (const std::string& prefix : shards_without_tokenizer) {
      reporter.warning(str_cat("'", prefix, "' records no tokenizer (no sidecar); the run records the other "
                               "shards' ", data_tokenizer->record.describe()));
    }
  }
  world->barrier();
}

void Trainer::State::open_data(const std::vector<ShardIdentity>& shards) {
  // Data first: a bad blend should fail before any time goes into the model.
  train_blend = dataprep::build_blend(options.train_data);
  if (options.eval_interval > 0) valid_dataset = dataprep::build_blend(options.valid_data).dataset;
  if (is_main) DUFU_LOG_INFO("train", "training data: ", train_blend.dataset->describe());
  shard_watch = ShardWatch(training_prefixes());
  // What the checkpoints record of the data, to tell on resume whether it changed.
  if (is_main) state.shards = shards;
}

void Trainer::State::build_model(const MemoryNeed& model_memory) {
  const auto coordinates = topology->coordinates();
  const int tp = topology->tensor_parallel_size();
  const int pp = topology->pipeline_parallel_size();
  // On a GPU the groups are NCCL communicators (one GPU per rank), on the CPU MPI ones.
  groups = make_rank_groups(*world, *topology, *device);
  if (is_main) reporter.layout(describe_layout(*topology, options.model, layer_split));
  try {
    model = std::make_unique<GPT>(options.model, tp > 1 ? groups.tensor.get() : nullptr, stage, device,
                                  GPTRecipe{.precision = options.precision,
                                            .attention_products = options.attention_products,
                                            .recompute = options.recompute,
                                            .optimizer_offload = options.optimizer_offload});
    optimizer = std::make_unique<DataParallelOptimizer>(*model, options.adamw, *groups.data, options.zero_stage,
                                                        groups.pipeline.get(), groups.tensor.get(),
                                                        bucket_elements_for(options.dp_bucket_mb),
                                                        options.reduce_each_micro_batch, options.overlap_reduction);
  } catch (const std::bad_alloc&) {
    fail_out_of_memory(model_memory.what, model_memory.bytes);
  }
  state.init_seed = options.init_seed;
  state.data_seed = options.train_data.seed;
  state.data_order = dataprep::data_order_name(options.train_data.order);
  state.model = options.model;
  state.layout.tensor_parallel_size = tp;
  state.layout.pipeline_parallel_size = pp;
  state.layout.data_parallel_size = dp;
  state.layout.optimizer_sharded = optimizer->sharded();
  if (pp > 1) state.layout.pipeline_layers = layer_split;
  place = RankPlace{coordinates.tp_rank, coordinates.pp_rank, coordinates.dp_rank};
}

dataprep::LoaderState Trainer::State::start_or_resume() {
  const std::string found = agree_on_checkpoint(*world, resume_from, options.run_dir);
  dataprep::LoaderState loader_start;
  if (!found.empty()) {
    loader_start = resume(found);
    // The stop would never come: the run is past it, and would train to train.steps.
    if (options.exit_at_step > 0 && options.exit_at_step <= state.step) {
      DUFU_FAIL("train.exit_at_step = ", options.exit_at_step, " is not after step ", state.step, " of ", found,
                ", where the run resumes; HINT: give a later step, or train.exit_at_step=0 to train to train.steps");
    }
  } else if (!options.init_from.empty()) {
    // A run that already saved checkpoints resumes from them above; init.from only
    // starts it.
    initialize_from(agree_on_checkpoint(*world, options.init_from, "", "model.init_from"));
  } else {
    model->init_gpt2(options.init_seed);
  }
  state.config_toml = config_toml;
  return loader_start;
}

void Trainer::State::prepare_steps(const dataprep::LoaderState& loader_start) {
  loader = make_loader(train_blend.dataset, options, *topology, loader_start);
  if (is_main) {
    metrics = std::make_unique<MetricsLog>((fs::path(options.run_dir) / "metrics.jsonl").string(), state.step);
    tensorboard = std::make_unique<TensorBoardWriter>(options.run_dir, state.step);
  }
  flops_per_token = gpt_training_flops_per_token(options.model, T);
  peak_flops = measure_sgemm_peak_flops(0.3);
  tokens_per_step = static_cast<double>(options.global_batch) * T;
  if (is_main) reporter.run_summary(run_summary());
  const bool step_batches_first = topology->pipeline_parallel_size() > 1 || options.documents.eod_mask_loss;
  step_batches.resize(step_batches_first ? static_cast<std::size_t>(accumulation) : 0);
  dloss_scale = 1.0f / static_cast<float>(static_cast<double>(options.micro_batch) * T * accumulation * dp);
  loss_divisor = static_cast<double>(accumulation) * dp;
}

RunSummary Trainer::State::run_summary() const {
  RunSummary summary;
  summary.parameters = stage_size(options.model, PipelineStage{});
  summary.n_layer = options.model.n_layer;
  summary.d_model = options.model.d_model;
  summary.n_head = options.model.n_head;
  summary.arch = architecture_name(options.model.arch);
  summary.n_kv_head = options.model.kv_heads();
  summary.vocab_size = options.model.vocab_size;
  summary.padded_vocab_size = options.model.padded_vocab_size();
  summary.seq_length = T;
  summary.micro_batch = options.micro_batch;
  summary.accumulation = accumulation;
  summary.data_parallel_size = dp;
  summary.tokens_per_step = tokens_per_step;
  summary.threads = omp_get_max_threads();
  summary.peak_flops = peak_flops;
  summary.flops_per_token = flops_per_token;
  return summary;
}

void Trainer::State::initialize_from(const std::string& checkpoint) {
  const TrainingState saved = read_checkpoint_state(checkpoint, FileCheck::kTrust);
  // Fine-tuning at another context length is common: the one knob of the model that
  // may differ here (not on resume), as far as the positions allow.
  GPTConfig saved_at_run_length = saved.model;
  saved_at_run_length.seq_length = options.model.seq_length;
  refuse_model_change(saved_at_run_length, options.model, str_cat("model.init_from ", checkpoint), "");
  refuse_positions_beyond_checkpoint(saved.model, options.model, checkpoint);
  if (const std::optional<std::string> change = tokenizer_change(saved, state, checkpoint)) DUFU_FAIL(*change);
  if (saved.model.seq_length == options.model.seq_length) {
    load_parallel_checkpoint(checkpoint, saved, place, dp, *model, *optimizer);
  } else {
    const std::vector<float> whole = weights_at_seq_length(checkpoint, saved.model, options.model);
    std::vector<float> piece(model->num_parameters());
    shard_gpt_piece(options.model, model->tensor_parallel_size(), model->tensor_parallel_rank(),
                    model->pipeline_stage(), whole, piece);
    model->upload_parameters(piece);
    if (is_main) {
      DUFU_LOG_INFO("train", "model.seq_length ", options.model.seq_length, " where ", checkpoint, " has ",
                    saved.model.seq_length, options.model.is_llama() ? " (RoPE: the weights as they are)"
                                                                       : " (wpe: its first rows)");
    }
  }
  // Fine-tuning starts its own optimizer: the moments of another run (or the zeros of
  // an import) and their step count do not carry over.
  optimizer->load_full_state(optimizer->make_full_state());
  if (is_main) DUFU_LOG_INFO("train", "initialized the weights from ", checkpoint, " (fresh optimizer, step 0)");
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
  // Tensor shapes alone would let a changed n_head, rope_theta or norm_eps load: the
  // run would continue as another model.
  refuse_model_change(saved.model, options.model, str_cat("resuming from ", checkpoint),
                      ", or give another run.dir to train that model");
  if (const std::optional<std::string> change = tokenizer_change(saved, state, checkpoint)) DUFU_FAIL(*change);
  load_parallel_checkpoint(checkpoint, saved, place, dp, *model, *optimizer);
  if (saved.data_order != state.data_order) {
    DUFU_FAIL(checkpoint, ": data.order is ", state.data_order, " but the run was trained with data.order = ",
              saved.data_order, "; the samples after the change would repeat and skip those before it. HINT: "
              "resume with data.order = ", saved.data_order);
  }
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
  } else if (saved.layout.data_parallel_size == dp && rank_epoch > 0) {
    // Same data-parallel size, another dataset size: train.steps changed (a finished
    // run trained longer), and the dataset holds the epochs of train.steps x
    // global_batch samples, as Megatron's does of train_iters. Megatron's sampler
    // then reads on from consumed_samples in the dataset built for the new count;
    // so does this (its order past here is that dataset's shuffle).
    loader_start.next = {per_rank / rank_epoch, per_rank % rank_epoch};
    loader_start.batches_served = per_rank / micro;
    if (is_main) {
      DUFU_LOG_INFO("train", "the training data now has ", train_blend.dataset->size(), " samples (train.steps = ",
                    options.steps, "): continuing after the ", saved.consumed_samples,
                    " consumed samples, in the order of the new size, as Megatron does");
    }
  } else if (saved_loader.next.epoch == 0 && per_rank < rank_epoch) {
    loader_start.next = {0, per_rank};
    loader_start.batches_served = per_rank / micro;
    if (is_main) {
      DUFU_LOG_INFO("train", "the data-parallel size changed: continuing after ", saved.consumed_samples,
                    " consumed samples (", per_rank, " per rank)");
    }
  } else {
    DUFU_FAIL(checkpoint, ": its loader is past the first epoch of a run with data-parallel size ",
              saved.layout.data_parallel_size, ", where the order cannot be carried over to size ", dp,
              "; resume with the data-parallel size it was trained with");
  }
  if (is_main) {
    DUFU_LOG_INFO("train", "resuming from ", checkpoint, " at step ", state.step);
    // What a longer run means for its data, in one line (issue 45); said only where the
    // checkpoint's own configuration reads back (older checkpoints may lack it).
    std::optional<std::int64_t> planned;
    if (!saved.config_toml.empty()) {
      try {
        Config saved_config(training_config_schema());
        saved_config.load_toml(saved.config_toml, checkpoint + "/state.json");
        planned = saved_config.get_int("train.steps");
      } catch (const Error&) {
      }
    }
    if (planned && *planned != options.steps) {
      DUFU_LOG_INFO("train", "train.steps ", *planned, " -> ", options.steps, ": continuing",
                    state.data_order == "stable"
                        ? "; under data.order = stable the samples so far are the first of the longer run, so it "
                          "goes on exactly"
                        : "; under data.order = megatron the order depends on train.steps, so the samples from "
                          "here on are those of the new length's order (data.order = stable keeps them)");
    }
  }
  return loader_start;
}

}  // namespace dufu::trainer
