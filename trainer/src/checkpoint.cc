// Checkpoints (see checkpoint.h for the files): written into a partial directory and
// renamed into place once every file is durable; read back trusting nothing, since a
// checkpoint is exactly what a crash, a full disk or a copy gone wrong leaves behind.
// state.json records each .safetensors file's size and SHA-256, so a damaged
// checkpoint is refused with the file and the reason instead of resuming from bad
// numbers.
#include "dufu/trainer/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>

#include <simdjson.h>

#include "checkpoint_files.h"
#include "json_type_name.h"

#include "dufu/common/atomic_file.h"
#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/log.h"
#include "dufu/common/mapped_file.h"
#include "dufu/trainer/data_parallel_optimizer.h"

namespace dufu::trainer {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormat = "dufu-checkpoint";
// Version 2 added the layout and a file list of any length; version 1 (serial
// checkpoints) still reads.
constexpr std::uint64_t kVersion = 2;
constexpr std::uint64_t kOldestVersion = 1;
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kConfigFile = "config.toml";
constexpr const char* kCheckpointsDir = "checkpoints";
constexpr const char* kLog = "CKPT";
constexpr std::string_view kStepPrefix = "step_";
// Directories that are not (or no longer) checkpoints: one being written, and one
// being replaced by a new checkpoint of the same step.
constexpr std::string_view kPartialInfix = ".partial-";
constexpr std::string_view kReplacedInfix = ".replaced-";

using checkpoint_files::describe_file;
using checkpoint_files::FileRecord;
using checkpoint_files::Piece;
using checkpoint_files::piece_of;

using checkpoint_files::kModelFields;
using checkpoint_files::ModelField;

const ModelField* first_difference(const GPTConfig& a, const GPTConfig& b) {
  for (const ModelField& field : kModelFields) {
    if (a.*field.member != b.*field.member) return &field;
  }
  return nullptr;
}

std::string join(const std::string& dir, std::string_view name) { return (fs::path(dir) / name).string(); }

std::string step_dir_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

// The step of a complete checkpoint's directory name: "step_" and decimal digits only.
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

std::string base_name(const std::string& path) {
  fs::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "run/checkpoints/step_00000010/"
  return p.filename().string();
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) DUFU_FAIL("cannot open directory '", dir, "' to sync it: ", errno_message(errno));
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  const int error = errno;
  ::close(fd);
  // Some file systems cannot sync directories (EINVAL); the rename is then as durable
  // as they allow.
  if (rc != 0 && error != EINVAL) DUFU_FAIL("cannot sync directory '", dir, "': ", errno_message(error));
}

void write_text(const std::string& path, std::string_view text) {
  AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
}

// ---- writing ----

std::string state_json(const TrainingState& state, const std::map<std::string, FileRecord>& files) {
  JsonWriter json;
  json.begin_object();
  json.key("format").value(kFormat).key("version").value(kVersion);
  json.key("step").value(state.step);
  json.key("consumed_samples").value(state.consumed_samples);
  json.key("consumed_tokens").value(state.consumed_tokens);
  json.key("skipped_steps").value(state.skipped_steps);
  json.key("train_loader_state").value(state.train_loader_state);
  json.key("init_seed").value(state.init_seed);
  json.key("data_seed").value(state.data_seed);
  json.key("model").begin_object();
  for (const ModelField& field : kModelFields) json.key(field.name).value(state.model.*field.member);
  json.end_object();
  const CheckpointLayout& layout = state.layout;
  json.key("layout").begin_object();
  json.key("tensor_parallel_size").value(layout.tensor_parallel_size);
  json.key("pipeline_parallel_size").value(layout.pipeline_parallel_size);
  json.key("data_parallel_size").value(layout.data_parallel_size);
  json.key("optimizer_sharded").value(layout.optimizer_sharded);
  json.key("pipeline_layers").begin_array();
  for (const int layers : layout.pipeline_layers) json.value(layers);
  json.end_array();
  json.end_object();
  // In the order of checkpoint_file_names, which a reader checks against.
  json.key("files").begin_object();
  for (const std::string& name : checkpoint_file_names(layout)) {
    const FileRecord& record = files.at(name);
    json.key(name).begin_object().key("bytes").value(record.bytes).key("sha256").value(record.sha256).end_object();
  }
  json.end_object();
  json.key("config_toml").value(state.config_toml);
  json.end_object();
  return json.str() + "\n";
}

