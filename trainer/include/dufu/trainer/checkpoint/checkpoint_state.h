// What a checkpoint holds besides tensors: the layout of the run that wrote it (which
// says what its files are), the training state, and reading state.json back with
// every check. The files themselves are described in checkpoint.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dufu/dataprep/tokenizer_record.h"
#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

// The layout of the run that wrote a checkpoint, which says what its files hold.
struct CheckpointLayout {
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  int data_parallel_size = 1;
  bool optimizer_sharded = false;    // ZeRO-1: moments split over the data-parallel ranks
  std::vector<int> pipeline_layers;  // layers per stage; empty means one stage
  bool operator==(const CheckpointLayout&) const = default;
  // model.safetensors and optimizer.safetensors (one piece, moments not sharded).
  bool is_serial() const { return tensor_parallel_size == 1 && pipeline_parallel_size == 1 && !optimizer_sharded; }
  // Throws dufu::Error naming the field when the layout does not fit `model`: sizes
  // below 1, n_head not divisible by tp, pipeline_layers not a split of n_layer into
  // pipeline_parallel_size stages, sharding with one data-parallel rank.
  void validate(const GPTConfig& model) const;
};

// The files of a checkpoint of `layout` (see checkpoint.h): model pieces for every
// tensor rank and stage, then the optimizer files, then nothing else.
std::string model_file_name(const CheckpointLayout& layout, int tp_rank, int pp_rank);
std::string optimizer_file_name(const CheckpointLayout& layout, int tp_rank, int pp_rank, int dp_rank);
std::vector<std::string> checkpoint_file_names(const CheckpointLayout& layout);

// What a checkpoint records of each shard of the training blend, to tell on resume
// whether the data is still what the run was trained on (shard_identity.h).
struct ShardIdentity {
  std::string prefix;  // as data.blend names it
  std::uint64_t bin_bytes = 0;
  std::uint64_t idx_bytes = 0;
  std::string idx_sha256;  // of the whole .idx: every document's length and place
  // Of 16 blocks of 4 KiB spread evenly over the .bin, the first and last included
  // (all of a smaller file): tokens rewritten in place, at a cost that does not grow
  // with the shard.
  std::string bin_sample_sha256;
  bool operator==(const ShardIdentity&) const = default;
};

struct TrainingState {
  std::int64_t step = 0;  // optimizer updates done; the next one is number `step`
  std::uint64_t consumed_samples = 0;
  std::uint64_t consumed_tokens = 0;
  std::int64_t skipped_steps = 0;  // updates skipped for a non-finite loss or gradient
  std::string train_loader_state;  // dataprep::LoaderState::to_string()
  // Training draws no random numbers after initialisation (no dropout): the weights
  // come from init_seed and the data order from data_seed and the loader state, so
  // these two plus the loader state are the whole RNG state.
  std::uint32_t init_seed = 0;
  std::uint32_t data_seed = 0;
  // data.order: "megatron" or "stable" (written only when stable, so checkpoints of
  // Megatron's order keep their bytes).
  std::string data_order = "megatron";
  GPTConfig model;
  std::string config_toml;  // the effective configuration
  CheckpointLayout layout;  // of the run that wrote the checkpoint
  // The training blend's shards, in blend order; empty in checkpoints written before
  // dufu recorded them (or by code that trains without a blend).
  std::vector<ShardIdentity> shards;
  // The data's tokenizer (run_tokenizer.h), its files' paths relative to
  // tokenizer_dir (not saved: the run directory while training, the checkpoint's
  // directory once read back); nullopt when the shards record none.
  std::optional<dataprep::TokenizerRecord> tokenizer;
  std::string tokenizer_dir;
  bool operator==(const TrainingState&) const;
};

// Reads state.json of a checkpoint directory and verifies the checkpoint: format and
// version, every field present with the right type, a valid model shape, the step
// matching a step_<N> directory name, a valid layout whose files are exactly those
// listed, and every .safetensors file's size and SHA-256 (which reads them whole).
// Throws dufu::Error naming the file and what is wrong ("<dir>: model.safetensors is
// 1234 bytes, state.json says 5678 (truncated?)").
// With FileCheck::kTrust only state.json is read and checked: for processes that load
// a checkpoint another process of the same job just verified.
enum class FileCheck { kVerify, kTrust };
TrainingState read_checkpoint_state(const std::string& checkpoint_dir, FileCheck files = FileCheck::kVerify);

}  // namespace dufu::trainer
