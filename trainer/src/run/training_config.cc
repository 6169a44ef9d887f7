#include "dufu/trainer/run/training_config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/dataprep/blended_dataset.h"
#include "dufu/dataprep/indexed_dataset.h"

namespace dufu::trainer {

namespace {

const char* nonfinite_action_name(NonFiniteAction action) {
  return action == NonFiniteAction::kSkip ? "skip" : "stop";
}

}  // namespace

ConfigSchema training_config_schema() {
  const TrainingOptions defaults;
  ConfigSchema schema;
  schema.add_string("model.arch", "gpt2",
                    "gpt2 (LayerNorm, learned positions, GELU MLP, biases, tied head) or llama (RMSNorm, rotary "
                    "positions, SwiGLU MLP, grouped-query attention, no biases)")
      .add_int("model.n_layer", 4, "Transformer blocks")
      .add_int("model.n_head", 4, "Attention heads per block (must divide model.d_model)")
      .add_int("model.d_model", 256, "Width of the residual stream")
      .add_int("model.vocab_size", 32000, "Vocabulary size: the tokenizer's (every token id must be below it)")
      .add_int("model.vocab_multiple", 128, "The embedding gets a multiple of this many rows (padding masked)")
      .add_int("model.seq_length", 256, "Tokens per training sample (context length)")
      .add_int("model.n_kv_head", 0, "llama: key/value heads of grouped-query attention (1 = MQA; 0 = model.n_head)")
      .add_int("model.ffn_hidden", 0,
               "llama: SwiGLU hidden width (0 = Llama's rule, 8/3 x d_model rounded up to a multiple of 256)")
      .add_double("model.rope_theta", 10000.0, "llama: base of the rotary embedding's angles (Llama 3: 500000)")
      .add_double("model.norm_eps", 1e-5, "llama: RMSNorm epsilon (gpt2's LayerNorm is fixed at 1e-5)")
      .add_string("model.tie_embeddings", "auto",
                  "Whether the LM head is the embedding: true, false, or auto (gpt2: true, llama: false)")
      .add_int("model.init_seed", defaults.init_seed, "Seed of the GPT-2 weight initialisation")
      .add_string("model.init_from", "",
                  "Start from this checkpoint's weights (a checkpoint or run directory, any layout; e.g. from "
                  "`train import-hf`) with a fresh optimizer at step 0; ignored once the run has checkpoints");
  schema.add_string("data.blend", "", "Megatron-style blend of shard prefixes: \"0.7 A 0.3 B\", or one prefix")
      .add_string("data.impl", "mmap", "How shards are read: mmap, lazy or cached")
      .add_string("data.split", "969,30,1", "Megatron split of each shard's documents: train,valid,test")
      .add_int("data.seed", 1234, "Seed of the sample shuffle (Megatron's default 1234)")
      .add_string("data.cache_dir", "", "Index cache directory (default: $DUFU_CACHE_DIR or ~/.cache/dufu)")
      .add_int("data.workers", defaults.loader_workers, "Loader threads reading samples")
      .add_int("data.prefetch", defaults.prefetch_batches, "Batches the loader prepares ahead")
      .add_bool("data.allow_changed_shards", defaults.allow_changed_shards,
                "Resume even when a shard differs from the one the checkpoint was trained on (size or index "
                "digest); the samples then differ from the run's");
  schema.add_string("train.device", device_kind_name(defaults.device),
                    "Where the model runs: cpu, or cuda (one GPU per rank, NCCL between ranks; refused with the "
                    "reason where there is no GPU)");
  schema.add_int("train.micro_batch", defaults.micro_batch, "Samples per forward/backward")
      .add_int("train.global_batch", 0, "Samples per optimizer step, a multiple of the micro-batch (0 = micro_batch)")
      .add_int("train.steps", defaults.steps, "Optimizer steps to train for")
      .add_string("train.on_nonfinite", nonfinite_action_name(defaults.on_nonfinite),
                  "What a NaN or Inf loss or gradient does: stop (error naming the step) or skip (no update)")
      .add_int("train.exit_at_step", defaults.exit_at_step,
               "Stop with a checkpoint after this step (0 = run to train.steps): splits a run into jobs")
      .add_int("train.threads", defaults.threads, "OpenMP threads for the kernels (0 = OMP_NUM_THREADS or every core)")
      .add_string("train.precision", precision_name(defaults.precision),
                  "fp32, or bf16: bf16 matmul inputs, weight working copy and stored activations with fp32 master "
                  "weights, moments, LayerNorm statistics, softmax and loss (kernels compute in fp32 and round to "
                  "bf16 at the recipe's points)")
      .add_string("train.attention_products", precision_name(defaults.attention_products),
                  "fp32, or bf16 (needs train.precision = bf16): attention's tile products on bf16 operands with "
                  "fp32 sums, as tensor cores run them (P, dS and dout rounded to bf16; CUDA: mma.sync, compiled, "
                  "not run yet)")
      .add_string("train.recompute", recompute_name(defaults.recompute),
                  "none; selective: the backward recomputes each layer's MLP hidden values; full: "
                  "each layer keeps only its input and the backward runs its forward again (activation memory for "
                  "compute; the same results, bit for bit)")
      .add_double("train.dp_bucket_mb", defaults.dp_bucket_mb,
                  "MiB of gradient per data-parallel collective (PyTorch DDP's bucket_cap_mb); the result does not "
                  "depend on it, the collectives' scratch memory does")
      .add_string("train.memory_limit", "0",
                  "Memory one rank may plan for, in bytes or with a unit (\"24GB\", \"512MiB\"; kB, MB, GB, TB "
                  "and KiB, MiB, GiB, TiB): a run or `train plan` whose plan needs more is refused; 0 = what the "
                  "device has (the host's memory and swap on cpu, the free memory of the GPU on cuda)");
  schema.add_double("optim.lr", 6e-4, "Peak learning rate, reached at the end of the warmup")
      .add_double("optim.min_lr", 6e-5, "Floor the cosine decay ends at")
      .add_int("optim.warmup_steps", 100, "Steps of linear warmup")
      .add_int("optim.decay_steps", 0, "Step the cosine reaches optim.min_lr (0 = train.steps)")
      .add_double("optim.beta1", 0.9, "AdamW beta1")
      .add_double("optim.beta2", 0.95, "AdamW beta2")
      .add_double("optim.eps", 1e-8, "AdamW epsilon")
      .add_double("optim.weight_decay", 0.1, "Decoupled weight decay of the matrices (not biases or LayerNorm)")
      .add_double("optim.grad_clip", defaults.grad_clip, "Clip the global gradient norm to this (0 = no clipping)")
      .add_string("optim.offload", defaults.optimizer_offload ? "cpu" : "none",
                  "none, or cpu: the fp32 master weights and AdamW moments in host memory and AdamW on the host, the "
                  "device keeping the bf16 weights, gradients and activations (ZeRO-Offload's split; needs "
                  "train.precision = bf16 and a GPU)");
  schema.add_int("eval.interval", defaults.eval_interval,
                 "Evaluate on the validation split every this many steps (0 = never)")
      .add_int("eval.batches", defaults.eval_batches, "Micro-batches per evaluation (the same ones each time)");
  schema.add_int("checkpoint.interval", defaults.checkpoint_interval,
                 "Save a checkpoint every this many steps (0 = only at the end)")
      .add_int("checkpoint.keep", defaults.checkpoint_keep, "Newest checkpoints kept");
  schema.add_int("dist.tensor_parallel_size", defaults.tensor_parallel_size,
                 "Tensor-parallel ranks (Megatron: heads and MLP split, vocab-parallel embedding and loss)")
      .add_int("dist.pipeline_parallel_size", defaults.pipeline_parallel_size,
               "Pipeline stages (1F1B schedule over the micro-batches of a step)")
      .add_string("dist.pipeline_num_layers", "",
                  "Layers per pipeline stage, e.g. \"5,7\" (empty: an even split, earlier stages one more)")
      .add_string("dist.pipeline_stage_ids", "",
                  "The stage of each layer, e.g. \"0,0,0,0,0,1,1,1,1,1,1,1\" (LiBai's explicit stage ids; "
                  "instead of dist.pipeline_num_layers)")
      .add_int("dist.zero_stage", defaults.zero_stage,
               "1: shard the AdamW moments over the data-parallel ranks (ZeRO-1: reduce-scatter, update, "
               "all-gather); 2: the gradients too (each layer's reduce-scattered as the backward makes it); "
               "3: the parameters too (each layer's gathered just before use); 0: every rank keeps them all")
      .add_bool("dist.overlap_reduction", defaults.overlap_reduction,
                "Stages 2 and 3: start each layer's reduce-scatter as its backward ends and finish it during the "
                "next layer's (one more layer of gradient memory; the same sums and bits; measured no faster on "
                "MPI over shared memory)")
      .add_bool("dist.reduce_each_micro_batch", defaults.reduce_each_micro_batch,
                "Stage 0: all-reduce each micro-batch's layer gradients and sum those, as ZeRO-2 does (its "
                "results bit for bit; to compare the two)");
  schema.add_string("run.dir", defaults.run_dir, "Directory of the run: checkpoints, metrics.jsonl, config.toml")
      .add_int("run.log_interval", defaults.log_interval, "Print a step line every this many steps");
  return schema;
}

namespace {

// Narrows an int knob, failing with the knob's name outside [min, max].
std::int64_t int_in_range(const Config& config, const char* name, std::int64_t min,
                          std::int64_t max = std::numeric_limits<std::int32_t>::max()) {
  const std::int64_t value = config.get_int(name);
  if (value < min || value > max) {
    // The limits of the types the knobs are narrowed to are named as what they are.
    if (max >= std::numeric_limits<std::int32_t>::max()) {
      if (value < min) DUFU_FAIL(name, " must be at least ", min, ", got ", value);
      DUFU_FAIL(name, " must be at most ", max, ", got ", value);
    }
    DUFU_FAIL(name, " must be in [", min, ", ", max, "], got ", value);
  }
  return value;
}

// A comma-separated list of integers ("5,7"); empty for an empty string. `what` and
// `example` go into the message for an item that is not an integer.
std::vector<int> int_list(const Config& config, const char* name, const char* what, const char* example) {
  std::vector<int> values;
  for (std::string_view rest = config.get_string(name); !rest.empty();) {
    const auto comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || value < std::numeric_limits<int>::min() ||
        value > std::numeric_limits<int>::max()) {
      DUFU_FAIL(name, ": '", item, "' is not ", what, " (expected e.g. ", example, ")");
    }
    values.push_back(static_cast<int>(value));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return values;
}

// "0", "1500000000", "1.5e9", "24GB", "24 GB", "512MiB": bytes, decimal units as
// human_bytes prints them and binary ones as GPU capacities are often quoted.
double byte_size(const Config& config, const char* name) {
  const std::string& text = config.get_string(name);
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(text.c_str(), &end);
  std::string_view unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  static const std::pair<std::string_view, double> kUnits[] = {
      {"", 1.0},          {"B", 1.0},           {"kB", 1e3},          {"KB", 1e3},
      {"MB", 1e6},        {"GB", 1e9},          {"TB", 1e12},         {"KiB", 1024.0},
      {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& [suffix, scale] : kUnits) {
    if (unit != suffix) continue;
    const double bytes = number * scale;
    if (end == text.c_str() || errno != 0 || !std::isfinite(bytes) || bytes < 0.0) break;
    return bytes;
  }
  DUFU_FAIL(name, ": '", text, "' is not a size (expected bytes or a number with a unit, e.g. 24GB or 512MiB; 0 = "
            "the device's)");
}

// Every float knob must be a finite number that stays finite as the float the
// kernels compute in: a NaN or infinite learning rate, beta or epsilon turns every
// weight into NaN at the first update.
void check_float_knobs_finite(const Config& config) {
  for (const ConfigKnob& knob : config.schema().knobs()) {
    if (knob.type != ConfigType::kDouble) continue;
    const double value = config.get_double(knob.name);
    if (!std::isfinite(value)) DUFU_FAIL(knob.name, " must be a finite number, got ", value);
    if (!std::isfinite(static_cast<float>(value))) {
      DUFU_FAIL(knob.name, " is ", value, ", beyond the float range (", std::numeric_limits<float>::max(),
                ") the trainer computes in");
    }
  }
}

float nonnegative_float(const Config& config, const char* name) {
  const double value = config.get_double(name);
  if (!(value >= 0.0)) DUFU_FAIL(name, " must not be negative, got ", value);
  return static_cast<float>(value);
}

}  // namespace

TrainingOptions training_options(const Config& config) {
  check_float_knobs_finite(config);
  TrainingOptions options;
  options.model.arch = parse_architecture(config.get_string("model.arch"), "model.arch");
  options.model.n_layer = static_cast<int>(int_in_range(config, "model.n_layer", 1));
  options.model.n_head = static_cast<int>(int_in_range(config, "model.n_head", 1));
  options.model.d_model = static_cast<int>(int_in_range(config, "model.d_model", 1));
  options.model.vocab_size = static_cast<int>(int_in_range(config, "model.vocab_size", 1));
  options.model.vocab_multiple = static_cast<int>(int_in_range(config, "model.vocab_multiple", 1));
  options.model.seq_length = static_cast<int>(int_in_range(config, "model.seq_length", 1));
  options.model.n_kv_head = static_cast<int>(int_in_range(config, "model.n_kv_head", 0));
  options.model.ffn_hidden = static_cast<int>(int_in_range(config, "model.ffn_hidden", 0));
  options.model.rope_theta = static_cast<float>(config.get_double("model.rope_theta"));
  options.model.norm_eps = static_cast<float>(config.get_double("model.norm_eps"));
  const std::string& tie = config.get_string("model.tie_embeddings");
  if (tie != "auto" && tie != "true" && tie != "false") {
    DUFU_FAIL("model.tie_embeddings must be true, false or auto, got \"", tie, "\"");
  }
  options.model.tie_embeddings = tie == "auto" ? !options.model.is_llama() : tie == "true";
  options.model.validate();
  options.init_seed =
      static_cast<std::uint32_t>(int_in_range(config, "model.init_seed", 0, std::numeric_limits<std::uint32_t>::max()));
  options.init_from = config.get_string("model.init_from");

  const std::string& blend = config.get_string("data.blend");
  if (blend.empty()) DUFU_FAIL("data.blend is not set: give the shard prefixes, e.g. data.blend=\"0.7 A 0.3 B\"");
  dataprep::BlendConfig data;
  data.shards = dataprep::parse_blend_spec(blend);
  data.impl = dataprep::parse_impl(config.get_string("data.impl"));
  data.seq_length = static_cast<std::uint64_t>(options.model.seq_length);
  data.seed =
      static_cast<std::uint32_t>(int_in_range(config, "data.seed", 0, std::numeric_limits<std::uint32_t>::max()));
  data.split.megatron_split = config.get_string("data.split");
  data.cache_dir = config.get_string("data.cache_dir");
  options.loader_workers = static_cast<int>(int_in_range(config, "data.workers", 1, 256));
  options.prefetch_batches = static_cast<int>(int_in_range(config, "data.prefetch", 1, 1024));
  options.allow_changed_shards = config.get_bool("data.allow_changed_shards");

  options.micro_batch = static_cast<int>(int_in_range(config, "train.micro_batch", 1));
  const std::int64_t global_batch = int_in_range(config, "train.global_batch", 0);
  options.global_batch = global_batch == 0 ? options.micro_batch : static_cast<int>(global_batch);
  check_global_batch(options, 1);
  options.steps = int_in_range(config, "train.steps", 1, std::numeric_limits<std::int64_t>::max());
  // The run counts its samples and tokens in 64 bits, and the training set is sized to
  // steps x global batch: a product past them would wrap to a few samples.
  const auto run_tokens = static_cast<unsigned __int128>(options.steps) *
                          static_cast<unsigned __int128>(options.global_batch) *
                          static_cast<unsigned __int128>(options.model.seq_length);
  if (run_tokens > static_cast<unsigned __int128>(std::numeric_limits<std::int64_t>::max())) {
    DUFU_FAIL("train.steps (", options.steps, ") x train.global_batch (", options.global_batch,
              ") x model.seq_length (", options.model.seq_length, ") tokens is more than a run counts (",
              std::numeric_limits<std::int64_t>::max(), ", 2^63 - 1); HINT: train.steps counts optimizer steps");
  }
  options.dp_bucket_mb = config.get_double("train.dp_bucket_mb");
  // At least one float, at most 1 TiB (beyond that a bucket is just the whole gradient).
  if (!(options.dp_bucket_mb * 1024.0 * 1024.0 >= sizeof(float)) || options.dp_bucket_mb > 1024.0 * 1024.0) {
    DUFU_FAIL("train.dp_bucket_mb must be between 4 bytes (3.8e-6) and 1048576 MiB, got ", options.dp_bucket_mb);
  }
  options.memory_limit_bytes = byte_size(config, "train.memory_limit");
  const std::string& on_nonfinite = config.get_string("train.on_nonfinite");
  if (on_nonfinite == nonfinite_action_name(NonFiniteAction::kStop)) {
    options.on_nonfinite = NonFiniteAction::kStop;
  } else if (on_nonfinite == nonfinite_action_name(NonFiniteAction::kSkip)) {
    options.on_nonfinite = NonFiniteAction::kSkip;
  } else {
    DUFU_FAIL("train.on_nonfinite must be \"stop\" or \"skip\", got \"", on_nonfinite, "\"");
  }
  options.exit_at_step = int_in_range(config, "train.exit_at_step", 0, std::numeric_limits<std::int64_t>::max());
  options.threads = static_cast<int>(int_in_range(config, "train.threads", 0, 4096));
  try {
    options.device = parse_device_kind(config.get_string("train.device"));
  } catch (const Error& e) {
    DUFU_FAIL("train.device: ", e.what());
  }
  options.precision = parse_precision(config.get_string("train.precision"), "train.precision");
  options.recompute = parse_recompute(config.get_string("train.recompute"), "train.recompute");
  options.attention_products =
      parse_precision(config.get_string("train.attention_products"), "train.attention_products");
  if (options.attention_products == Precision::kBf16 && options.precision != Precision::kBf16) {
    DUFU_FAIL("train.attention_products = bf16 needs train.precision = bf16; HINT: set train.precision = \"bf16\" "
              "or leave train.attention_products at \"fp32\"");
  }

  options.schedule.max_lr = config.get_double("optim.lr");
  options.schedule.min_lr = config.get_double("optim.min_lr");
  options.schedule.warmup_steps = int_in_range(config, "optim.warmup_steps", 0, std::numeric_limits<std::int64_t>::max());
  const std::int64_t decay_steps = int_in_range(config, "optim.decay_steps", 0, std::numeric_limits<std::int64_t>::max());
  options.schedule.decay_steps = decay_steps == 0 ? options.steps : decay_steps;
  options.schedule.validate();
  options.adamw.beta1 = static_cast<float>(config.get_double("optim.beta1"));
  options.adamw.beta2 = static_cast<float>(config.get_double("optim.beta2"));
  options.adamw.eps = nonnegative_float(config, "optim.eps");
  options.adamw.weight_decay = nonnegative_float(config, "optim.weight_decay");
  for (const char* name : {"optim.beta1", "optim.beta2"}) {
    const double beta = config.get_double(name);
    if (!(beta >= 0.0 && beta < 1.0)) DUFU_FAIL(name, " must be in [0, 1), got ", beta);
  }
  options.grad_clip = nonnegative_float(config, "optim.grad_clip");
  const std::string& offload = config.get_string("optim.offload");
  if (offload != "none" && offload != "cpu") DUFU_FAIL("optim.offload must be \"none\" or \"cpu\", got \"", offload, "\"");
  options.optimizer_offload = offload == "cpu";

  options.eval_interval = int_in_range(config, "eval.interval", 0, std::numeric_limits<std::int64_t>::max());
  options.eval_batches = static_cast<int>(int_in_range(config, "eval.batches", 1));
  options.checkpoint_interval = int_in_range(config, "checkpoint.interval", 0, std::numeric_limits<std::int64_t>::max());
  options.checkpoint_keep = static_cast<int>(int_in_range(config, "checkpoint.keep", 1));
  options.tensor_parallel_size = static_cast<int>(int_in_range(config, "dist.tensor_parallel_size", 1, 4096));
  options.pipeline_parallel_size = static_cast<int>(int_in_range(config, "dist.pipeline_parallel_size", 1, 4096));
  options.pipeline_num_layers = int_list(config, "dist.pipeline_num_layers", "a number of layers", "\"5,7\"");
  const std::vector<int> stage_ids = int_list(config, "dist.pipeline_stage_ids", "a stage id", "\"0,0,1,1\"");
  if (!stage_ids.empty()) {
    if (!options.pipeline_num_layers.empty()) {
      DUFU_FAIL("dist.pipeline_num_layers and dist.pipeline_stage_ids both say how to split the layers; give one");
    }
    try {
      options.pipeline_num_layers =
          pipeline_layer_split_from_stage_ids(options.model.n_layer, options.pipeline_parallel_size, stage_ids);
    } catch (const Error& e) {
      DUFU_FAIL("dist.pipeline_stage_ids: ", e.what());
    }
  }
  // The split is checked here so a bad one fails before any rank starts.
  (void)pipeline_layer_split(options.model.n_layer, options.pipeline_parallel_size, options.pipeline_num_layers);
  options.zero_stage = static_cast<int>(int_in_range(config, "dist.zero_stage", 0, 3));
  options.reduce_each_micro_batch = config.get_bool("dist.reduce_each_micro_batch");
  options.overlap_reduction = config.get_bool("dist.overlap_reduction");
  if (options.reduce_each_micro_batch && options.zero_stage != 0) {
    DUFU_FAIL("dist.reduce_each_micro_batch is stage 0's option (dist.zero_stage = 2 and 3 always reduce each "
              "micro-batch, and stage 1 reduce-scatters the whole gradient once); HINT: set dist.zero_stage = 0");
  }
  if (options.optimizer_offload && options.zero_stage == 3) {
    DUFU_FAIL("optim.offload = cpu with dist.zero_stage = 3 is not supported yet: the offloaded masters would be the "
              "parameter shard's; HINT: use dist.zero_stage = 2 with offload, or stage 3 without");
  }
  if (options.optimizer_offload) {
    // Refused here, before any rank starts, in the words the model would use.
    if (options.device == DeviceKind::kCpu) {
      DUFU_FAIL("optim.offload = cpu with train.device = cpu: the device's memory is the host's already, there is "
                "nothing to move; HINT: use optim.offload = none");
    }
    if (options.precision != Precision::kBf16) {
      DUFU_FAIL("optim.offload = cpu needs train.precision = bf16: under fp32 the device would need the fp32 "
                "weights, which are what offload moves to the host");
    }
  }
  options.run_dir = config.get_string("run.dir");
  if (options.run_dir.empty()) DUFU_FAIL("run.dir must not be empty");
  options.log_interval = int_in_range(config, "run.log_interval", 1, std::numeric_limits<std::int64_t>::max());

  // Megatron sizes the training set to the run (steps x global batch) so the blend
  // weights hold over exactly the samples used; the validation set is the fixed
  // eval.batches micro-batches every evaluation reads.
  options.train_data = data;
  options.train_data.split.megatron_part = 0;
  options.train_data.num_samples = static_cast<std::uint64_t>(options.steps) * options.global_batch;
  options.valid_data = data;
  options.valid_data.split.megatron_part = 1;
  options.valid_data.num_samples = static_cast<std::uint64_t>(options.eval_batches) * options.micro_batch;
  return options;
}

void check_global_batch(const TrainingOptions& options, int data_parallel_size) {
  if (options.global_batch % (options.micro_batch * data_parallel_size) == 0) return;
  if (data_parallel_size == 1) {
    DUFU_FAIL("train.global_batch (", options.global_batch, ") must be a multiple of train.micro_batch (",
              options.micro_batch, ")");
  }
  DUFU_FAIL("train.global_batch (", options.global_batch, ") must be a multiple of train.micro_batch (",
            options.micro_batch, ") x the data-parallel size (", data_parallel_size, ")");
}

std::vector<AgreedSetting> rank_shared_settings(const Config& config) {
  static const std::set<std::string_view> kPerRank = {"train.threads", "data.workers", "data.prefetch",
                                                      "data.cache_dir"};
  std::vector<AgreedSetting> settings;
  for (const ConfigKnob& knob : config.schema().knobs()) {
    if (kPerRank.contains(knob.name)) continue;
    settings.push_back({knob.name, config_value_to_toml(config.get(knob.name)), ""});
  }
  return settings;
}

}  // namespace dufu::trainer
