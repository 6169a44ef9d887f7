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
#include <set>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>

#include <simdjson.h>

#include "json_type_name.h"

#include "dufu/common/atomic_file.h"
#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/log.h"
#include "dufu/common/mapped_file.h"
#include "dufu/trainer/safetensors.h"

namespace dufu::trainer {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormat = "dufu-checkpoint";
constexpr std::uint64_t kVersion = 1;
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
// AdamW's step count in optimizer.safetensors: an I64 scalar, as torch names it.
constexpr const char* kStepTensor = "step";

// The model shape, field by field: state.json, the metadata of model.safetensors,
// equality and the messages naming the first field that differs all walk this table.
struct ModelField {
  const char* name;
  int GPTConfig::*member;
};
constexpr ModelField kModelFields[] = {
    {"n_layer", &GPTConfig::n_layer},       {"n_head", &GPTConfig::n_head},
    {"d_model", &GPTConfig::d_model},       {"vocab_size", &GPTConfig::vocab_size},
    {"vocab_multiple", &GPTConfig::vocab_multiple}, {"seq_length", &GPTConfig::seq_length},
};

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

// HF's Conv1D layers keep their weights [in, out], dufu's matmul [out, in].
bool is_conv1d_weight(std::string_view name) {
  for (const std::string_view suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

// A tensor's shape in model.safetensors (HF's GPT2Model layout).
std::vector<std::uint64_t> hf_shape(const ParamTensor& tensor, const GPTConfig& config) {
  if (tensor.name == "wte.weight") {
    return {static_cast<std::uint64_t>(config.vocab_size), static_cast<std::uint64_t>(config.d_model)};
  }
  if (is_conv1d_weight(tensor.name)) return {tensor.shape[1], tensor.shape[0]};
  return {tensor.shape.begin(), tensor.shape.end()};
}

std::vector<std::uint64_t> dufu_shape(const ParamTensor& tensor) { return {tensor.shape.begin(), tensor.shape.end()}; }

std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += str_cat(i > 0 ? ", " : "", shape[i]);
  return out + "]";
}

// dst [cols, rows] = src [rows, cols] transposed, in tiles so both sides stay in cache.
void transpose(const float* src, std::size_t rows, std::size_t cols, float* dst) {
  constexpr std::size_t kTile = 32;
  for (std::size_t r0 = 0; r0 < rows; r0 += kTile) {
    for (std::size_t c0 = 0; c0 < cols; c0 += kTile) {
      const std::size_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (std::size_t r = r0; r < r1; ++r) {
        for (std::size_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
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

// What state.json records of each .safetensors file.
struct FileRecord {
  std::uint64_t bytes = 0;
  std::string sha256;
};

FileRecord describe_file(const std::string& path) {
  const MappedFile file = MappedFile::open(path);
  return {file.size(), sha256_hex(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()))};
}

// ---- writing ----

void write_model(const std::string& path, const GPT& model) {
  const GPTConfig& config = model.config();
  const std::span<const float> params = model.params();
  const ParamTensor& wte = model.tensor("wte.weight");
  const std::size_t real = static_cast<std::size_t>(config.vocab_size) * static_cast<std::size_t>(config.d_model);
  // Cutting wte to the real vocabulary loses nothing only while the padding rows are
  // 0, which the model guarantees (no token selects them, their logits are 0).
  const auto padding = params.subspan(wte.offset + real, wte.size() - real);
  DUFU_CHECK(std::all_of(padding.begin(), padding.end(), [](float x) { return x == 0.0f; }),
             "the padding rows of wte.weight are not 0; the checkpoint would drop them");

  std::size_t transposed_size = 0;
  for (const ParamTensor& tensor : model.parameter_tensors()) {
    if (is_conv1d_weight(tensor.name)) transposed_size += tensor.size();
  }
  std::vector<float> transposed(transposed_size);
  std::vector<safetensors::TensorRef> refs;
  std::size_t used = 0;
  for (const ParamTensor& tensor : model.parameter_tensors()) {
    const float* data = params.data() + tensor.offset;
    if (is_conv1d_weight(tensor.name)) {
      transpose(data, tensor.shape[0], tensor.shape[1], transposed.data() + used);
      data = transposed.data() + used;
      used += tensor.size();
    }
    refs.push_back({tensor.name, safetensors::Dtype::kF32, hf_shape(tensor, config), data});
  }
  safetensors::Metadata metadata{{"format", "pt"}};
  for (const ModelField& field : kModelFields) metadata[field.name] = std::to_string(config.*field.member);
  safetensors::write(path, refs, metadata);
}

void write_optimizer(const std::string& path, const GPT& model, const AdamW& optimizer) {
  std::vector<safetensors::TensorRef> refs;
  for (const ParamTensor& tensor : model.parameter_tensors()) {
    refs.push_back({"exp_avg." + tensor.name, safetensors::Dtype::kF32, dufu_shape(tensor),
                    optimizer.m().data() + tensor.offset});
    refs.push_back({"exp_avg_sq." + tensor.name, safetensors::Dtype::kF32, dufu_shape(tensor),
                    optimizer.v().data() + tensor.offset});
  }
  const std::int64_t step_count = optimizer.step_count();
  refs.push_back({kStepTensor, safetensors::Dtype::kI64, {}, &step_count});
  safetensors::write(path, refs, {{"format", "dufu-adamw"}});
}

std::string state_json(const TrainingState& state, const FileRecord& model_file, const FileRecord& optimizer_file) {
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
  json.key("files").begin_object();
  for (const auto& [name, record] : {std::pair{kModelFile, &model_file}, std::pair{kOptimizerFile, &optimizer_file}}) {
    json.key(name).begin_object().key("bytes").value(record->bytes).key("sha256").value(record->sha256).end_object();
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
  FileRecord model_file;
  FileRecord optimizer_file;
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
    if (version != kVersion) {
      fail("checkpoint format version ", version, ", this build reads version ", kVersion,
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
    const simdjson::dom::object files = object_field(object, "", "files");
    parsed.model_file = file_record(files, kModelFile);
    parsed.optimizer_file = file_record(files, kOptimizerFile);
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

void verify_file(const std::string& checkpoint_dir, const char* name, const FileRecord& expected) {
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

// ---- loading tensors ----

// The named F32 tensor of `file` with exactly `shape`.
std::span<const float> checked_view(const safetensors::File& file, const std::string& name,
                                    const std::vector<std::uint64_t>& shape) {
  const safetensors::TensorView* tensor = file.find(name);
  if (tensor == nullptr) DUFU_FAIL(file.path(), ": missing tensor \"", name, "\"");
  if (tensor->shape != shape) {
    DUFU_FAIL(file.path(), ": tensor \"", name, "\" has shape ", shape_text(tensor->shape), ", expected ",
              shape_text(shape));
  }
  return file.view<float>(name);
}

void check_no_other_tensors(const safetensors::File& file, const std::set<std::string>& expected) {
  for (const safetensors::TensorView& tensor : file.tensors()) {
    if (!expected.contains(tensor.name)) DUFU_FAIL(file.path(), ": unexpected tensor \"", tensor.name, "\"");
  }
}

}  // namespace

bool TrainingState::operator==(const TrainingState& other) const {
  return step == other.step && consumed_samples == other.consumed_samples &&
         consumed_tokens == other.consumed_tokens && skipped_steps == other.skipped_steps &&
         train_loader_state == other.train_loader_state && init_seed == other.init_seed &&
         data_seed == other.data_seed && first_difference(model, other.model) == nullptr &&
         config_toml == other.config_toml;
}

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

  const std::string checkpoints = join(run_dir, kCheckpointsDir);
  std::error_code error;
  fs::create_directories(checkpoints, error);
  if (error) DUFU_FAIL("cannot create checkpoint directory '", checkpoints, "': ", error.message());
  const std::string name = step_dir_name(state.step);
  const std::string final_dir = join(checkpoints, name);
  const std::string partial = join(checkpoints, str_cat(name, kPartialInfix, ::getpid()));
  fs::remove_all(partial, error);  // left by an earlier process with our pid
  if (!fs::create_directory(partial, error) || error) {
    DUFU_FAIL("cannot create directory '", partial, "': ", error ? error.message() : "it already exists");
  }
  try {
    write_model(join(partial, kModelFile), model);
    write_optimizer(join(partial, kOptimizerFile), model, optimizer);
    write_text(join(partial, kConfigFile), state.config_toml);
    const FileRecord model_file = describe_file(join(partial, kModelFile));
    const FileRecord optimizer_file = describe_file(join(partial, kOptimizerFile));
    write_text(join(partial, kStateFile), state_json(state, model_file, optimizer_file));
    publish(partial, final_dir, checkpoints);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(partial, ignored);
    throw;
  }
  DUFU_LOG_INFO(kLog, "saved checkpoint '", final_dir, "'");
  remove_stale(checkpoints, state.step, keep_last);
  return final_dir;
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  const std::string checkpoints = join(run_dir, kCheckpointsDir);
  std::error_code error;
  if (!fs::is_directory(checkpoints, error)) return {};
  std::vector<std::string> paths;
  for (auto& [step, path] : complete_checkpoints(checkpoints)) paths.push_back(std::move(path));
  return paths;
}

TrainingState read_checkpoint_state(const std::string& checkpoint_dir) {
  ParsedState parsed = parse_state(checkpoint_dir);
  verify_file(checkpoint_dir, kModelFile, parsed.model_file);
  verify_file(checkpoint_dir, kOptimizerFile, parsed.optimizer_file);
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
  if (optimizer != nullptr && optimizer->num_parameters() != model.num_parameters()) {
    DUFU_FAIL("load_checkpoint: the optimizer has ", optimizer->num_parameters(), " parameters, the model ",
              model.num_parameters());
  }
  const std::vector<ParamTensor>& layout = model.parameter_tensors();

  // Every tensor is checked before anything is copied, so a bad checkpoint leaves the
  // model and the optimizer as they were.
  const safetensors::File weights = safetensors::File::open(join(checkpoint_dir, kModelFile));
  std::vector<std::span<const float>> weight_views;
  std::set<std::string> expected;
  for (const ParamTensor& tensor : layout) {
    weight_views.push_back(checked_view(weights, tensor.name, hf_shape(tensor, config)));
    expected.insert(tensor.name);
  }
  check_no_other_tensors(weights, expected);

  std::optional<safetensors::File> moments;
  std::vector<std::span<const float>> m_views, v_views;
  std::int64_t step_count = 0;
  if (optimizer != nullptr) {
    moments.emplace(safetensors::File::open(join(checkpoint_dir, kOptimizerFile)));
    expected = {kStepTensor};
    for (const ParamTensor& tensor : layout) {
      m_views.push_back(checked_view(*moments, "exp_avg." + tensor.name, dufu_shape(tensor)));
      v_views.push_back(checked_view(*moments, "exp_avg_sq." + tensor.name, dufu_shape(tensor)));
      expected.insert("exp_avg." + tensor.name);
      expected.insert("exp_avg_sq." + tensor.name);
    }
    check_no_other_tensors(*moments, expected);
    const safetensors::TensorView* step = moments->find(kStepTensor);
    if (step == nullptr) DUFU_FAIL(moments->path(), ": missing tensor \"", kStepTensor, "\"");
    if (!step->shape.empty()) {
      DUFU_FAIL(moments->path(), ": tensor \"", kStepTensor, "\" has shape ", shape_text(step->shape),
                ", expected a scalar []");
    }
    step_count = moments->view<std::int64_t>(kStepTensor)[0];
    if (step_count < 0) DUFU_FAIL(moments->path(), ": the step count ", step_count, " is negative");
  }

  const std::span<float> params = model.params();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const ParamTensor& tensor = layout[i];
    float* dst = params.data() + tensor.offset;
    const std::span<const float> src = weight_views[i];
    if (is_conv1d_weight(tensor.name)) {
      transpose(src.data(), tensor.shape[1], tensor.shape[0], dst);
    } else {
      std::copy(src.begin(), src.end(), dst);
      std::fill(dst + src.size(), dst + tensor.size(), 0.0f);  // wte's padding rows
    }
  }
  if (optimizer != nullptr) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      std::copy(m_views[i].begin(), m_views[i].end(), optimizer->m().data() + layout[i].offset);
      std::copy(v_views[i].begin(), v_views[i].end(), optimizer->v().data() + layout[i].offset);
    }
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
  for (const char* name : {kModelFile, kOptimizerFile}) {
    if (fs::exists(join(path, name), error)) {
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

}  // namespace dufu::trainer
