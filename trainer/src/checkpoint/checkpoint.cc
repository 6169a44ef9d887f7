// Saving, loading, finding and merging checkpoints (see checkpoint.h). The directory
// steps (partial directory, publish, rotation) are checkpoint_directory.h's, the
// tensor files checkpoint_files.h's and state.json checkpoint_state_json.h's.
#include "dufu/trainer/checkpoint/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <span>
#include <system_error>
#include <utility>

#include "checkpoint_directory.h"
#include "checkpoint_files.h"
#include "checkpoint_state_json.h"
#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "host_staging.h"

namespace dufu::trainer {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kLog = "CKPT";

using checkpoint_directory::path_in;
using checkpoint_files::describe_file;
using checkpoint_files::FileRecord;
using checkpoint_files::first_difference;
using checkpoint_files::ModelField;
using checkpoint_files::Piece;
using checkpoint_files::piece_of;

// Writes the serial layout's two files into `partial` and returns their records; on
// failure removes `partial`.
std::map<std::string, FileRecord> write_serial_files(const std::string& partial, const Piece& whole,
                                                     const GPT& model, const AdamW& optimizer) {
  std::map<std::string, FileRecord> files;
  try {
    const host_staging::StagedState staged(model, &optimizer);
    checkpoint_files::write_model(path_in(partial, kModelFile), whole, staged.params());
    checkpoint_files::write_optimizer(path_in(partial, kOptimizerFile), whole, staged.m(), staged.v(),
                                      optimizer.step_count());
    for (const char* name : {kModelFile, kOptimizerFile}) files[name] = describe_file(path_in(partial, name));
  } catch (...) {
    checkpoint_directory::abandon(partial);
    throw;
  }
  return files;
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const GPT& model, const AdamW& optimizer,
                            const TrainingState& state, int keep_last) {
  if (keep_last < 1) DUFU_FAIL("save_checkpoint: keep_last must be at least 1, got ", keep_last);
  if (state.step < 0) DUFU_FAIL("save_checkpoint: step must not be negative, got ", state.step);
  if (const ModelField* field = first_difference(state.model, model.config())) {
    DUFU_FAIL("save_checkpoint: the state's model has ", field->name, " ", field->text(state.model),
              ", the model being saved has ", field->text(model.config()));
  }
  if (optimizer.num_parameters() != model.num_parameters()) {
    DUFU_FAIL("save_checkpoint: the optimizer has ", optimizer.num_parameters(), " parameters, the model ",
              model.num_parameters());
  }
  if (!state.layout.is_serial()) {
    DUFU_FAIL("save_checkpoint: the state's layout is not serial; parallel runs save with save_parallel_checkpoint");
  }
  if (model.tensor_parallel_size() != 1 || model.pipeline_stage().num_stages != 1) {
    DUFU_FAIL("save_checkpoint: the model is a tensor-parallel or pipeline piece, not the whole model");
  }
  if (optimizer.shard_begin() != 0) DUFU_FAIL("save_checkpoint: the optimizer holds a ZeRO shard, not every moment");
  const Piece whole = piece_of(model.config(), state.layout, 0, 0);
  const std::string partial = checkpoint_directory::create_step_partial(run_dir, state.step, ::getpid());
  std::map<std::string, FileRecord> files;
  try {
    files = write_serial_files(partial, whole, model, optimizer);
  } catch (const Error& e) {
    DUFU_FAIL("checkpoint of step ", state.step, " not written: ", e.what());
  }
  return checkpoint_directory::publish_step(run_dir, partial, state, files, keep_last);
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  const std::string checkpoints = checkpoint_directory::checkpoints_dir(run_dir);
  std::error_code error;
  if (!fs::is_directory(checkpoints, error)) return {};
  std::vector<std::string> paths;
  for (auto& [step, path] : checkpoint_directory::complete_checkpoints(checkpoints)) paths.push_back(std::move(path));
  return paths;
}

void load_checkpoint(const std::string& checkpoint_dir, GPT& model, AdamW* optimizer) {
  const TrainingState saved = read_checkpoint_state(checkpoint_dir, FileCheck::kTrust);
  const GPTConfig& config = model.config();
  if (const ModelField* field = first_difference(saved.model, config)) {
    DUFU_FAIL(checkpoint_dir, ": the checkpoint's model has ", field->name, " ", field->text(saved.model),
              ", the model to load it into has ", field->name, " ", field->text(config),
              "; HINT: the model shape must be the checkpoint's");
  }
  if (model.tensor_parallel_size() != 1 || model.pipeline_stage().num_stages != 1) {
    DUFU_FAIL("load_checkpoint: the model is a tensor-parallel or pipeline piece; load_parallel_checkpoint loads "
              "those");
  }
  if (optimizer != nullptr && (optimizer->num_parameters() != model.num_parameters() || optimizer->shard_begin() != 0)) {
    DUFU_FAIL("load_checkpoint: the optimizer has ", optimizer->num_parameters(), " parameters from ",
              optimizer->shard_begin(), ", the model ", model.num_parameters());
  }
  const CheckpointLayout& layout = saved.layout;
  // Each piece is read whole into a scratch buffer and placed into the full ones, so
  // a bad piece leaves `model` and `optimizer` as they were.
  std::vector<float> params(model.num_parameters(), 0.0f);
  std::vector<float> m, v;
  if (optimizer != nullptr) {
    m.assign(params.size(), 0.0f);
    v.assign(params.size(), 0.0f);
  }
  std::int64_t step_count = -1;
  std::string step_count_file;
  const auto check_step_count = [&](std::int64_t count, const std::string& name) {
    if (step_count >= 0 && count != step_count) {
      DUFU_FAIL(checkpoint_dir, ": ", name, " has step count ", count, ", ", step_count_file, " ", step_count,
                " (files of different steps?)");
    }
    step_count = count;
    step_count_file = name;
  };
  std::vector<float> piece_params, piece_m, piece_v;
  for (int p = 0; p < layout.pipeline_parallel_size; ++p) {
    for (int t = 0; t < layout.tensor_parallel_size; ++t) {
      const Piece piece = piece_of(config, layout, t, p);
      std::size_t size = 0;
      for (const ParamTensor& tensor : piece.layout()) size += tensor.size();
      piece_params.assign(size, 0.0f);
      checkpoint_files::read_model(path_in(checkpoint_dir, model_file_name(layout, t, p)), piece, piece_params);
      unshard_gpt_piece(config, piece.tp, t, piece.stage, piece_params, params);
      if (optimizer == nullptr) continue;
      piece_m.assign(size, 0.0f);
      piece_v.assign(size, 0.0f);
      if (!layout.optimizer_sharded) {
        const std::string name = optimizer_file_name(layout, t, p, 0);
        check_step_count(
            checkpoint_files::read_optimizer(path_in(checkpoint_dir, name), piece, piece_m, piece_v), name);
      } else {
        for (int d = 0; d < layout.data_parallel_size; ++d) {
          const auto [begin, end] = zero_shard_range(size, layout.data_parallel_size, d);
          const std::string name = optimizer_file_name(layout, t, p, d);
          const auto range = [&, begin = begin, end = end](std::vector<float>& buffer) {
            return std::span<float>(buffer).subspan(begin, end - begin);
          };
          check_step_count(checkpoint_files::read_optimizer_shard(path_in(checkpoint_dir, name), piece, begin,
                                                                  range(piece_m), range(piece_v)),
                           name);
        }
      }
      unshard_gpt_piece(config, piece.tp, t, piece.stage, piece_m, m);
      unshard_gpt_piece(config, piece.tp, t, piece.stage, piece_v, v);
    }
  }
  // Everything was read and checked on the host; now it goes to the device in one go.
  model.upload_parameters(params);
  if (optimizer != nullptr) {
    host_staging::upload(optimizer->device(), optimizer->m(), m);
    host_staging::upload(optimizer->device(), optimizer->v(), v);
    optimizer->set_step_count(step_count);
  }
}

std::optional<std::string> find_usable_checkpoint(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error && error != std::errc::no_such_file_or_directory) {
    DUFU_FAIL("cannot access '", path, "': ", error.message());
  }
  if (!fs::exists(status)) DUFU_FAIL(path, ": no such run or checkpoint directory");
  if (!fs::is_directory(status)) DUFU_FAIL(path, ": not a directory (expected a run or checkpoint directory)");

