// The run's tokenizer (run_tokenizer.h): from the shards' sidecars into the run
// directory, from there into every checkpoint, and named in state.json.
#include "dufu/trainer/checkpoint/run_tokenizer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/read_only_file.h"
#include "dufu/dataprep/part_manifest.h"
#include "dufu/dataprep/shard_sidecar.h"

namespace dufu::trainer {
namespace {

namespace fs = std::filesystem;
using dataprep::TokenizerFileRecord;
using dataprep::TokenizerRecord;

std::string short_digest(const std::string& sha256) { return sha256.substr(0, 12); }

std::string relative_path(const TokenizerFileRecord& file) { return std::string(kRunTokenizerDir) + "/" + file.file; }

// Copies `from` to `to` through a temporary, failing unless the copy has `sha256`.
void copy_verified(const std::string& from, const std::string& to, const std::string& sha256) {
  AtomicFile out(to);
  read_in_blocks(from, [&out](const char* data, std::size_t size) { out.write(data, size); });
  out.prepare();
  const std::string copied = dataprep::sha256_of_file(out.temp_path());
  if (copied != sha256) {
    DUFU_FAIL("'", from, "' changed while it was copied to '", to, "' (SHA-256 ", short_digest(copied),
              "..., expected ", short_digest(sha256), "...)");
  }
  out.commit();
}

std::vector<const TokenizerFileRecord*> files_of(const TokenizerRecord& record) {
  std::vector<const TokenizerFileRecord*> files = {&record.model};
  if (record.merges) files.push_back(&*record.merges);
  return files;
}

void create_directory(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) DUFU_FAIL("cannot create directory '", dir, "': ", error.message());
}

}  // namespace

std::optional<dataprep::RecordedTokenizer> data_tokenizer(const std::vector<std::string>& prefixes,
                                                          std::vector<std::string>* unrecorded) {
  dataprep::ShardsTokenizer found = dataprep::shards_tokenizer(prefixes);
  if (unrecorded != nullptr && found.recorded) *unrecorded = found.unrecorded;
  return found.recorded;
}

TokenizerRecord install_run_tokenizer(const std::string& run_dir, const dataprep::RecordedTokenizer& data) {
  const std::string dir = (fs::path(run_dir) / kRunTokenizerDir).string();
  create_directory(dir);
  TokenizerRecord record = data.record;
  const std::vector<std::pair<TokenizerFileRecord*, std::string>> files = [&] {
    std::vector<std::pair<TokenizerFileRecord*, std::string>> list = {{&record.model, data.model_path}};
    if (record.merges) list.emplace_back(&*record.merges, data.merges_path);
    return list;
  }();
  for (const auto& [file, source] : files) {
    const std::string target = (fs::path(dir) / file->file).string();
    std::error_code error;
    if (fs::exists(target, error)) {
      const std::string there = dataprep::sha256_of_file(target);
      if (there != file->sha256) {
        DUFU_FAIL("run.dir holds the tokenizer '", target, "' (SHA-256 ", short_digest(there), "...) but the data's ",
                  data.recorded_by, " records '", source, "' (SHA-256 ", short_digest(file->sha256),
                  "...): a run trains with one tokenizer; HINT: give data of another tokenizer a new run.dir");
      }
    } else {
      if (!fs::exists(source, error)) {
        DUFU_FAIL("the tokenizer '", source, "' that ", data.recorded_by,
                  " records is missing, so the run cannot keep a copy; HINT: put it back, or remove the sidecar to "
                  "train without a record of the tokenizer");
      }
      copy_verified(source, target, file->sha256);
    }
    file->path = relative_path(*file);
  }
  return record;
}

void copy_tokenizer_into_checkpoint(const TrainingState& state, const std::string& checkpoint_dir) {
  if (!state.tokenizer) return;
  create_directory((fs::path(checkpoint_dir) / kRunTokenizerDir).string());
  for (const TokenizerFileRecord* file : files_of(*state.tokenizer)) {
    const std::string from = (fs::path(state.tokenizer_dir) / file->path).string();
    const std::string to = (fs::path(checkpoint_dir) / relative_path(*file)).string();
    // A link costs no space; the digest check below holds for it as for a copy.
    if (::link(from.c_str(), to.c_str()) == 0) {
      const std::string linked = dataprep::sha256_of_file(to);
      if (linked != file->sha256) {
        DUFU_FAIL("the run's tokenizer '", from, "' changed since it was recorded (SHA-256 ", short_digest(linked),
                  "..., recorded ", short_digest(file->sha256), "...)");
      }
    } else {
      copy_verified(from, to, file->sha256);
    }
  }
}

void write_state_tokenizer(JsonWriter& json, const TrainingState& state) {
  if (!state.tokenizer) return;
  json.key("tokenizer");
  dataprep::write_tokenizer_record(json, *state.tokenizer);
}

void read_state_tokenizer(std::string_view member_json, const std::string& path, TrainingState& state) {
  TokenizerRecord record = dataprep::parse_tokenizer_record(member_json, path);
  for (const TokenizerFileRecord* file : files_of(record)) {
    // Inside the checkpoint, and nowhere else: state.json must not point a reader away.
    if (file->path != relative_path(*file)) {
      DUFU_FAIL(path, ": the tokenizer file's path '", file->path, "' is not '", relative_path(*file), "'");
    }
  }
  state.tokenizer = std::move(record);
  state.tokenizer_dir = fs::path(path).parent_path().string();
}

std::optional<std::string> tokenizer_change(const TrainingState& saved, const TrainingState& current,
                                            const std::string& checkpoint) {
  if (!saved.tokenizer || !current.tokenizer) return std::nullopt;
  if (saved.tokenizer->identity_sha256() == current.tokenizer->identity_sha256()) return std::nullopt;
  return str_cat("the checkpoint '", checkpoint, "' was trained on ids of the tokenizer ", saved.tokenizer->describe(),
                 " but the data now records ", current.tokenizer->describe(),
                 ": a model cannot continue on another tokenizer's ids");
}

std::optional<dataprep::RecordedTokenizer> checkpoint_tokenizer(const std::string& checkpoint_dir,
                                                                const TrainingState& state) {
  if (!state.tokenizer) return std::nullopt;
  dataprep::RecordedTokenizer recorded;
  recorded.record = *state.tokenizer;
  recorded.recorded_by = (fs::path(checkpoint_dir) / "state.json").string();
  recorded.model_path = (fs::path(checkpoint_dir) / state.tokenizer->model.path).string();
  if (state.tokenizer->merges) {
    recorded.merges_path = (fs::path(checkpoint_dir) / state.tokenizer->merges->path).string();
  }
  return recorded;
}

}  // namespace dufu::trainer
