// The schema of a training run, from the knob table (model/training_knobs.h: name,
// type, default, accepted values and help, each written once) for the TOML file, the
// command-line overrides, `train --help`, the generated docs/config-reference.md,
// the effective configuration printed at start and the copy saved with each
// checkpoint; and its typed, checked form, whose fields take their defaults from the
// same table (the enumerations' are checked against it by training_knobs_test).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/config.h"
#include "dufu/common/rank_agreement.h"
#include "dufu/dataprep/blend_builder.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/model/recipe_rules.h"
#include "dufu/trainer/run/lr_schedule.h"

namespace dufu::trainer {

ConfigSchema training_config_schema();

// docs/config-reference.md: every knob of training_config_schema() as Markdown.
std::string training_config_reference();

enum class NonFiniteAction { kStop, kSkip };

// Document masking (off by default): Megatron's three switches of the same names, with
// the meanings of its _get_ltor_masks_and_position_ids (dataprep/packed_documents.h),
// and the end-of-document token that splits a sample into documents (data.eod_id;
// the shards' recorded tokenizer's when unset).
struct DocumentMasking {
  bool reset_position_ids = training_knob_bool("data.reset_position_ids");
  bool reset_attention_mask = training_knob_bool("data.reset_attention_mask");
  bool eod_mask_loss = training_knob_bool("data.eod_mask_loss");
  std::int32_t eod_id = -1;  // resolved at setup when a switch is on
  bool enabled() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
};

struct TrainingOptions {
  GPTConfig model;
  std::uint32_t init_seed = training_knob_int<std::uint32_t>("model.init_seed");
  // A checkpoint (or run directory) whose weights a new run starts from instead of
  // init_seed's: fine-tuning, e.g. from `train import-hf`. Empty: none.
  std::string init_from;

  // The training and validation data: the same blend, split parts 0 and 1.
  dataprep::BlendConfig train_data;
  dataprep::BlendConfig valid_data;
  int loader_workers = training_knob_int<int>("data.workers");
  int prefetch_batches = training_knob_int<int>("data.prefetch");
  // Resume although a shard's identity differs from the checkpoint's (shard_identity.h).
  bool allow_changed_shards = training_knob_bool("data.allow_changed_shards");
  DocumentMasking documents;

  int micro_batch = training_knob_int<int>("train.micro_batch");
  // A multiple of micro_batch x data-parallel size: gradient accumulation. The knob's
  // default, 0, means one micro-batch.
  int global_batch = micro_batch;
  std::int64_t steps = training_knob_int<std::int64_t>("train.steps");
  std::int64_t exit_at_step = training_knob_int<std::int64_t>("train.exit_at_step");  // 0 = never
  NonFiniteAction on_nonfinite = NonFiniteAction::kStop;
  int threads = training_knob_int<int>("train.threads");  // OpenMP threads; 0 = OpenMP's default
  DeviceKind device = DeviceKind::kCpu;
  Precision precision = Precision::kFp32;  // train.precision: fp32, or the bf16 recipe (gpt.h)
  Recompute recompute = Recompute::kNone;  // train.recompute: what a layer keeps for its backward (gpt.h)
  // train.attention_products: attention's tile products in fp32, or on bf16 operands (gpt.h)
  Precision attention_products = Precision::kFp32;
  // train.memory_limit: bytes a rank's memory plan may need; 0 = the device's capacity.
  double memory_limit_bytes = 0.0;
  double dp_bucket_mb = training_knob_double<double>("train.dp_bucket_mb");  // MiB per data-parallel collective

  LrSchedule schedule;
  AdamWOptions adamw;
  double grad_clip = training_knob_double<double>("optim.grad_clip");  // 0 = no clipping

  std::int64_t eval_interval = training_knob_int<std::int64_t>("eval.interval");  // 0 = no evaluation
  int eval_batches = training_knob_int<int>("eval.batches");

  std::int64_t checkpoint_interval = training_knob_int<std::int64_t>("checkpoint.interval");  // 0 = at the end
  int checkpoint_keep = training_knob_int<int>("checkpoint.keep");

  // The layout over the launcher's ranks: data parallel = world / (tp x pp).
  int tensor_parallel_size = training_knob_int<int>("dist.tensor_parallel_size");
  int pipeline_parallel_size = training_knob_int<int>("dist.pipeline_parallel_size");
  std::vector<int> pipeline_num_layers;  // layers per stage; empty = an even split
  int zero_stage = training_knob_int<int>("dist.zero_stage");  // 1: moments sharded; 2: gradients too; 3: parameters
  bool reduce_each_micro_batch = training_knob_bool("dist.reduce_each_micro_batch");  // stage 0 summing as ZeRO-2
  // Stages 2 and 3: each layer's reduction runs during the next one's backward. Off by
  // default: on MPI over shared memory it measured no faster and holds one more layer
  // (docs/parallelism.md), and the NCCL backend does not overlap it yet.
  bool overlap_reduction = training_knob_bool("dist.overlap_reduction");
  double collective_timeout = training_knob_double<double>("dist.collective_timeout");
  // optim.offload = cpu: fp32 masters and AdamW moments in host memory, the update on
  // the host (GPTRecipe::optimizer_offload); false = none.
  bool optimizer_offload = false;

  std::string run_dir = std::string(training_knob_string("run.dir"));
  std::int64_t log_interval = training_knob_int<std::int64_t>("run.log_interval");

  int accumulation_steps(int data_parallel_size = 1) const {
    return global_batch / (micro_batch * data_parallel_size);
  }
};

// Reads and checks a Config of training_config_schema(). Throws dufu::Error naming
// the knob for a value out of range or inconsistent with another (a global batch
// that is not a multiple of the micro-batch, a missing data.blend, a float knob that
// is NaN, infinite or beyond the float range, ...).
TrainingOptions training_options(const Config& config);

// What the rule book (recipe_rules.h) judges of a run's options.
RecipeChoices recipe_choices(const TrainingOptions& options);

// Throws dufu::Error naming both knobs unless train.global_batch is a multiple of
// train.micro_batch x `data_parallel_size`: training_options checks it for one rank,
// the trainer again once the launcher's ranks give the data-parallel size.
void check_global_batch(const TrainingOptions& options, int data_parallel_size);

// What every rank of a run must have alike (rank_agreement.h): every knob but those
// that only tune the rank they are given to and may differ between nodes
// (train.threads, data.workers, data.prefetch, data.cache_dir).
std::vector<AgreedSetting> rank_shared_settings(const Config& config);

}  // namespace dufu::trainer