// Renames the finished partial directory to its final name, replacing a checkpoint
// of the same step, and makes the rename durable. On failure nothing is left under
// the final name except the old checkpoint it was to replace.
void publish(const std::string& partial, const std::string& final_dir, const std::string& checkpoints) {
  std::error_code error;
  std::string replaced;
  if (fs::exists(fs::symlink_status(final_dir, error))) {
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
    sync_directory(checkpoints);
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

struct DirEntry {
  std::string name;
  std::string path;
  bool is_directory = false;
};

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

// Complete checkpoints (step_<digits>/ holding state.json), oldest first.
std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& checkpoints) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const DirEntry& entry : list_directory(checkpoints)) {
    const std::optional<std::int64_t> step = parse_step_dir_name(entry.name);
    std::error_code ignored;
    if (step && entry.is_directory && fs::is_regular_file(join(entry.path, kStateFile), ignored)) {
      found.emplace_back(*step, entry.path);
    }
  }
  std::sort(found.begin(), found.end());
  return found;
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

// After a save of `saved_step`: removes partial and replaced directories, checkpoints
// of later steps and all but the newest `keep_last` of the others. Failures are only
// logged: the new checkpoint is in place, and an old directory left behind costs
// disk space, not correctness.
void remove_stale(const std::string& checkpoints, std::int64_t saved_step, int keep_last) {
  std::vector<std::pair<std::int64_t, std::string>> complete;
  try {
    for (const DirEntry& entry : list_directory(checkpoints)) {
      const bool leftover = entry.name.starts_with(kStepPrefix) &&
                            (entry.name.find(kPartialInfix) != std::string::npos ||
                             entry.name.find(kReplacedInfix) != std::string::npos);
      if (leftover && entry.is_directory) remove_directory(entry.path, "unfinished checkpoint");
    }
    complete = complete_checkpoints(checkpoints);
  } catch (const Error& e) {
    DUFU_LOG_WARN(kLog, "cannot clean up old checkpoints: ", e.what());
    return;
  }
  int kept = 0;
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    if (it->first > saved_step) {
      DUFU_LOG_WARN(kLog, "removing checkpoint '", it->second, "': its step ", it->first, " is after step ",
                    saved_step, " just saved, so it belongs to the run this one resumed from an earlier point");
      remove_directory(it->second, "abandoned checkpoint");
    } else if (kept < keep_last) {
      ++kept;
    } else {
      remove_directory(it->second, "old checkpoint");
    }
  }
}

// ---- reading state.json ----


struct ParsedState {
  TrainingState state;
  std::map<std::string, FileRecord> files;
};

// Reads one state.json; every failure names the file and the field.
class StateReader {
 public:
  explicit StateReader(std::string path) : path_(std::move(path)) {}

  template <typename... Parts>
  [[noreturn]] void fail(Parts&&... parts) const {
    DUFU_FAIL(path_, ": ", std::forward<Parts>(parts)...);
  }