  if (fs::exists(path_in(path, checkpoint_state_json::kStateFile), error)) {
    read_checkpoint_state(path);
    return path;
  }
  for (const checkpoint_directory::DirEntry& entry : checkpoint_directory::list_directory(path)) {
    const std::string& name = entry.name;
    if (name.ends_with(".safetensors") && (name.starts_with("model") || name.starts_with("optimizer"))) {
      DUFU_FAIL(path, ": an incomplete checkpoint: it has ", name, " but no ", checkpoint_state_json::kStateFile,
                "; HINT: name a complete checkpoint or the run directory");
    }
  }
  const std::string checkpoints = checkpoint_directory::checkpoints_dir(path);
  std::vector<std::pair<std::int64_t, std::string>> steps;
  if (fs::is_directory(checkpoints, error)) steps = checkpoint_directory::step_directories(checkpoints);
  if (steps.empty()) {
    // Resuming from scratch because the user named the checkpoints/ directory itself
    // would silently start a new run inside it.
    if (!checkpoint_directory::complete_checkpoints(path).empty()) {
      DUFU_FAIL(path, ": holds checkpoints itself, so it is a run's checkpoints/ directory; HINT: name the run ",
                "directory that contains it, or one checkpoint");
    }
    return std::nullopt;
  }
  // Every step directory is a checkpoint the run wrote: one that cannot be used is
  // reported, and a run whose checkpoints are all unusable is refused, never started
  // over (which would replace them).
  std::string newest_error;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string& dir = it->second;
    std::string reason;
    if (!fs::exists(path_in(dir, checkpoint_state_json::kStateFile), error)) {
      reason = str_cat(dir, ": it has no ", checkpoint_state_json::kStateFile,
                       ", which a checkpoint gets last (incomplete, or damaged after it was written)");
    } else {
      try {
        read_checkpoint_state(dir);
        return dir;
      } catch (const Error& e) {
        reason = e.what();
      }
    }
    DUFU_LOG_WARN(kLog, "skipping checkpoint '", dir, "': ", reason);
    if (newest_error.empty()) newest_error = reason;
  }
  DUFU_FAIL(path, ": none of its ", steps.size(), " checkpoints verifies, and training will not start over them; ",
            "the newest fails with: ", newest_error, "; HINT: restore a good checkpoint there, or remove ",
            checkpoints, " (or choose another run.dir) to start a new run");
}

