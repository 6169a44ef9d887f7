// Checkpoint directories (see checkpoint_directory.h): a checkpoint is written into a
// partial directory and renamed into place once every file is durable, so a kill at
// any moment leaves either the complete checkpoint or none (plus a partial directory
// that the next run, or the next save, removes).
#include "checkpoint_directory.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "checkpoint_state_json.h"

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "dufu/trainer/checkpoint/run_tokenizer.h"

namespace dufu::trainer::checkpoint_directory {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCheckpointsDir = "checkpoints";
constexpr const char* kLog = "CKPT";
constexpr std::string_view kStepPrefix = "step_";
// Directories that are not (or no longer) checkpoints: one being written, and one
// being replaced by a new checkpoint of the same step.
constexpr std::string_view kPartialInfix = ".partial-";
constexpr std::string_view kReplacedInfix = ".replaced-";
// And one being removed by the rotation: renamed to this first, so that a kill part-way
// through leaves no half-deleted directory under a checkpoint's name.
constexpr std::string_view kPruningInfix = ".pruning-";

// Renames the finished partial directory to its final name, replacing (or refusing)
// what is there, and makes the rename durable. On failure nothing is left under the
// final name except the old checkpoint it was to replace.
void rename_into_place(const std::string& partial, const std::string& final_dir, Existing existing) {
  std::error_code error;
  std::string replaced;
  if (fs::exists(fs::symlink_status(final_dir, error))) {
    if (existing == Existing::kRefuse) DUFU_FAIL(final_dir, ": already exists");
    replaced = str_cat(final_dir, kReplacedInfix, ::getpid());
    fs::remove_all(replaced, error);
    fs::rename(final_dir, replaced, error);
    if (error) {
      DUFU_FAIL("cannot replace checkpoint '", final_dir, "': renaming it to '", replaced,
                "' failed: ", error.message());
    }
  }
  const auto restore = [&] {
    std::error_code ignored;
    if (!replaced.empty()) fs::rename(replaced, final_dir, ignored);
  };
  fs::rename(partial, final_dir, error);
  if (error) {
    restore();
    DUFU_FAIL("cannot write checkpoint '", final_dir, "': renaming '", partial, "' to it failed: ", error.message());
  }
  try {
    sync_directory(fs::path(final_dir).parent_path().string());
  } catch (const Error& e) {
    std::error_code ignored;
    fs::remove_all(final_dir, ignored);
    restore();
    DUFU_FAIL("cannot write checkpoint '", final_dir, "': ", e.what());
  }
  if (!replaced.empty()) {
    fs::remove_all(replaced, error);
    if (error) DUFU_LOG_WARN(kLog, "cannot remove the replaced checkpoint '", replaced, "': ", error.message());
  }
}

void remove_directory(const std::string& path, std::string_view why) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) {
    DUFU_LOG_WARN(kLog, "cannot remove ", why, " '", path, "': ", error.message());
  } else {
    DUFU_LOG_DEBUG(kLog, "removed ", why, " '", path, "'");
  }
}

// Removes checkpoint `path` for the rotation: renamed out of the checkpoints' names
// (durably) before anything in it is deleted, so that a kill leaves either the whole
// checkpoint or a <name>.pruning-<pid> directory, which remove_leftovers removes.
void prune(const std::string& path, std::string_view why) {
  const std::string pruning = str_cat(path, kPruningInfix, ::getpid());
  std::error_code error;
  fs::remove_all(pruning, error);  // left by an earlier process with this pid
  fs::rename(path, pruning, error);
  if (error) {
    DUFU_LOG_WARN(kLog, "cannot remove ", why, " '", path, "': renaming it to '", pruning, "' failed: ",
                  error.message());
    return;
  }
  try {
    sync_directory(fs::path(path).parent_path().string());
  } catch (const Error& e) {
    DUFU_LOG_WARN(kLog, "removing ", why, " '", path, "': ", e.what());
  }
  remove_directory(pruning, why);
}

}  // namespace

// ---- names ----

std::string path_in(const std::string& dir, std::string_view name) { return (fs::path(dir) / name).string(); }

std::string base_name(const std::string& path) {
  fs::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "run/checkpoints/step_00000010/"
  return p.filename().string();
}