  ParsedState read() {
    const std::string text = read_text();
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (const auto error = parser.parse(text.data(), text.size(), /*realloc_if_needed=*/true).get(root); error) {
      fail("not valid JSON (", simdjson::error_message(error), ")");
    }
    simdjson::dom::object object;
    if (root.get_object().get(object)) fail("the top level is ", json_type_name(root.type()), ", not an object");

    const std::string format = string_field(object, "", "format");
    if (format != kFormat) fail("\"format\" is \"", format, "\", not \"", kFormat, "\": not a dufu checkpoint");
    const std::uint64_t version = integer_field(object, "", "version", std::numeric_limits<std::uint64_t>::max());
    if (version < kOldestVersion || version > kVersion) {
      fail("checkpoint format version ", version, ", this build reads versions ", kOldestVersion, " to ", kVersion,
           "; HINT: use the dufu version that wrote it");
    }

    constexpr std::uint64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
    constexpr std::uint64_t kUint64Max = std::numeric_limits<std::uint64_t>::max();
    constexpr std::uint64_t kUint32Max = std::numeric_limits<std::uint32_t>::max();
    ParsedState parsed;
    TrainingState& state = parsed.state;
    state.step = static_cast<std::int64_t>(integer_field(object, "", "step", kInt64Max));
    state.consumed_samples = integer_field(object, "", "consumed_samples", kUint64Max);
    state.consumed_tokens = integer_field(object, "", "consumed_tokens", kUint64Max);
    state.skipped_steps = static_cast<std::int64_t>(integer_field(object, "", "skipped_steps", kInt64Max));
    state.train_loader_state = string_field(object, "", "train_loader_state");
    state.init_seed = static_cast<std::uint32_t>(integer_field(object, "", "init_seed", kUint32Max));
    state.data_seed = static_cast<std::uint32_t>(integer_field(object, "", "data_seed", kUint32Max));
    const simdjson::dom::object model = object_field(object, "", "model");
    for (const ModelField& field : kModelFields) {
      state.model.*field.member = static_cast<int>(
          integer_field(model, "model.", field.name, static_cast<std::uint64_t>(std::numeric_limits<int>::max())));
    }
    try {
      state.model.validate();
    } catch (const Error& e) {
      fail("\"model\": ", e.what());
    }
    state.config_toml = string_field(object, "", "config_toml");
    if (version >= 2) {
      state.layout = layout_field(object_field(object, "", "layout"));
      try {
        state.layout.validate(state.model);
      } catch (const Error& e) {
        fail("\"layout\": ", e.what());
      }
    }
    const simdjson::dom::object files = object_field(object, "", "files");
    for (const std::string& name : checkpoint_file_names(state.layout)) parsed.files[name] = file_record(files, name);
    for (const auto field : files) {
      if (!parsed.files.contains(std::string(field.key))) {
        fail("\"files\" lists \"", field.key, "\", which a checkpoint of this layout does not have");
      }
    }
    return parsed;
  }

