// Trainer's state (trainer.h), shared by the files that implement it: setting a run
// up (trainer_setup.cc) and training it (trainer.cc). Internal to the trainer library.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/config.h"
#include "dufu/common/file_lock.h"
#include "dufu/common/rank_agreement.h"
#include "dufu/common/topology.h"
#include "dufu/dataprep/blend_builder.h"
#include "dufu/dataprep/data_loader.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "dufu/trainer/checkpoint/parallel_checkpoint.h"
#include "dufu/trainer/checkpoint/run_tokenizer.h"
#include "dufu/trainer/checkpoint/shard_identity.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "dufu/trainer/parallel/pipeline_schedule.h"
#include "dufu/trainer/parallel/rank_groups.h"
#include "dufu/trainer/run/trainer.h"
#include "dufu/trainer/run/training_config.h"
#include "dufu/trainer/run/training_reporter.h"
#include "metrics_log.h"
#include "tensorboard_writer.h"
#include "training_batches.h"

namespace dufu::trainer {

// Declared in the order the run builds them, so they are destroyed in reverse.
struct Trainer::State {
  TrainingOptions options;
  std::string config_toml;
  std::vector<AgreedSetting> shared_settings;  // what every rank must have alike
  std::string resume_from;
  TrainingReporter& reporter;
  const std::atomic<bool>* stop_requested;
  Device* device = nullptr;  // of train.device
  int T = 0;
  std::unique_ptr<Communicator> world;
  std::optional<Topology> topology;
  int dp = 1;
  int accumulation = 1;
  std::vector<int> layer_split;  // layers per pipeline stage
  PipelineStage stage;           // this rank's
  // Rank 0 speaks for the run: the reports, metrics.jsonl, config.toml and checkpoints
  // (every rank holds the same weights and moments, the gradients being summed
  // bitwise identically everywhere).
  bool is_main = false;
  bool ready = false;  // setup() found steps to do
  std::unique_ptr<FileLock> run_lock;
  std::optional<dataprep::RecordedTokenizer> data_tokenizer;  // none: no shard has a sidecar
  std::vector<std::string> shards_without_tokenizer;          // beside shards with one
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
  std::unique_ptr<TensorBoardWriter> tensorboard;  // the same records as event files
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
  // The step's loss is the sum of its micro-batches' losses (each times its weight)
  // over this divisor: their number (accumulation x dp), or under data.eod_mask_loss
  // the targets the whole global batch counts, each micro-batch weighted by its own
  // (the mean over every position that counts, whatever the split into micro-batches).
  std::vector<double> loss_weights;
  double loss_divisor = 1.0;
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

  // The shards of the training blend, as data.blend names them.
  std::vector<std::string> training_prefixes() const {
    std::vector<std::string> prefixes;
    for (const auto& [weight, prefix] : options.train_data.shards) prefixes.push_back(prefix);
    return prefixes;
  }

  // What allocating something needs, for the message when it does not fit.
  struct MemoryNeed {
    std::string what;
    double bytes = 0.0;
  };

  // The steps of Trainer::setup, in the order it takes them.
  // The device of train.device, and the kernels' threads.
  void open_device();
  // The world communicator; refuses ranks whose settings or training shards differ
  // (every rank stops, rank 0 reporting). Returns the shards' identities.
  std::vector<ShardIdentity> join_ranks();
  // The tokenizer the training shards' sidecars record (refusing shards of different
  // tokenizers), kept for claim_run_dir; shards without a sidecar are noted.
  void find_data_tokenizer();
  // This rank's place in the topology, its pipeline stage and the accumulation steps.
  void lay_out_ranks();
  // Refuses a model or batch that cannot fit, before anything is allocated; returns
  // what the model needs, for the message if allocating it fails all the same.
  MemoryNeed check_memory_plan();
  // Rank 0 locks run.dir, removes what dead processes left there, writes config.toml
  // and copies the data's tokenizer into it; every rank waits for it.
  void claim_run_dir();
  // The training and validation data, and the watch over the training shards.
  void open_data(const std::vector<ShardIdentity>& shards);
  // The rank groups, the model and its optimizer, and the layout the checkpoints record.
  void build_model(const MemoryNeed& model_memory);
  // The weights from the checkpoint to resume from, else from model.init_from, else
  // new ones; returns where the
  // loader starts.
  dataprep::LoaderState start_or_resume();
  // The loader, metrics.jsonl, the FLOP counts and the run summary.
  void prepare_steps(const dataprep::LoaderState& loader_start);
  RunSummary run_summary() const;

  // Loads the checkpoint and takes over its state; returns where the loader starts.
  dataprep::LoaderState resume(const std::string& checkpoint);
  // model.init_from: the checkpoint's weights (resharded when its layout is not the
  // run's), AdamW's moments fresh, step and data position zero.
  void initialize_from(const std::string& checkpoint);
  // The gradient of the step's micro-batches, accumulated; step_loss_sum() then reads
  // the sum of their losses.
  void forward_backward();
  // Under data.eod_mask_loss, before the step's first backward: the targets each
  // micro-batch and the global batch count, which set loss_weights, loss_divisor and
  // dloss_scale (the global count takes a sum over the data-parallel group).
  void count_step_targets();
  // Under document masking with data.eod_id unset: the shards' recorded end-of-document
  // token; refuses one outside the vocabulary.
  void find_end_of_document_token();
  double step_loss_sum();
  double pipeline_loss_sum = 0.0;  // pipeline_train_step's, for step_loss_sum
};

}  // namespace dufu::trainer