void remove_checkpoint_leftovers(const std::string& run_dir) {
  checkpoint_directory::remove_leftovers(checkpoint_directory::checkpoints_dir(run_dir));
}

void merge_checkpoint(const std::string& source, const std::string& destination) {
  TrainingState state = read_checkpoint_state(source);
  std::error_code error;
  if (fs::exists(fs::symlink_status(destination, error))) {
    DUFU_FAIL(destination, ": already exists; HINT: name a new directory for the merged checkpoint");
  }
  GPT model(state.model);
  AdamW optimizer(model, AdamWOptions{});
  load_checkpoint(source, model, &optimizer);
  const int data_parallel_size = state.layout.data_parallel_size;
  state.layout = CheckpointLayout{};
  state.layout.data_parallel_size = data_parallel_size;
  // Written next to the destination and published like a saved checkpoint, so a
  // failure leaves no half-merged directory under the name.
  const std::string target = fs::absolute(destination).string();
  const std::string partial = checkpoint_directory::create_partial(target, ::getpid());
  const std::map<std::string, FileRecord> files =
      write_serial_files(partial, piece_of(state.model, state.layout, 0, 0), model, optimizer);
  checkpoint_directory::publish(partial, target, state, files, checkpoint_directory::Existing::kRefuse);
}

}  // namespace dufu::trainer
