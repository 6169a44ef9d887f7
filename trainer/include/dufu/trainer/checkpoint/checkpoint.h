// Saving, finding, verifying, loading and merging the checkpoints of a training run
// (<run_dir>/checkpoints/step_<8-digit step>/), serial or sharded by tensor/pipeline
// piece and ZeRO shard; any checkpoint loads into any layout. Every file of a
// checkpoint, its names, metadata and state.json, and how a save stays atomic, is
// described once, in docs/formats.md (section 9, "Checkpoints").
//
// checkpoint_state.h has the layout, the training state and the reader of state.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"

namespace dufu::trainer {

// Writes the checkpoint of `state.step` as described above and returns its directory;
// then removes partial directories and all but the newest `keep_last` (>= 1) complete
// checkpoints. A checkpoint of the same step already present is replaced. Checkpoints
// of later steps are removed too, each with a warning: they come from a run that this
// one resumed from an earlier point, and a later resume must not pick them up. Throws
// dufu::Error naming the path on an IO failure, and naming the step and the first
// tensor when a weight or moment is NaN or infinite (nothing is left under the final
// name then); failing to remove an old directory is only logged as a warning, since
// the new checkpoint is in place by then. state.model must equal model.config(), and
// state.layout be serial (its data_parallel_size is recorded only): model and
// optimizer are whole. parallel_checkpoint.h saves from several ranks.
std::string save_checkpoint(const std::string& run_dir, const GPT& model, const AdamW& optimizer,
                            const TrainingState& state, int keep_last);

// The complete checkpoint directories of a run (those holding state.json), oldest
// step first; empty when there are none or no checkpoints/ directory. Not verified.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Loads the weights into `model`, a whole serial one, and the moments and step count
// into `optimizer` (for the whole model) unless it is null; from a checkpoint of any
// layout, whose pieces are assembled (so this process holds the whole model and
// moments). The model's config must equal the checkpoint's (else a
// dufu::Error names the first field that differs); every tensor is checked for name,
// dtype and shape, and a tensor the model does not have is an error too. Everything is
// checked before anything is copied, so on an error `model` and `optimizer` are
// unchanged. Reads state.json but does not recompute the digests: call after
// read_checkpoint_state verified the directory.
void load_checkpoint(const std::string& checkpoint_dir, GPT& model, AdamW* optimizer);

// What a user names with --resume or --checkpoint: a checkpoint directory (returned
// as it is once it verifies; throws otherwise), or a run directory, whose newest
// checkpoint that verifies is returned, each newer one that does not (a step_<N>
// directory without state.json too) being logged as a warning with the reason.
// nullopt for a run directory without step_<N> directories; throws when there are
// some but none verifies (naming the newest and why, with a hint: training must not
// start over them), `path` does not exist or is not a directory, or it is no run
// directory but an incomplete checkpoint (a .safetensors file without state.json) or
// a checkpoints/ directory: taking those for a run without checkpoints would start
// training from scratch.
std::optional<std::string> find_usable_checkpoint(const std::string& path);

// Removes what processes that died while saving left in run_dir/checkpoints (partial
// directories; a checkpoint moved aside to be replaced is put back if its new version
// never arrived). For the process that holds the run directory's lock, before it
// saves: every partial directory is then a dead process's. A save does it too.
void remove_checkpoint_leftovers(const std::string& run_dir);

// Writes the serial-layout checkpoint (model.safetensors, optimizer.safetensors) of
// the checkpoint `source` (any layout; verified first) into the new directory
// `destination`, with the same state except the layout, which becomes serial with
// the source's data-parallel size. What `train merge-checkpoint` does: the result
// loads into transformers and `train generate`, and resumes like the source. Throws
// dufu::Error when the source does not verify or the destination exists; a failure
// leaves no destination behind.
void merge_checkpoint(const std::string& source, const std::string& destination);

}  // namespace dufu::trainer
