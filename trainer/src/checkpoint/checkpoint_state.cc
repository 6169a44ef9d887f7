// The layout and state of a checkpoint (see checkpoint_state.h): layout checks, the
// file names a layout has, and state.json read back and verified.
#include "dufu/trainer/checkpoint/checkpoint_state.h"

#include <cstdio>
#include <optional>
#include <utility>

#include "checkpoint_directory.h"
#include "checkpoint_files.h"
#include "checkpoint_state_json.h"

#include "dufu/common/error.h"

namespace dufu::trainer {

using checkpoint_files::first_difference;

bool TrainingState::operator==(const TrainingState& other) const {
  return step == other.step && consumed_samples == other.consumed_samples &&
         consumed_tokens == other.consumed_tokens && skipped_steps == other.skipped_steps &&
         train_loader_state == other.train_loader_state && init_seed == other.init_seed &&
         data_seed == other.data_seed && data_order == other.data_order && first_difference(model, other.model) == nullptr &&
         config_toml == other.config_toml && layout == other.layout && shards == other.shards &&
         tokenizer == other.tokenizer;
}

void CheckpointLayout::validate(const GPTConfig& model) const {
  for (const auto& [name, value] : {std::pair{"tensor_parallel_size", tensor_parallel_size},
                                    std::pair{"pipeline_parallel_size", pipeline_parallel_size},
                                    std::pair{"data_parallel_size", data_parallel_size}}) {
    if (value < 1) DUFU_FAIL(name, " is ", value, ", must be at least 1");
  }
  if (model.n_head % tensor_parallel_size != 0) {
    DUFU_FAIL("tensor_parallel_size ", tensor_parallel_size, " does not divide n_head ", model.n_head);
  }
  (void)gpt_parameter_layout(model, tensor_parallel_size);  // the K/V heads and the MLP split too
  if (optimizer_sharded && data_parallel_size == 1) {
    DUFU_FAIL("optimizer_sharded with data_parallel_size 1: there is nothing to shard over");
  }
  if (pipeline_parallel_size > 1 || !pipeline_layers.empty()) {
    (void)pipeline_layer_split(model.n_layer, pipeline_parallel_size, pipeline_layers);
  }
}

namespace {
std::string piece_suffix(const CheckpointLayout& layout, int tp_rank, int pp_rank) {
  char text[32] = "";
  if (layout.tensor_parallel_size > 1 && layout.pipeline_parallel_size > 1) {
    std::snprintf(text, sizeof(text), "-tp%02d-pp%03d", tp_rank, pp_rank);
  } else if (layout.tensor_parallel_size > 1) {
    std::snprintf(text, sizeof(text), "-tp%02d", tp_rank);
  } else if (layout.pipeline_parallel_size > 1) {
    std::snprintf(text, sizeof(text), "-pp%03d", pp_rank);
  }
  return text;
}
}  // namespace

std::string model_file_name(const CheckpointLayout& layout, int tp_rank, int pp_rank) {
  return "model" + piece_suffix(layout, tp_rank, pp_rank) + ".safetensors";
}

std::string optimizer_file_name(const CheckpointLayout& layout, int tp_rank, int pp_rank, int dp_rank) {
  char data_rank[16] = "";
  if (layout.optimizer_sharded) std::snprintf(data_rank, sizeof(data_rank), "-dp%03d", dp_rank);
  return "optimizer" + piece_suffix(layout, tp_rank, pp_rank) + data_rank + ".safetensors";
}

std::vector<std::string> checkpoint_file_names(const CheckpointLayout& layout) {
  std::vector<std::string> names;
  for (int p = 0; p < layout.pipeline_parallel_size; ++p) {
    for (int t = 0; t < layout.tensor_parallel_size; ++t) names.push_back(model_file_name(layout, t, p));
  }
  for (int p = 0; p < layout.pipeline_parallel_size; ++p) {
    for (int t = 0; t < layout.tensor_parallel_size; ++t) {
      for (int d = 0; d < (layout.optimizer_sharded ? layout.data_parallel_size : 1); ++d) {
        names.push_back(optimizer_file_name(layout, t, p, d));
      }
    }
  }
  return names;
}


TrainingState read_checkpoint_state(const std::string& checkpoint_dir, FileCheck files) {
  const std::string path = checkpoint_directory::path_in(checkpoint_dir, checkpoint_state_json::kStateFile);
  checkpoint_state_json::ParsedState parsed = checkpoint_state_json::parse(path);
  const std::string name = checkpoint_directory::base_name(checkpoint_dir);
  const std::optional<std::int64_t> named_step = checkpoint_directory::parse_step_dir_name(name);
  if (named_step && *named_step != parsed.state.step) {
    DUFU_FAIL(path, ": step ", parsed.state.step, " does not match the directory name ", name,
              " (a checkpoint copied under another name?)");
  }
  if (files == FileCheck::kVerify) {
    for (const auto& [file, record] : parsed.files) checkpoint_state_json::verify_file(checkpoint_dir, file, record);
  }
  return std::move(parsed.state);
}

}  // namespace dufu::trainer
