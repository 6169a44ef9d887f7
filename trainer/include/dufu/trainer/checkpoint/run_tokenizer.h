// The tokenizer of a run, kept with the run so that its checkpoints can be read back
// into text without asking which tokenizer made the data. The shards' sidecars
// (dataprep/shard_sidecar.h) name it; rank 0 copies its file(s) into
// <run.dir>/tokenizer/ once (verified by SHA-256 when already there), and every
// checkpoint gets its own copy in <checkpoint>/tokenizer/ (a hard link where the file
// system allows) named in state.json under "tokenizer" (kind, pattern, and per file
// its name, its path relative to the checkpoint, SHA-256 and size). A copy in each
// checkpoint, rather than a path into the run directory, so that a checkpoint
// directory copied on its own (to another machine, into a model store) still
// generates and exports; tokenizers are megabytes, checkpoints far more.
// Shards without a sidecar record nothing, and neither do the checkpoints.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dufu/common/json_writer.h"
#include "dufu/dataprep/tokenizer_record.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"

namespace dufu::trainer {

// The directory name, in a run directory and in a checkpoint.
inline constexpr char kRunTokenizerDir[] = "tokenizer";

// The tokenizer the sidecars of `prefixes` (the blend's shards) record, nullopt when
// none has one. Throws naming two shards and their files when they record different
// tokenizers. Shards without a sidecar among others that have one are listed in
// `unrecorded` for a warning.
std::optional<dataprep::RecordedTokenizer> data_tokenizer(const std::vector<std::string>& prefixes,
                                                          std::vector<std::string>* unrecorded);

// Rank 0, holding the run's lock: copies the data's tokenizer file(s) into
// <run_dir>/tokenizer/ (atomically; a file already there must have the recorded
// SHA-256, else throws naming both: a run trains with one tokenizer) and returns the
// record with paths relative to run_dir. Throws when a recorded file is missing or
// changed since the shards were written.
dataprep::TokenizerRecord install_run_tokenizer(const std::string& run_dir, const dataprep::RecordedTokenizer& data);

// Puts state.tokenizer's files (found under state.tokenizer_dir) into
// <checkpoint_dir>/tokenizer/, checked against their SHA-256. Nothing without a
// tokenizer. For the writer of a checkpoint, before state.json.
void copy_tokenizer_into_checkpoint(const TrainingState& state, const std::string& checkpoint_dir);

// state.json's "tokenizer" member, written when the state has one, and read back
// (`path` names state.json in errors; tokenizer_dir becomes its directory).
void write_state_tokenizer(JsonWriter& json, const TrainingState& state);
void read_state_tokenizer(std::string_view member_json, const std::string& path, TrainingState& state);

// On resume: what differs, naming both tokenizers, when the checkpoint and the data
// record different tokenizers; nullopt when they agree or either records none.
std::optional<std::string> tokenizer_change(const TrainingState& saved, const TrainingState& current,
                                            const std::string& checkpoint);

// The tokenizer a checkpoint records, its files in the checkpoint, for the tools.
std::optional<dataprep::RecordedTokenizer> checkpoint_tokenizer(const std::string& checkpoint_dir,
                                                                const TrainingState& state);

}  // namespace dufu::trainer
