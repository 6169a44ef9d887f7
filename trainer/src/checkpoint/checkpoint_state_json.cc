// state.json and config.toml of a checkpoint (see checkpoint_state_json.h). Reading
// trusts nothing, since a checkpoint is exactly what a crash, a full disk or a copy
// gone wrong leaves behind: every field is checked for presence, type and range, and
// each .safetensors file's size and SHA-256 against the record, so a damaged
// checkpoint is refused with the file and the reason instead of resuming from bad
// numbers.
#include "checkpoint_state_json.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>

#include <simdjson.h>

#include "json_type_name.h"

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/trainer/checkpoint/run_tokenizer.h"

namespace dufu::trainer::checkpoint_state_json {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormat = "dufu-checkpoint";
// Version 2 added the layout and a file list of any length; version 1 (serial
// checkpoints) still reads.
constexpr std::uint64_t kVersion = 2;
constexpr std::uint64_t kOldestVersion = 1;

using checkpoint_files::describe_file;
using checkpoint_files::FileRecord;
using checkpoint_files::kModelFields;
using checkpoint_files::ModelField;

std::string join(const std::string& dir, std::string_view name) { return (fs::path(dir) / name).string(); }

void write_text(const std::string& path, std::string_view text) {
  AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
}

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
  if (state.data_order != "megatron") json.key("data_order").value(state.data_order);
  json.key("model").begin_object();
  for (const ModelField& field : kModelFields) {
    if (!checkpoint_files::writes_field(field, state.model)) continue;
    const std::string text = field.text(state.model);
    if (field.is_integer) {
      json.key(field.name).value(static_cast<std::int64_t>(std::stoll(text)));
    } else {
      json.key(field.name).value(text);
    }
  }
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
  json.key("shards").begin_array();
  for (const ShardIdentity& shard : state.shards) {
    json.begin_object()
        .key("prefix").value(shard.prefix)
        .key("bin_bytes").value(shard.bin_bytes)
        .key("idx_bytes").value(shard.idx_bytes)
        .key("idx_sha256").value(shard.idx_sha256)
        .key("bin_sample_sha256").value(shard.bin_sample_sha256)
        .end_object();
  }
  json.end_array();
  write_state_tokenizer(json, state);
  json.key("config_toml").value(state.config_toml);
  json.end_object();
  return json.str() + "\n";
}

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
    simdjson::dom::element order;
    if (!object.at_key("data_order").get(order)) {
      state.data_order = string_field(object, "", "data_order");
      if (state.data_order != "megatron" && state.data_order != "stable") {
        fail("data_order is '", state.data_order, "', not megatron or stable");
      }
    }
    const simdjson::dom::object model = object_field(object, "", "model");
    for (const ModelField& field : kModelFields) {
      // The architecture's fields are absent from GPT-2 checkpoints: GPT-2's values.
      simdjson::dom::element present;
      if (!field.always_written && model.at_key(field.name).get(present)) continue;
      try {
        field.parse(state.model, field.is_integer ? std::to_string(integer_field(
                                                        model, "model.", field.name,
                                                        static_cast<std::uint64_t>(std::numeric_limits<int>::max())))
                                                  : string_field(model, "model.", field.name));
      } catch (const Error& e) {
        fail("\"model\": ", e.what());
      }
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
    // Optional: checkpoints written before dufu recorded the shards have none.
    simdjson::dom::element shards;
    if (!object.at_key("shards").get(shards)) state.shards = shards_field(shards);
    simdjson::dom::element tokenizer;  // optional too: data without sidecars records none
    if (!object.at_key("tokenizer").get(tokenizer)) read_state_tokenizer(simdjson::to_string(tokenizer), path_, state);
    const simdjson::dom::object files = object_field(object, "", "files");
    // Counted before the names are made: a forged layout of 2^31 ranks would make them all.
    // (More files than the layout has is reported below, by the name of the extra one.)
    const std::uint64_t pieces = static_cast<std::uint64_t>(state.layout.tensor_parallel_size) *
                                 static_cast<std::uint64_t>(state.layout.pipeline_parallel_size);
    const std::uint64_t expected_files =
        pieces * (1 + (state.layout.optimizer_sharded ? static_cast<std::uint64_t>(state.layout.data_parallel_size) : 1));
    if (expected_files > files.size()) {
      fail("\"files\" lists ", files.size(), " files; a checkpoint of this layout has ", expected_files);
    }
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

  std::vector<ShardIdentity> shards_field(simdjson::dom::element value) const {
    simdjson::dom::array array;
    if (value.get_array().get(array)) fail("field \"shards\" is ", json_type_name(value.type()), ", expected an array");
    std::vector<ShardIdentity> shards;
    for (const simdjson::dom::element entry : array) {
      const std::string where = str_cat("shards[", shards.size(), "].");
      simdjson::dom::object object;
      if (entry.get_object().get(object)) {
        fail("field \"", where.substr(0, where.size() - 1), "\" is ", json_type_name(entry.type()),
             ", expected an object");
      }
      ShardIdentity& shard = shards.emplace_back();
      shard.prefix = string_field(object, where, "prefix");
      shard.bin_bytes = integer_field(object, where, "bin_bytes", std::numeric_limits<std::uint64_t>::max());
      shard.idx_bytes = integer_field(object, where, "idx_bytes", std::numeric_limits<std::uint64_t>::max());
      shard.idx_sha256 = sha256_field(object, where, "idx_sha256");
      shard.bin_sample_sha256 = sha256_field(object, where, "bin_sample_sha256");
    }
    return shards;
  }

  std::string sha256_field(simdjson::dom::object object, std::string_view where, std::string_view key) const {
    std::string digest = string_field(object, where, key);
    const bool is_hex = std::all_of(digest.begin(), digest.end(),
                                    [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
    if (digest.size() != 64 || !is_hex) {
      fail("field \"", where, key, "\" is \"", digest, "\", not a SHA-256 (64 lower-case hex digits)");
    }
    return digest;
  }

  FileRecord file_record(simdjson::dom::object files, std::string_view name) const {
    const std::string where = str_cat("files.", name, ".");
    const simdjson::dom::object object = object_field(files, "files.", name);
    FileRecord record;
    record.bytes = integer_field(object, where, "bytes", std::numeric_limits<std::uint64_t>::max());
    record.sha256 = sha256_field(object, where, "sha256");
    return record;
  }

  std::string path_;
};

}  // namespace

void write(const std::string& dir, const TrainingState& state, const std::map<std::string, FileRecord>& files) {
  write_text(join(dir, kConfigFile), state.config_toml);
  write_text(join(dir, kStateFile), state_json(state, files));
}

ParsedState parse(const std::string& path) { return StateReader(path).read(); }

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

}  // namespace dufu::trainer::checkpoint_state_json