std::string step_dir_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

std::optional<std::int64_t> parse_step_dir_name(std::string_view name) {
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  const std::string_view digits = name.substr(kStepPrefix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  std::int64_t step = 0;
  const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (result.ec != std::errc() || result.ptr != digits.data() + digits.size()) return std::nullopt;
  return step;
}

std::string checkpoints_dir(const std::string& run_dir) { return path_in(run_dir, kCheckpointsDir); }

std::string step_path(const std::string& run_dir, std::int64_t step) {
  return path_in(checkpoints_dir(run_dir), step_dir_name(step));
}

// ---- listing ----

std::vector<DirEntry> list_directory(const std::string& dir) {
  std::vector<DirEntry> entries;
  std::error_code error;
  fs::directory_iterator it(dir, error);
  for (const fs::directory_iterator end; !error && it != end; it.increment(error)) {
    std::error_code type_error;
    entries.push_back({it->path().filename().string(), it->path().string(), it->is_directory(type_error)});
  }
  if (error) DUFU_FAIL("cannot list directory '", dir, "': ", error.message());
  return entries;
}

std::vector<std::pair<std::int64_t, std::string>> step_directories(const std::string& checkpoints) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const DirEntry& entry : list_directory(checkpoints)) {
    const std::optional<std::int64_t> step = parse_step_dir_name(entry.name);
    if (step && entry.is_directory) found.emplace_back(*step, entry.path);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& checkpoints) {
  std::vector<std::pair<std::int64_t, std::string>> found = step_directories(checkpoints);
  std::erase_if(found, [](const auto& entry) {
    std::error_code ignored;
    return !fs::is_regular_file(path_in(entry.second, checkpoint_state_json::kStateFile), ignored);
  });
  return found;
}

// ---- writing one checkpoint directory ----

std::string partial_path(const std::string& final_dir, std::int64_t pid) {
  return str_cat(final_dir, kPartialInfix, pid);
}

std::string create_partial(const std::string& final_dir, std::int64_t pid) {
  const std::string partial = partial_path(final_dir, pid);
  std::error_code error;
  fs::remove_all(partial, error);  // left by an earlier process with this pid
  if (!fs::create_directory(partial, error) || error) {
    DUFU_FAIL("cannot create directory '", partial, "': ", error ? error.message() : "it already exists");
  }
  return partial;
}

void remove_dead_partials(const std::string& final_dir) {
  const fs::path final_path(final_dir);
  const std::string head = final_path.filename().string() + std::string(kPartialInfix);
  const std::string parent = final_path.parent_path().empty() ? "." : final_path.parent_path().string();
  std::error_code error;
  if (!fs::is_directory(parent, error)) return;
  try {
    for (const DirEntry& entry : list_directory(parent)) {
      if (!entry.is_directory || !entry.name.starts_with(head)) continue;
      const std::string digits = entry.name.substr(head.size());
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      if (process_exists(std::stoi(digits))) continue;
      remove_directory(entry.path, "unfinished directory");
    }
  } catch (const Error& e) {
    DUFU_LOG_WARN(kLog, "cannot clean up unfinished directories of '", final_dir, "': ", e.what());
  }
}

void publish(const std::string& partial, const std::string& final_dir, const TrainingState& state,
             const std::map<std::string, checkpoint_files::FileRecord>& files, Existing existing) {
  try {
    const std::vector<std::string> expected = checkpoint_file_names(state.layout);
    for (const std::string& name : expected) {
      if (!files.contains(name)) DUFU_FAIL("checkpoint of step ", state.step, ": no rank wrote ", name);
    }
    if (files.size() != expected.size()) {
      DUFU_FAIL("checkpoint of step ", state.step, ": ", files.size(), " files written, the layout has ",
                expected.size());
    }
    copy_tokenizer_into_checkpoint(state, partial);
    checkpoint_state_json::write(partial, state, files);
    rename_into_place(partial, final_dir, existing);
  } catch (...) {
    abandon(partial);
    throw;
  }
}

void abandon(const std::string& partial) {
  std::error_code ignored;
  fs::remove_all(partial, ignored);
}

// ---- saving into a run directory ----

