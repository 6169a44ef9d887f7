// Checkpoints of a training run, under <run_dir>/checkpoints/step_<8-digit step>/:
//
//   model.safetensors      the weights under HuggingFace GPT-2 names ("wte.weight",
//                          "h.0.attn.c_attn.weight", ...), loadable by transformers'
//                          GPT2Model / GPT2LMHeadModel: the four Conv1D weights of each
//                          block transposed to HF's [in, out], wte cut to the real
//                          vocabulary [vocab_size, C] (the padding rows are always 0);
//                          metadata "format": "pt" and the model shape ("n_layer",
//                          "n_head", "d_model", "vocab_size", "vocab_multiple",
//                          "seq_length", as decimal strings).
//   optimizer.safetensors  AdamW's moments in dufu's own layout, as
//                          "exp_avg.<name>" and "exp_avg_sq.<name>" (padded, untransposed,
//                          so loading them back is a copy), and the step count as the
//                          I64 scalar "step"; metadata "format": "dufu-adamw".
//   state.json             written last: format name and version, step, consumed
//                          samples and tokens, skipped steps, the train loader's state,
//                          the seeds, the model shape, the effective configuration
//                          (TOML text), and the byte size and SHA-256 of the two
//                          .safetensors files, so truncation or corruption is caught.
//   config.toml            the same effective configuration, for people.
//
// A checkpoint is written into step_<N>.partial-<pid>/ and renamed into place once
// every file is synced, so a kill at any moment leaves either the complete checkpoint
// or none (plus a partial directory that the next save removes). One process saves
// into a run directory at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dufu/trainer/gpt.h"
#include "dufu/trainer/optimizer.h"

namespace dufu::trainer {

struct TrainingState {
  std::int64_t step = 0;  // optimizer updates done; the next one is number `step`
  std::uint64_t consumed_samples = 0;
  std::uint64_t consumed_tokens = 0;
  std::int64_t skipped_steps = 0;  // updates skipped for a non-finite loss or gradient
  std::string train_loader_state;  // dataprep::LoaderState::to_string()
  // Training draws no random numbers after initialisation (no dropout): the weights
  // come from init_seed and the data order from data_seed and the loader state, so
  // these two plus the loader state are the whole RNG state.
  std::uint32_t init_seed = 0;
  std::uint32_t data_seed = 0;
  GPTConfig model;
  std::string config_toml;  // the effective configuration
  bool operator==(const TrainingState&) const;
};

// Writes the checkpoint of `state.step` as described above and returns its directory;
// then removes partial directories and all but the newest `keep_last` (>= 1) complete
// checkpoints. A checkpoint of the same step already present is replaced. Checkpoints
// of later steps are removed too, each with a warning: they come from a run that this
// one resumed from an earlier point, and a later resume must not pick them up. Throws
// dufu::Error naming the path on an IO failure (nothing is left under the final
// name then); failing to remove an old directory is only logged as a warning, since
// the new checkpoint is in place by then. state.model must equal model.config().
std::string save_checkpoint(const std::string& run_dir, const GPT& model, const AdamW& optimizer,
                            const TrainingState& state, int keep_last);

// The complete checkpoint directories of a run (those holding state.json), oldest
// step first; empty when there are none or no checkpoints/ directory. Not verified.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Reads state.json of a checkpoint directory and verifies the checkpoint: format and
// version, every field present with the right type, a valid model shape, the step
// matching a step_<N> directory name, the two .safetensors files' sizes and SHA-256
// (which reads both files whole). Throws dufu::Error naming the file and what is
// wrong ("<dir>: model.safetensors is 1234 bytes, state.json says 5678 (truncated?)").
TrainingState read_checkpoint_state(const std::string& checkpoint_dir);

// Loads the weights into `model`, and the moments and step count into `optimizer`
// unless it is null. The model's config must equal the checkpoint's (else a
// dufu::Error names the first field that differs); every tensor is checked for name,
// dtype and shape, and a tensor the model does not have is an error too. Everything is
// checked before anything is copied, so on an error `model` and `optimizer` are
// unchanged. Reads state.json but does not recompute the digests: call after
// read_checkpoint_state verified the directory.
void load_checkpoint(const std::string& checkpoint_dir, GPT& model, AdamW* optimizer);

// What a user names with --resume or --checkpoint: a checkpoint directory (returned
// as it is once it verifies; throws otherwise), or a run directory, whose newest
// checkpoint that verifies is returned, each newer one that does not being logged as
// a warning with the reason. nullopt for a run directory without checkpoints; throws
// when there are checkpoints but none verifies, `path` does not exist or is not a
// directory, or it is no run directory but an incomplete checkpoint (a .safetensors
// file without state.json) or a checkpoints/ directory: taking those for a run
// without checkpoints would start training from scratch.
std::optional<std::string> find_usable_checkpoint(const std::string& path);

}  // namespace dufu::trainer