 private:
  std::string read_text() const {
    std::error_code error;
    if (!fs::exists(path_, error)) {
      fail("missing; HINT: a checkpoint directory gets state.json last, so this one is incomplete or not a "
           "checkpoint");
    }
    std::ifstream in(path_, std::ios::binary);
    if (!in) fail("cannot open: ", errno_message(errno));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) fail("cannot read: ", errno_message(errno));
    return text;
  }

  simdjson::dom::element member(simdjson::dom::object object, std::string_view where, std::string_view key) const {
    simdjson::dom::element value;
    if (object.at_key(key).get(value)) fail("missing field \"", where, key, "\"");
    return value;
  }

  std::string string_field(simdjson::dom::object object, std::string_view where, std::string_view key) const {
    const simdjson::dom::element value = member(object, where, key);
    std::string_view text;
    if (value.get_string().get(text)) {
      fail("field \"", where, key, "\" is ", json_type_name(value.type()), ", expected a string");
    }
    return std::string(text);
  }

  std::uint64_t integer_field(simdjson::dom::object object, std::string_view where, std::string_view key,
                              std::uint64_t max) const {
    const simdjson::dom::element value = member(object, where, key);
    std::uint64_t number = 0;
    if (value.get_uint64().get(number)) {
      if (value.is_int64()) {
        fail("field \"", where, key, "\" is ", value.get_int64().value_unsafe(), ", expected a non-negative integer");
      }
      fail("field \"", where, key, "\" is ", json_type_name(value.type()), ", expected a non-negative integer");
    }
    if (number > max) fail("field \"", where, key, "\" is ", number, ", more than the largest allowed, ", max);
    return number;
  }

  simdjson::dom::object object_field(simdjson::dom::object object, std::string_view where,
                                     std::string_view key) const {
    const simdjson::dom::element value = member(object, where, key);
    simdjson::dom::object result;
    if (value.get_object().get(result)) {
      fail("field \"", where, key, "\" is ", json_type_name(value.type()), ", expected an object");
    }
    return result;
  }

  bool bool_field(simdjson::dom::object object, std::string_view where, std::string_view key) const {
    const simdjson::dom::element value = member(object, where, key);
    bool result = false;
    if (value.get_bool().get(result)) {
      fail("field \"", where, key, "\" is ", json_type_name(value.type()), ", expected true or false");
    }
    return result;
  }

  CheckpointLayout layout_field(simdjson::dom::object object) const {
    constexpr std::uint64_t kIntMax = std::numeric_limits<int>::max();
    CheckpointLayout layout;
    layout.tensor_parallel_size = static_cast<int>(integer_field(object, "layout.", "tensor_parallel_size", kIntMax));
    layout.pipeline_parallel_size =
        static_cast<int>(integer_field(object, "layout.", "pipeline_parallel_size", kIntMax));
    layout.data_parallel_size = static_cast<int>(integer_field(object, "layout.", "data_parallel_size", kIntMax));
    layout.optimizer_sharded = bool_field(object, "layout.", "optimizer_sharded");
    const simdjson::dom::element layers = member(object, "layout.", "pipeline_layers");
    simdjson::dom::array array;
    if (layers.get_array().get(array)) {
      fail("field \"layout.pipeline_layers\" is ", json_type_name(layers.type()), ", expected an array");
    }
    for (const simdjson::dom::element entry : array) {
      std::uint64_t count = 0;
      if (entry.get_uint64().get(count) || count > kIntMax) {
        fail("field \"layout.pipeline_layers\" holds ", simdjson::to_string(entry),
             ", expected numbers of layers");
      }
      layout.pipeline_layers.push_back(static_cast<int>(count));
    }
    return layout;
  }

  FileRecord file_record(simdjson::dom::object files, std::string_view name) const {
    const std::string where = str_cat("files.", name, ".");
    const simdjson::dom::object object = object_field(files, "files.", name);
    FileRecord record;
    record.bytes = integer_field(object, where, "bytes", std::numeric_limits<std::uint64_t>::max());
    record.sha256 = string_field(object, where, "sha256");
    const bool is_hex = std::all_of(record.sha256.begin(), record.sha256.end(),
                                    [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
    if (record.sha256.size() != 64 || !is_hex) {
      fail("field \"", where, "sha256\" is \"", record.sha256, "\", not a SHA-256 (64 lower-case hex digits)");
    }
    return record;
  }

  std::string path_;
};

// state.json of a checkpoint directory, checked field by field but without reading
// the .safetensors files it describes.
ParsedState parse_state(const std::string& checkpoint_dir) {
  const std::string path = join(checkpoint_dir, kStateFile);
  ParsedState parsed = StateReader(path).read();
  const std::optional<std::int64_t> named_step = parse_step_dir_name(base_name(checkpoint_dir));
  if (named_step && *named_step != parsed.state.step) {
    DUFU_FAIL(path, ": step ", parsed.state.step, " does not match the directory name ", base_name(checkpoint_dir),
              " (a checkpoint copied under another name?)");
  }
  return parsed;
}

void verify_file(const std::string& checkpoint_dir, const std::string& name, const FileRecord& expected) {
  const std::string path = join(checkpoint_dir, name);
  std::error_code error;
  if (!fs::exists(path, error)) DUFU_FAIL(checkpoint_dir, ": ", name, " is missing (state.json lists it)");
  const FileRecord actual = describe_file(path);
  if (actual.bytes != expected.bytes) {
    DUFU_FAIL(checkpoint_dir, ": ", name, " is ", actual.bytes, " bytes, state.json says ", expected.bytes,
              actual.bytes < expected.bytes ? " (truncated?)" : " (overwritten or appended to?)");
  }
  if (actual.sha256 != expected.sha256) {
    DUFU_FAIL(checkpoint_dir, ": ", name, " has SHA-256 ", actual.sha256, ", state.json says ", expected.sha256,
              " (corrupt)");
  }
}

}  // namespace