std::string create_step_partial(const std::string& run_dir, std::int64_t step, std::int64_t pid) {
  const std::string checkpoints = checkpoints_dir(run_dir);
  std::error_code error;
  fs::create_directories(checkpoints, error);
  if (error) DUFU_FAIL("cannot create checkpoint directory '", checkpoints, "': ", error.message());
  return create_partial(step_path(run_dir, step), pid);
}

std::string publish_step(const std::string& run_dir, const std::string& partial, const TrainingState& state,
                         const std::map<std::string, checkpoint_files::FileRecord>& files, int keep_last) {
  const std::string final_dir = step_path(run_dir, state.step);
  publish(partial, final_dir, state, files, Existing::kReplace);
  DUFU_LOG_INFO(kLog, "saved checkpoint '", final_dir, "'");
  remove_stale(checkpoints_dir(run_dir), state.step, keep_last);
  return final_dir;
}

// ---- rotation ----

void remove_leftovers(const std::string& checkpoints) {
  std::error_code error;
  if (!fs::is_directory(checkpoints, error)) return;
  try {
    for (const DirEntry& entry : list_directory(checkpoints)) {
      if (!entry.is_directory || !entry.name.starts_with(kStepPrefix)) continue;
      if (entry.name.find(kPartialInfix) != std::string::npos) {
        remove_directory(entry.path, "unfinished checkpoint");
        continue;
      }
      if (entry.name.find(kPruningInfix) != std::string::npos) {
        DUFU_LOG_WARN(kLog, "removing half-pruned checkpoint '", entry.path,
                      "': a process was killed while checkpoint.keep removed it");
        remove_directory(entry.path, "half-pruned checkpoint");
        continue;
      }
      const std::size_t replaced = entry.name.find(kReplacedInfix);
      if (replaced == std::string::npos) continue;
      const std::string final_dir = path_in(checkpoints, entry.name.substr(0, replaced));
      if (parse_step_dir_name(entry.name.substr(0, replaced)) && !fs::exists(fs::symlink_status(final_dir, error))) {
        fs::rename(entry.path, final_dir, error);
        if (!error) {
          DUFU_LOG_WARN(kLog, "restored checkpoint '", final_dir, "' from '", entry.path,
                        "': the process replacing it died before its new version was in place");
          continue;
        }
        DUFU_LOG_WARN(kLog, "cannot restore checkpoint '", final_dir, "' from '", entry.path, "': ", error.message());
        continue;  // kept: it may be the only copy of that checkpoint
      }
      remove_directory(entry.path, "replaced checkpoint");
    }
  } catch (const Error& e) {
    DUFU_LOG_WARN(kLog, "cannot clean up unfinished checkpoints: ", e.what());
  }
}

void remove_stale(const std::string& checkpoints, std::int64_t saved_step, int keep_last) {
  std::vector<std::pair<std::int64_t, std::string>> steps;
  remove_leftovers(checkpoints);
  try {
    steps = step_directories(checkpoints);
  } catch (const Error& e) {
    DUFU_LOG_WARN(kLog, "cannot clean up old checkpoints: ", e.what());
    return;
  }
  int kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    std::error_code ignored;
    const bool complete = fs::is_regular_file(path_in(it->second, checkpoint_state_json::kStateFile), ignored);
    if (!complete) {
      // Older than every checkpoint kept, a step directory without state.json is what
      // pruning by an earlier version (which deleted in place) left when killed.
      if (it->first < saved_step && kept >= keep_last) {
        DUFU_LOG_WARN(kLog, "removing half-pruned checkpoint '", it->second, "': it has no ",
                      checkpoint_state_json::kStateFile, " and is older than the ", kept,
                      " kept (checkpoint.keep)");
        prune(it->second, "half-pruned checkpoint");
      }
    } else if (it->first > saved_step) {
      DUFU_LOG_WARN(kLog, "removing checkpoint '", it->second, "': its step ", it->first, " is after step ",
                    saved_step, " just saved, so it belongs to the run this one resumed from an earlier point");
      prune(it->second, "abandoned checkpoint");
    } else if (kept < keep_last) {
      ++kept;
    } else {
      prune(it->second, "old checkpoint");
    }
  }
}

}  // namespace dufu::trainer::checkpoint_directory
