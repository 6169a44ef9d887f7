// Writing, reading and cross-checking the manifests of a divided job's parts
// (part_manifest.h). JSON out through dufu's JsonWriter, in through simdjson.
#include "dufu/dataprep/part_manifest.h"

#include <fcntl.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <map>

#include "dufu/common/atomic_file.h"
#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"

namespace dufu::dataprep {
namespace {

constexpr char kFormat[] = "dufu preprocess part";
constexpr std::int64_t kVersion = 1;

IndexLayout parse_layout(std::string_view name, const std::string& where) {
  for (const IndexLayout layout : {IndexLayout::kMMIDIDX, IndexLayout::kTNTIDX}) {
    if (layout_name(layout) == name) return layout;
  }
  DUFU_FAIL(where, ": unknown index layout '", name, "'");
}

// Field access that names the file and the field on any mismatch.
class ManifestObject {
 public:
  ManifestObject(simdjson::dom::object object, std::string where) : object_(object), where_(std::move(where)) {}

  std::string text(const char* key) const {
    std::string_view value;
    if (object_.at_key(key).get_string().get(value)) DUFU_FAIL(where_, ": '", key, "' is missing or not a string");
    return std::string(value);
  }
  std::uint64_t number(const char* key) const {
    std::uint64_t value = 0;
    if (object_.at_key(key).get_uint64().get(value)) {
      DUFU_FAIL(where_, ": '", key, "' is missing or not a non-negative integer");
    }
    return value;
  }
  simdjson::dom::array array(const char* key) const {
    simdjson::dom::array value;
    if (object_.at_key(key).get_array().get(value)) DUFU_FAIL(where_, ": '", key, "' is missing or not an array");
    return value;
  }
  bool flag(const char* key) const {
    bool value = false;
    if (object_.at_key(key).get_bool().get(value)) DUFU_FAIL(where_, ": '", key, "' is missing or not a boolean");
    return value;
  }
  const std::string& where() const { return where_; }

