// Shard sidecars (shard_sidecar.h): writing, reading, merging and publishing them.
#include "dufu/dataprep/shard_sidecar.h"

#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/log.h"
#include "dufu/dataprep/index.h"

namespace dufu::dataprep {
namespace {

constexpr char kFormat[] = "dufu shard sidecar";
constexpr std::uint64_t kVersion = 1;

std::optional<std::uint64_t> file_bytes(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(info.st_size);
}

std::string sidecar_json(const ShardSidecar& sidecar) {
  JsonWriter json;
  json.begin_object().key("format").value(kFormat).key("version").value(kVersion).key("tokenizer");
  write_tokenizer_record(json, sidecar.tokenizer);
  json.key("dtype").value(dtype_name(sidecar.dtype));
  json.key("eod_id");
  sidecar.eod_id ? json.value(*sidecar.eod_id) : json.null();
  json.key("append_eod");
  sidecar.append_eod ? json.value(*sidecar.append_eod) : json.null();
  json.key("json_key");
  sidecar.json_key ? json.value(*sidecar.json_key) : json.null();
  json.key("json_keys").begin_array();
  for (const std::string& key : sidecar.json_keys) json.value(key);
  json.end_array();
  json.key("bin_bytes").value(sidecar.bin_bytes).key("idx_bytes").value(sidecar.idx_bytes).end_object();
  return json.str() + "\n";
}

ShardSidecar parse_sidecar(const std::string& path) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (const auto error = parser.load(path).get(root)) {
    DUFU_FAIL(path, ": not a readable JSON file (", simdjson::error_message(error), ")");
  }
  simdjson::dom::object object;
  std::string_view format;
  std::uint64_t version = 0;
  if (root.get_object().get(object) || object.at_key("format").get_string().get(format) || format != kFormat) {
    DUFU_FAIL(path, ": not a dufu shard sidecar (no \"format\": \"", kFormat, "\")");
  }
  if (object.at_key("version").get_uint64().get(version) || version != kVersion) {
    DUFU_FAIL(path, ": not sidecar version ", kVersion, ", the one this build reads; HINT: use the dufu version "
              "that wrote it");
  }
  const auto fail = [&](const char* key, const char* expected) {
    DUFU_FAIL(path, ": \"", key, "\" is missing or not ", expected);
  };
  ShardSidecar sidecar;
  simdjson::dom::element tokenizer;
  if (object.at_key("tokenizer").get(tokenizer)) fail("tokenizer", "an object");
  sidecar.tokenizer = parse_tokenizer_record(simdjson::to_string(tokenizer), path);
  std::string_view dtype;
  if (object.at_key("dtype").get_string().get(dtype)) fail("dtype", "a string");
  sidecar.dtype = parse_dtype(dtype);
  simdjson::dom::element value;
  if (object.at_key("eod_id").get(value)) fail("eod_id", "an id or null");
  if (!value.is_null()) {
    std::int64_t id = 0;
    if (value.get_int64().get(id)) fail("eod_id", "an id or null");
    sidecar.eod_id = id;
  }
  if (object.at_key("append_eod").get(value)) fail("append_eod", "true, false or null");
  if (!value.is_null()) {
    bool append = false;
    if (value.get_bool().get(append)) fail("append_eod", "true, false or null");
    sidecar.append_eod = append;
  }
  if (object.at_key("json_key").get(value)) fail("json_key", "a string or null");
  if (!value.is_null()) {
    std::string_view key;
    if (value.get_string().get(key)) fail("json_key", "a string or null");
    sidecar.json_key = std::string(key);
  }
  simdjson::dom::array keys;
  if (object.at_key("json_keys").get_array().get(keys)) fail("json_keys", "an array");
  for (const simdjson::dom::element key : keys) {
    std::string_view text;
    if (key.get_string().get(text)) fail("json_keys", "an array of strings");
    sidecar.json_keys.emplace_back(text);
  }
  if (object.at_key("bin_bytes").get_uint64().get(sidecar.bin_bytes)) fail("bin_bytes", "a size");
  if (object.at_key("idx_bytes").get_uint64().get(sidecar.idx_bytes)) fail("idx_bytes", "a size");
  return sidecar;
}

template <typename T>
std::optional<T> agreed(const std::optional<T>& a, const std::optional<T>& b) {
  return a == b ? a : std::nullopt;
}

}  // namespace

