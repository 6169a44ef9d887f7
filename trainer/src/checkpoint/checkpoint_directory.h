// Checkpoint directories (their files are described in checkpoint.h): the names
// (<run_dir>/checkpoints/step_<8-digit step>/), writing one as <final>.partial-<pid>/
// and publishing it by a rename once every file is durable, listing a run's complete
// checkpoints, and the rotation after a save. Internal to the trainer library.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint_files.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"

namespace dufu::trainer::checkpoint_directory {

// ---- names ----

// `name` inside `dir`.
std::string path_in(const std::string& dir, std::string_view name);
// The last component of a directory path, with or without a trailing '/'.
std::string base_name(const std::string& path);
// "step_00000042".
std::string step_dir_name(std::int64_t step);
// The step of a complete checkpoint's directory name: "step_" and decimal digits only
// (so not a partial or replaced directory); nullopt for any other name.
std::optional<std::int64_t> parse_step_dir_name(std::string_view name);
// <run_dir>/checkpoints and <run_dir>/checkpoints/step_<step>.
std::string checkpoints_dir(const std::string& run_dir);
std::string step_path(const std::string& run_dir, std::int64_t step);

// ---- listing ----

struct DirEntry {
  std::string name;
  std::string path;
  bool is_directory = false;
};
// Every entry of `dir`; throws dufu::Error naming it when it cannot be listed.
std::vector<DirEntry> list_directory(const std::string& dir);
// The step directories in a checkpoints/ directory (step_<digits>/, complete or
// not), as (step, path), oldest first.
std::vector<std::pair<std::int64_t, std::string>> step_directories(const std::string& checkpoints);
// The complete checkpoints among them (holding state.json).
std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& checkpoints);

// ---- writing one checkpoint directory ----

// The directory a checkpoint bound for `final_dir` is written in: "<final_dir>.partial-
// <pid>", pid being the writing job's first process.
std::string partial_path(const std::string& final_dir, std::int64_t pid);
// Creates that directory empty (removing one left by an earlier process of the same
// pid) and returns it. The parent of final_dir must exist.
std::string create_partial(const std::string& final_dir, std::int64_t pid);

// Removes the partial directories of final_dir whose process is gone (a write killed
// by a signal, or by a file size limit before the tools ignored SIGXFSZ), as the next
// job does with a run's checkpoints; for writers that hold no lock over the
// directory's parent. A process of another machine's is taken for a living one only
// when a process of that pid lives here.
void remove_dead_partials(const std::string& final_dir);

// What publish does with a directory already at final_dir.
enum class Existing { kReplace, kRefuse };

// Finishes the partial directory, which holds the tensor files: checks `files` are
// exactly those of state.layout, writes config.toml and state.json (last), renames the
// directory to final_dir and syncs final_dir's parent so the rename is durable. A
// checkpoint already at final_dir is replaced (kReplace: moved aside, removed once the
// new one is in place) or refused (kRefuse). On failure the partial directory is
// removed and nothing is left under final_dir except what was there before.
void publish(const std::string& partial, const std::string& final_dir, const TrainingState& state,
             const std::map<std::string, checkpoint_files::FileRecord>& files, Existing existing);

// Removes a partial directory after a failure before publish.
void abandon(const std::string& partial);

// ---- saving into a run directory (save_checkpoint, save_parallel_checkpoint) ----

// create_partial for step_path(run_dir, step), creating <run_dir>/checkpoints first.
std::string create_step_partial(const std::string& run_dir, std::int64_t step, std::int64_t pid);
// publish into step_path(run_dir, state.step), replacing a checkpoint of that step,
// then remove_stale; returns the checkpoint's directory.
std::string publish_step(const std::string& run_dir, const std::string& partial, const TrainingState& state,
                         const std::map<std::string, checkpoint_files::FileRecord>& files, int keep_last);

// What processes that died while saving left in `checkpoints`: partial directories
// and half-pruned ones (step_<N>.pruning-<pid>, an old checkpoint the rotation had
// renamed to remove it; with a warning) are removed; a replaced directory
// (step_<N>.replaced-<pid>, the old checkpoint moved aside while its new version of
// the same step was renamed into place) is removed when step_<N> is there, and
// renamed back to step_<N> when it is not (the process died between the two
// renames). Only for the one process that saves into the run (run.dir locked),
// before or after its own saves; failures are only logged.
void remove_leftovers(const std::string& checkpoints);

// After a save of `saved_step` into `checkpoints`: remove_leftovers, then removes
// checkpoints of later steps (with a warning: they belong to a run this one resumed
// from an earlier point) and all but the newest `keep_last` of the others, and step
// directories without state.json older than those kept (with a warning: what pruning
// in place, before it renamed first, left when killed). Each is renamed to
// step_<N>.pruning-<pid> before anything in it is deleted, so a kill never leaves a
// half-deleted directory under a checkpoint's name. Failures are only logged: the new
// checkpoint is in place, and an old directory left behind costs disk space, not
// correctness.
void remove_stale(const std::string& checkpoints, std::int64_t saved_step, int keep_last);

}  // namespace dufu::trainer::checkpoint_directory
