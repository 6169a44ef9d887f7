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
#include "dufu/trainer/model/recipe_rules.h"

namespace dufu::trainer {

ConfigSchema training_config_schema() {
  ConfigSchema schema;
  schema.add_table(kTrainingKnobs);
  return schema;
}

std::string training_config_reference() {
  return training_config_schema().reference_markdown(
      "Training configuration reference",
      "Every knob of `train`, generated from the knob table (trainer/include/dufu/trainer/model/training_knobs.h) "
      "by `train config-reference`; a test fails when this page is stale. Knobs go in a TOML file as tables and "
      "keys (`[optim]` then `lr = 3e-4`) or on the command line as overrides (`optim.lr=3e-4`), which win. "
      "\"accepted\" is what the knob takes beyond its type; a value outside it is refused naming the knob. "
      "See [training.md](training.md) for how the knobs work together.\n");
}

namespace {

// Narrows an int knob read in its declared range.
std::int64_t int_in_range(const Config& config, const char* name) { return config.get_int_in_range(name); }

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

float float_in_range(const Config& config, const char* name) {
  return static_cast<float>(config.get_double_in_range(name));
}

}  // namespace

TrainingOptions training_options(const Config& config) {
  check_float_knobs_finite(config);
  TrainingOptions options;
  options.model.arch = parse_architecture(config.get_choice("model.arch"), "model.arch");
  options.model.n_layer = static_cast<int>(int_in_range(config, "model.n_layer"));
  options.model.n_head = static_cast<int>(int_in_range(config, "model.n_head"));
  options.model.d_model = static_cast<int>(int_in_range(config, "model.d_model"));
  options.model.vocab_size = static_cast<int>(int_in_range(config, "model.vocab_size"));
  options.model.vocab_multiple = static_cast<int>(int_in_range(config, "model.vocab_multiple"));
  options.model.seq_length = static_cast<int>(int_in_range(config, "model.seq_length"));
  options.model.n_kv_head = static_cast<int>(int_in_range(config, "model.n_kv_head"));
  options.model.ffn_hidden = static_cast<int>(int_in_range(config, "model.ffn_hidden"));
  options.model.rope_theta = static_cast<float>(config.get_double("model.rope_theta"));
  options.model.norm_eps = static_cast<float>(config.get_double("model.norm_eps"));
  const std::string& tie = config.get_choice("model.tie_embeddings");
  options.model.tie_embeddings = tie == "auto" ? !options.model.is_llama() : tie == "true";
  options.model.validate();
  options.init_seed =
      static_cast<std::uint32_t>(int_in_range(config, "model.init_seed"));
  options.init_from = config.get_string("model.init_from");

  const std::string& blend = config.get_string("data.blend");
  if (blend.empty()) DUFU_FAIL("data.blend is not set: give the shard prefixes, e.g. data.blend=\"0.7 A 0.3 B\"");
  dataprep::BlendConfig data;
  data.shards = dataprep::parse_blend_spec(blend);
  data.impl = dataprep::parse_impl(config.get_choice("data.impl"));
  data.seq_length = static_cast<std::uint64_t>(options.model.seq_length);
  data.seed =
      static_cast<std::uint32_t>(int_in_range(config, "data.seed"));
  data.split.megatron_split = config.get_string("data.split");
  data.order = config.get_choice("data.order") == "stable" ? dataprep::DataOrder::kStable : dataprep::DataOrder::kMegatron;
  data.cache_dir = config.get_string("data.cache_dir");
  options.loader_workers = static_cast<int>(int_in_range(config, "data.workers"));
  options.prefetch_batches = static_cast<int>(int_in_range(config, "data.prefetch"));
  options.allow_changed_shards = config.get_bool("data.allow_changed_shards");
  options.documents.reset_position_ids = config.get_bool("data.reset_position_ids");
  options.documents.reset_attention_mask = config.get_bool("data.reset_attention_mask");
  options.documents.eod_mask_loss = config.get_bool("data.eod_mask_loss");
  options.documents.eod_id = static_cast<std::int32_t>(int_in_range(config, "data.eod_id"));

  options.micro_batch = static_cast<int>(int_in_range(config, "train.micro_batch"));
  const std::int64_t global_batch = int_in_range(config, "train.global_batch");
  options.global_batch = global_batch == 0 ? options.micro_batch : static_cast<int>(global_batch);
  check_global_batch(options, 1);
  options.steps = int_in_range(config, "train.steps");
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
  if (!(options.dp_bucket_mb >= knob_limits::kBucketMinMb) || options.dp_bucket_mb > knob_limits::kBucketMaxMb) {
    DUFU_FAIL("train.dp_bucket_mb must be between 4 bytes (3.8e-6) and 1048576 MiB, got ", options.dp_bucket_mb);
  }
  options.memory_limit_bytes = byte_size(config, "train.memory_limit");
  options.on_nonfinite =
      config.get_choice("train.on_nonfinite") == "skip" ? NonFiniteAction::kSkip : NonFiniteAction::kStop;
  options.exit_at_step = int_in_range(config, "train.exit_at_step");
  options.threads = static_cast<int>(int_in_range(config, "train.threads"));
  options.device = parse_device_kind(config.get_choice("train.device"));
  options.precision = parse_precision(config.get_choice("train.precision"), "train.precision");
  options.recompute = parse_recompute(config.get_choice("train.recompute"), "train.recompute");
  options.attention_products =
      parse_precision(config.get_choice("train.attention_products"), "train.attention_products");

  options.adamw.beta1 = float_in_range(config, "optim.beta1");
  options.adamw.beta2 = float_in_range(config, "optim.beta2");
  options.adamw.eps = float_in_range(config, "optim.eps");
  options.adamw.weight_decay = float_in_range(config, "optim.weight_decay");
  options.grad_clip = float_in_range(config, "optim.grad_clip");
  options.optimizer_offload = config.get_choice("optim.offload") == "cpu";

  options.eval_interval = int_in_range(config, "eval.interval");
  options.eval_batches = static_cast<int>(int_in_range(config, "eval.batches"));
  options.checkpoint_interval = int_in_range(config, "checkpoint.interval");
  options.checkpoint_keep = static_cast<int>(int_in_range(config, "checkpoint.keep"));
  options.tensor_parallel_size = static_cast<int>(int_in_range(config, "dist.tensor_parallel_size"));
  options.pipeline_parallel_size = static_cast<int>(int_in_range(config, "dist.pipeline_parallel_size"));
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
  options.zero_stage = static_cast<int>(int_in_range(config, "dist.zero_stage"));
  options.reduce_each_micro_batch = config.get_bool("dist.reduce_each_micro_batch");
  options.overlap_reduction = config.get_bool("dist.overlap_reduction");
  options.collective_timeout = config.get_double_in_range("dist.collective_timeout");
  check_recipe(recipe_choices(options));
  // The learning-rate schedule after the recipe's rules, whose refusal says more.
  options.schedule.max_lr = config.get_double_in_range("optim.lr");
  options.schedule.min_lr = config.get_double_in_range("optim.min_lr");
  options.schedule.warmup_steps = int_in_range(config, "optim.warmup_steps");
  const std::int64_t decay_steps = int_in_range(config, "optim.decay_steps");
  options.schedule.decay_steps = decay_steps == 0 ? options.steps : decay_steps;
  // Read whatever the schedule, so that a value out of its range is refused either way.
  const std::int64_t wsd_decay_steps = int_in_range(config, "optim.wsd_decay_steps");
  const double wsd_decay_fraction = config.get_double_in_range("optim.wsd_decay_fraction");
  const bool wsd_linear = config.get_choice("optim.wsd_decay_shape") == "linear";
  if (config.get_choice("optim.schedule") == "wsd") {
    options.schedule.shape = wsd_linear ? LrShape::kWsdLinear : LrShape::kWsdOneMinusSqrt;
    options.schedule.wsd_decay_steps =
        wsd_decay_length(wsd_decay_steps, wsd_decay_fraction, options.schedule.decay_steps);
  }
  options.schedule.validate();
  options.run_dir = config.get_string("run.dir");
  if (options.run_dir.empty()) DUFU_FAIL("run.dir must not be empty");
  options.log_interval = int_in_range(config, "run.log_interval");

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

RecipeChoices recipe_choices(const TrainingOptions& options) {
  return {.precision = options.precision,
          .attention_products = options.attention_products,
          .optimizer_offload = options.optimizer_offload,
          .zero_stage = options.zero_stage,
          .device_memory_is_host = options.device == DeviceKind::kCpu,
          .reduce_each_micro_batch = options.reduce_each_micro_batch};
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