bool TrainingState::operator==(const TrainingState& other) const {
  return step == other.step && consumed_samples == other.consumed_samples &&
         consumed_tokens == other.consumed_tokens && skipped_steps == other.skipped_steps &&
         train_loader_state == other.train_loader_state && init_seed == other.init_seed &&
         data_seed == other.data_seed && first_difference(model, other.model) == nullptr &&
         config_toml == other.config_toml && layout == other.layout;
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

namespace checkpoint_files {

std::string partial_path(const std::string& run_dir, std::int64_t step, std::int64_t pid) {
  return join(join(run_dir, kCheckpointsDir), str_cat(step_dir_name(step), kPartialInfix, pid));
}

std::string final_path(const std::string& run_dir, std::int64_t step) {
  return join(join(run_dir, kCheckpointsDir), step_dir_name(step));
}

std::string create_partial(const std::string& run_dir, std::int64_t step, std::int64_t pid) {
  const std::string checkpoints = join(run_dir, kCheckpointsDir);
  std::error_code error;
  fs::create_directories(checkpoints, error);
  if (error) DUFU_FAIL("cannot create checkpoint directory '", checkpoints, "': ", error.message());
  const std::string partial = partial_path(run_dir, step, pid);
  fs::remove_all(partial, error);  // left by an earlier process with this pid
  if (!fs::create_directory(partial, error) || error) {
    DUFU_FAIL("cannot create directory '", partial, "': ", error ? error.message() : "it already exists");
  }
  return partial;
}

std::string finish(const std::string& run_dir, const std::string& partial, const TrainingState& state,
                   const std::map<std::string, FileRecord>& files, int keep_last) {
  const std::string checkpoints = join(run_dir, kCheckpointsDir);
  const std::string final_dir = final_path(run_dir, state.step);
  try {
    const std::vector<std::string> expected = checkpoint_file_names(state.layout);
    for (const std::string& name : expected) {
      if (!files.contains(name)) DUFU_FAIL("checkpoint of step ", state.step, ": no rank wrote ", name);
    }
    if (files.size() != expected.size()) {
      DUFU_FAIL("checkpoint of step ", state.step, ": ", files.size(), " files written, the layout has ",
                expected.size());
    }
    write_text(join(partial, kConfigFile), state.config_toml);
    write_text(join(partial, kStateFile), state_json(state, files));
    publish(partial, final_dir, checkpoints);
  } catch (...) {
    abandon(partial);
    throw;
  }
  DUFU_LOG_INFO(kLog, "saved checkpoint '", final_dir, "'");
  remove_stale(checkpoints, state.step, keep_last);
  return final_dir;
}

void abandon(const std::string& partial) {
  std::error_code ignored;
  fs::remove_all(partial, ignored);
}

}  // namespace checkpoint_files

std::string save_checkpoint(const std::string& run_dir, const GPT& model, const AdamW& optimizer,
                            const TrainingState& state, int keep_last) {
  if (keep_last < 1) DUFU_FAIL("save_checkpoint: keep_last must be at least 1, got ", keep_last);
  if (state.step < 0) DUFU_FAIL("save_checkpoint: step must not be negative, got ", state.step);
  if (const ModelField* field = first_difference(state.model, model.config())) {
    DUFU_FAIL("save_checkpoint: the state's model has ", field->name, " ", state.model.*field->member,
              ", the model being saved has ", model.config().*field->member);
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
  const std::string partial = checkpoint_files::create_partial(run_dir, state.step, ::getpid());
  std::map<std::string, FileRecord> files;
  try {
    checkpoint_files::write_model(join(partial, kModelFile), whole, model.params());
    checkpoint_files::write_optimizer(join(partial, kOptimizerFile), whole, optimizer.m(), optimizer.v(),
                                      optimizer.step_count());
    for (const char* name : {kModelFile, kOptimizerFile}) files[name] = describe_file(join(partial, name));
  } catch (...) {
    checkpoint_files::abandon(partial);
    throw;
  }
  return checkpoint_files::finish(run_dir, partial, state, files, keep_last);
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  const std::string checkpoints = join(run_dir, kCheckpointsDir);
  std::error_code error;
  if (!fs::is_directory(checkpoints, error)) return {};
  std::vector<std::string> paths;
  for (auto& [step, path] : complete_checkpoints(checkpoints)) paths.push_back(std::move(path));
  return paths;
}

TrainingState read_checkpoint_state(const std::string& checkpoint_dir, FileCheck files) {
  ParsedState parsed = parse_state(checkpoint_dir);
  if (files == FileCheck::kVerify) {
    for (const auto& [name, record] : parsed.files) verify_file(checkpoint_dir, name, record);
  }
  return std::move(parsed.state);
}

void load_checkpoint(const std::string& checkpoint_dir, GPT& model, AdamW* optimizer) {
  const ParsedState parsed = parse_state(checkpoint_dir);
  const GPTConfig& config = model.config();
  if (const ModelField* field = first_difference(parsed.state.model, config)) {
    DUFU_FAIL(checkpoint_dir, ": the checkpoint's model has ", field->name, " ", parsed.state.model.*field->member,
              ", the model to load it into has ", field->name, " ", config.*field->member,
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
  const CheckpointLayout& layout = parsed.state.layout;
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
      checkpoint_files::read_model(join(checkpoint_dir, model_file_name(layout, t, p)), piece, piece_params);
      unshard_gpt_piece(config, piece.tp, t, piece.stage, piece_params, params);
      if (optimizer == nullptr) continue;
      piece_m.assign(size, 0.0f);
      piece_v.assign(size, 0.0f);
      if (!layout.optimizer_sharded) {
        const std::string name = optimizer_file_name(layout, t, p, 0);
        check_step_count(checkpoint_files::read_optimizer(join(checkpoint_dir, name), piece, piece_m, piece_v), name);
      } else {
        for (int d = 0; d < layout.data_parallel_size; ++d) {
          const auto [begin, end] = zero_shard_range(size, layout.data_parallel_size, d);
          const std::string name = optimizer_file_name(layout, t, p, d);
          const auto range = [&, begin = begin, end = end](std::vector<float>& buffer) {
            return std::span<float>(buffer).subspan(begin, end - begin);
          };
          check_step_count(checkpoint_files::read_optimizer_shard(join(checkpoint_dir, name), piece, begin,
                                                                  range(piece_m), range(piece_v)),
                           name);
        }
      }
      unshard_gpt_piece(config, piece.tp, t, piece.stage, piece_m, m);
      unshard_gpt_piece(config, piece.tp, t, piece.stage, piece_v, v);
    }
  }
  std::copy(params.begin(), params.end(), model.params().begin());
  if (optimizer != nullptr) {
    std::copy(m.begin(), m.end(), optimizer->m().begin());
    std::copy(v.begin(), v.end(), optimizer->v().begin());
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

  if (fs::exists(join(path, kStateFile), error)) {
    read_checkpoint_state(path);
    return path;
  }
  for (const DirEntry& entry : list_directory(path)) {
    const std::string& name = entry.name;
    if (name.ends_with(".safetensors") && (name.starts_with("model") || name.starts_with("optimizer"))) {
      DUFU_FAIL(path, ": an incomplete checkpoint: it has ", name, " but no ", kStateFile,
                "; HINT: name a complete checkpoint or the run directory");
    }
  }
  const std::vector<std::string> checkpoints = list_checkpoints(path);
  if (checkpoints.empty()) {
    // Resuming from scratch because the user named the checkpoints/ directory itself
    // would silently start a new run inside it.
    if (!complete_checkpoints(path).empty()) {
      DUFU_FAIL(path, ": holds checkpoints itself, so it is a run's checkpoints/ directory; HINT: name the run ",
                "directory that contains it, or one checkpoint");
    }
    return std::nullopt;
  }
  std::string newest_error;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    try {
      read_checkpoint_state(*it);
      return *it;
    } catch (const Error& e) {
      DUFU_LOG_WARN(kLog, "skipping checkpoint '", *it, "': ", e.what());
      if (newest_error.empty()) newest_error = e.what();
    }
  }
  DUFU_FAIL(path, ": none of its ", checkpoints.size(), " checkpoints verifies; the newest fails with: ",
            newest_error);
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
  // Written next to the destination and renamed, so a failure leaves no half-merged
  // directory under the name.
  const fs::path target = fs::absolute(destination);
  const std::string partial = str_cat(target.string(), kPartialInfix, ::getpid());
  fs::remove_all(partial, error);
  if (!fs::create_directory(partial, error) || error) {
    DUFU_FAIL("cannot create directory '", partial, "': ", error ? error.message() : "it already exists");
  }
  try {
    const Piece whole = piece_of(state.model, state.layout, 0, 0);
    checkpoint_files::write_model(join(partial, kModelFile), whole, model.params());
    checkpoint_files::write_optimizer(join(partial, kOptimizerFile), whole, optimizer.m(), optimizer.v(),
                                      optimizer.step_count());
    std::map<std::string, FileRecord> files;
    for (const char* name : {kModelFile, kOptimizerFile}) files[name] = describe_file(join(partial, name));
    write_text(join(partial, kConfigFile), state.config_toml);
    write_text(join(partial, kStateFile), state_json(state, files));
    fs::rename(partial, target, error);
    if (error) DUFU_FAIL("cannot rename '", partial, "' to '", target.string(), "': ", error.message());
    sync_directory(target.parent_path().string());
  } catch (...) {
    checkpoint_files::abandon(partial);
    throw;
  }
}

}  // namespace dufu::trainer