std::optional<ShardSidecar> read_shard_sidecar(const std::string& prefix) {
  const std::string path = sidecar_path(prefix);
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return std::nullopt;
    DUFU_FAIL("cannot read '", path, "': ", errno_message(errno));
  }
  ShardSidecar sidecar = parse_sidecar(path);
  const std::optional<std::uint64_t> bin = file_bytes(bin_path(prefix)), idx = file_bytes(idx_path(prefix));
  if (bin && idx && (*bin != sidecar.bin_bytes || *idx != sidecar.idx_bytes)) {
    DUFU_FAIL("'", path, "' describes a pair of ", sidecar.bin_bytes, " + ", sidecar.idx_bytes,
              " bytes but '", prefix, "' has ", *bin, " + ", *idx,
              ": the pair was replaced by a tool that writes no sidecar; HINT: remove the stale sidecar "
              "(then give --tokenizer) or preprocess again");
  }
  return sidecar;
}

RecordedTokenizer sidecar_tokenizer(const std::string& prefix, const ShardSidecar& sidecar) {
  RecordedTokenizer recorded;
  recorded.record = sidecar.tokenizer;
  recorded.recorded_by = sidecar_path(prefix);
  recorded.model_path = sidecar.tokenizer.model.path;
  if (sidecar.tokenizer.merges) recorded.merges_path = sidecar.tokenizer.merges->path;
  return recorded;
}

ShardsTokenizer shards_tokenizer(const std::vector<std::string>& prefixes) {
  ShardsTokenizer found;
  std::string first;  // the shard `recorded` comes from
  for (const std::string& prefix : prefixes) {
    const std::optional<ShardSidecar> sidecar = read_shard_sidecar(prefix);
    if (!sidecar) {
      found.unrecorded.push_back(prefix);
    } else if (!found.recorded) {
      found.recorded = sidecar_tokenizer(prefix, *sidecar);
      first = prefix;
    } else if (sidecar->tokenizer.identity_sha256() != found.recorded->record.identity_sha256()) {
      DUFU_FAIL("the shards '", first, "' and '", prefix, "' were tokenized with different tokenizers, ",
                found.recorded->record.describe(), " and ", sidecar->tokenizer.describe(),
                ": their token ids cannot be used together; HINT: preprocess every shard with one tokenizer");
    }
  }
  return found;
}

std::optional<ShardSidecar> merged_sidecar(const std::vector<std::string>& input_prefixes) {
  std::optional<ShardSidecar> merged;
  std::string first;    // the input merged's tokenizer is from
  std::string missing;  // an input without a sidecar
  for (const std::string& prefix : input_prefixes) {
    const std::optional<ShardSidecar> sidecar = read_shard_sidecar(prefix);
    if (!sidecar) {
      if (missing.empty()) missing = prefix;
      continue;
    }
    if (!merged) {
      merged = sidecar;
      first = prefix;
      continue;
    }
    if (sidecar->tokenizer.identity_sha256() != merged->tokenizer.identity_sha256()) {
      DUFU_FAIL("cannot merge '", prefix, "' (tokenized with ", sidecar->tokenizer.describe(), ") with '", first,
                "' (tokenized with ", merged->tokenizer.describe(),
                "): their token ids belong to different tokenizers");
    }
    merged->eod_id = agreed(merged->eod_id, sidecar->eod_id);
    merged->append_eod = agreed(merged->append_eod, sidecar->append_eod);
    merged->json_key = agreed(merged->json_key, sidecar->json_key);
    if (merged->json_keys != sidecar->json_keys) merged->json_keys.clear();
  }
  if (merged && !missing.empty()) {
    DUFU_LOG_WARN("merge", "'", missing, "' has no sidecar ('", sidecar_path(missing),
                  "'), so the merged shard records no tokenizer");
    return std::nullopt;
  }
  return merged;
}

void publish_shard_sidecar(const std::string& prefix, std::optional<ShardSidecar> sidecar) {
  if (!sidecar) return;
  const std::optional<std::uint64_t> bin = file_bytes(bin_path(prefix)), idx = file_bytes(idx_path(prefix));
  if (!bin || !idx) DUFU_FAIL("cannot write '", sidecar_path(prefix), "': '", prefix, "' is not in place");
  sidecar->bin_bytes = *bin;
  sidecar->idx_bytes = *idx;
  AtomicFile out(sidecar_path(prefix));
  const std::string text = sidecar_json(*sidecar);
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace dufu::dataprep