 private:
  simdjson::dom::object object_;
  std::string where_;
};

}  // namespace

std::string manifest_path(const std::string& part_prefix) { return part_prefix + ".manifest"; }

std::string part_prefix(const std::string& output_prefix, int part, int parts) {
  return str_cat(output_prefix, ".part-", part, "-of-", parts);
}

std::string job_sha256_of(const PartManifest& m) {
  return sha256_hex(str_cat(m.inputs_sha256, "\n", m.options, "\n", m.tokenizer_sha256, "\n", m.parts));
}

void write_part_manifest(const std::string& part_prefix, const PartManifest& m) {
  JsonWriter json;
  json.begin_object()
      .key("format")
      .value(kFormat)
      .key("version")
      .value(kVersion)
      .key("part")
      .value(m.part)
      .key("parts")
      .value(m.parts)
      .key("key")
      .value(m.key)
      .key("job_sha256")
      .value(m.job_sha256)
      .key("inputs_sha256")
      .value(m.inputs_sha256)
      .key("options")
      .value(m.options)
      .key("tokenizer")
      .value(m.tokenizer)
      .key("tokenizer_sha256")
      .value(m.tokenizer_sha256)
      .key("layout")
      .value(layout_name(m.layout))
      .key("dtype")
      .value(dtype_name(m.dtype));
  json.key("covers").begin_array();
  for (const InputRange& piece : m.covers) {
    json.begin_object().key("path").value(piece.path).key("whole").value(piece.whole);
    json.key("begin").value(piece.begin).key("end").value(piece.end).end_object();
  }
  json.end_array();
  json.key("sequences").value(m.sequences).key("documents").value(m.documents).key("tokens").value(m.tokens);
  json.key("bin_bytes").value(m.bin_bytes).key("idx_bytes").value(m.idx_bytes).key("idx_sha256").value(m.idx_sha256);
  json.key("records").value(m.records).key("empty_skipped").value(m.empty_skipped);
  json.key("bad_skipped").value(m.bad_skipped).key("input_bytes").value(m.input_bytes);
  json.key("text_bytes").value(m.text_bytes);
  json.key("first_errors").begin_array();
  for (const std::string& message : m.first_errors) json.value(message);
  json.end_array().end_object();
  AtomicFile file(manifest_path(part_prefix));
  const std::string text = json.str() + "\n";
  file.write(text.data(), text.size());
  file.commit();
}

bool has_part_manifest(const std::string& part_prefix) {
  struct stat st {};
  return ::stat(manifest_path(part_prefix).c_str(), &st) == 0;
}

PartManifest read_part_manifest(const std::string& part_prefix) {
  const std::string path = manifest_path(part_prefix);
  simdjson::dom::parser parser;
  simdjson::padded_string text;
  if (simdjson::padded_string::load(path).get(text)) {
    DUFU_FAIL("cannot read '", path, "': ", errno != 0 ? errno_message(errno) : "unreadable");
  }
  simdjson::dom::object object;
  if (parser.parse(text).get_object().get(object)) DUFU_FAIL(path, ": not a JSON object (a damaged manifest?)");
  const ManifestObject fields(object, path);
  if (fields.text("format") != kFormat || fields.number("version") != static_cast<std::uint64_t>(kVersion)) {
    DUFU_FAIL(path, ": not a version ", kVersion, " manifest of a dufu preprocess part");
  }
  PartManifest m;
  const std::uint64_t part = fields.number("part"), parts = fields.number("parts");
  if (parts < 1 || part >= parts || parts > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    DUFU_FAIL(path, ": part ", part, " of ", parts, " is impossible");
  }
  m.part = static_cast<int>(part);
  m.parts = static_cast<int>(parts);
  const std::string named = str_cat(".part-", part, "-of-", parts);
  // A part renamed to something else is still a part; only its own kind of name counts.
  const std::size_t slash = part_prefix.rfind('/');
  const std::size_t at = part_prefix.rfind(".part-");
  if (at != std::string::npos && (slash == std::string::npos || at > slash) &&
      part_prefix.find("-of-", at) != std::string::npos && part_prefix.substr(at) != named) {
    DUFU_FAIL(path, ": says part ", part, " of ", parts, " but its name says '", part_prefix.substr(at),
              "'; HINT: a manifest is not to be edited: run the part again");
  }
  m.key = fields.text("key");
  m.job_sha256 = fields.text("job_sha256");
  m.inputs_sha256 = fields.text("inputs_sha256");
  m.options = fields.text("options");
  m.tokenizer = fields.text("tokenizer");
  m.tokenizer_sha256 = fields.text("tokenizer_sha256");
  m.layout = parse_layout(fields.text("layout"), path);
  m.dtype = parse_dtype(fields.text("dtype"));
  for (const simdjson::dom::element element : fields.array("covers")) {
    simdjson::dom::object piece;
    if (element.get_object().get(piece)) DUFU_FAIL(path, ": an entry of 'covers' is not an object");
    const ManifestObject piece_fields(piece, path);
    m.covers.push_back(InputRange{.path = piece_fields.text("path"),
                                  .whole = piece_fields.flag("whole"),
                                  .begin = piece_fields.number("begin"),
                                  .end = piece_fields.number("end")});
  }
  m.sequences = fields.number("sequences");
  m.documents = fields.number("documents");
  m.tokens = fields.number("tokens");
  m.bin_bytes = fields.number("bin_bytes");
  m.idx_bytes = fields.number("idx_bytes");
  m.idx_sha256 = fields.text("idx_sha256");
  m.records = fields.number("records");
  m.empty_skipped = fields.number("empty_skipped");
  m.bad_skipped = fields.number("bad_skipped");
  m.input_bytes = fields.number("input_bytes");
  m.text_bytes = fields.number("text_bytes");
  for (const simdjson::dom::element element : fields.array("first_errors")) {
    std::string_view message;
    if (element.get_string().get(message)) DUFU_FAIL(path, ": an entry of 'first_errors' is not a string");
    m.first_errors.emplace_back(message);
  }
  if (m.job_sha256 != job_sha256_of(m)) {
    DUFU_FAIL(path, ": its job_sha256 is not that of its inputs, options, tokenizer and part count (", m.parts,
              "), which were changed after it was written; HINT: a manifest is not to be edited: run the part again");
  }
  return m;
}

std::vector<std::string> check_job_parts(const std::vector<std::string>& prefixes,
                                         const std::vector<PartManifest>& manifests) {
  DUFU_CHECK(prefixes.size() == manifests.size() && !prefixes.empty());
  const PartManifest& first = manifests.front();
  const std::string& first_prefix = prefixes.front();
  for (std::size_t i = 1; i < manifests.size(); ++i) {
    const PartManifest& m = manifests[i];
    auto differ = [&](const char* what, const std::string& mine, const std::string& theirs) {
      DUFU_FAIL("'", prefixes[i], "' and '", first_prefix, "' are not parts of one job: ", what, " differ ('", mine,
                "' and '", theirs, "')");
    };
    if (m.parts != first.parts) {
      DUFU_FAIL("'", prefixes[i], "' is part ", m.part, " of ", m.parts, " but '", first_prefix, "' is part ",
                first.part, " of ", first.parts, ": parts of different divisions cannot be merged");
    }
    if (m.tokenizer_sha256 != first.tokenizer_sha256) {
      differ("their tokenizers", str_cat(m.tokenizer, " sha256 ", m.tokenizer_sha256.substr(0, 12)),
             str_cat(first.tokenizer, " sha256 ", first.tokenizer_sha256.substr(0, 12)));
    }
    if (m.options != first.options) differ("their options", m.options, first.options);
    if (m.key != first.key) differ("their JSON keys", m.key, first.key);
    if (m.inputs_sha256 != first.inputs_sha256) {
      differ("the inputs they divide (the files, their order or sizes)", m.inputs_sha256.substr(0, 12),
             first.inputs_sha256.substr(0, 12));
    }
    if (m.job_sha256 != first.job_sha256) differ("their jobs", m.job_sha256, first.job_sha256);
  }
  std::vector<int> owner(static_cast<std::size_t>(first.parts), -1);
  for (std::size_t i = 0; i < manifests.size(); ++i) {
    int& slot = owner[static_cast<std::size_t>(manifests[i].part)];
    if (slot >= 0) {
      DUFU_FAIL("part ", manifests[i].part, " of ", first.parts, " is given twice: '",
                prefixes[static_cast<std::size_t>(slot)], "' and '", prefixes[i], "'");
    }
    slot = static_cast<int>(i);
  }
  std::vector<std::string> missing;
  for (int part = 0; part < first.parts; ++part) {
    if (owner[static_cast<std::size_t>(part)] < 0) missing.push_back(std::to_string(part));
  }
  if (!missing.empty()) {
    std::string list;
    for (const auto& part : missing) list += (list.empty() ? "" : ", ") + part;
    DUFU_FAIL(
        "part", missing.size() > 1 ? "s " : " ", list, " of ", first.parts, " ", missing.size() > 1 ? "are" : "is",
        " missing (the parts given are of '", first_prefix, "''s job; e.g. '",
        part_prefix(first_prefix.substr(0, first_prefix.rfind(".part-")), std::stoi(missing.front()), first.parts),
        "')");
  }
  std::vector<std::string> ordered;
  for (int part = 0; part < first.parts; ++part) {
    const auto i = static_cast<std::size_t>(owner[static_cast<std::size_t>(part)]);
    const PartManifest& m = manifests[i];
    const std::string& prefix = prefixes[i];
    struct stat bin {
    }, idx{};
    const bool sizes_match = ::stat(bin_path(prefix).c_str(), &bin) == 0 &&
                             ::stat(idx_path(prefix).c_str(), &idx) == 0 &&
                             static_cast<std::uint64_t>(bin.st_size) == m.bin_bytes &&
                             static_cast<std::uint64_t>(idx.st_size) == m.idx_bytes;
    if (!sizes_match || sha256_of_file(idx_path(prefix)) != m.idx_sha256) {
      DUFU_FAIL("'", prefix, ".{bin,idx}' are not the files its manifest '", manifest_path(prefix),
                "' describes (written again after it, or damaged); run its part again");
    }
    ordered.push_back(prefix);
  }
  return ordered;
}

}  // namespace dufu::dataprep
