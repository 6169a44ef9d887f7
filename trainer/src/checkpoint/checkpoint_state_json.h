// state.json and config.toml of a checkpoint directory (the fields are described in
// checkpoint.h): writing them, and reading state.json back field by field, trusting
// nothing. Internal to the trainer library; read_checkpoint_state
// (checkpoint_state.h) is the public reader.
#pragma once

#include <map>
#include <string>

#include "checkpoint_files.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"

namespace dufu::trainer::checkpoint_state_json {

constexpr const char* kStateFile = "state.json";
constexpr const char* kConfigFile = "config.toml";

// Writes config.toml, then state.json listing `files` (which holds every file of
// state.layout), into `dir`, each as an atomic file: state.json last, since its
// presence is what makes a directory a checkpoint.
void write(const std::string& dir, const TrainingState& state,
           const std::map<std::string, checkpoint_files::FileRecord>& files);

struct ParsedState {
  TrainingState state;
  std::map<std::string, checkpoint_files::FileRecord> files;
};

// Parses the state.json file `path`: format and version, every field present with
// the right type, a valid model shape and layout, and the files of that layout
// listed and nothing else. Throws dufu::Error naming the file and the field.
ParsedState parse(const std::string& path);

// Throws dufu::Error naming `checkpoint_dir` and `name` unless that file is there with
// the size and SHA-256 state.json records (reads it whole).
void verify_file(const std::string& checkpoint_dir, const std::string& name,
                 const checkpoint_files::FileRecord& expected);

}  // namespace dufu::trainer::checkpoint_state_json
