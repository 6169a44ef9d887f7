// Checkpoints of a training run, under <run_dir>/checkpoints/step_<8-digit step>/.
//
// A single-process run (and a data-parallel one without ZeRO, whose ranks hold the
// same weights and moments) writes the serial layout:
//
//   model.safetensors      the weights under HuggingFace GPT-2 names ("wte.weight",
//                          "h.0.attn.c_attn.weight", ...), loadable by transformers'
//                          GPT2Model / GPT2LMHeadModel: the four Conv1D weights of each
//                          block transposed to HF's [in, out], wte cut to the real
//                          vocabulary [vocab_size, C] (the padding rows are always 0);
//                          metadata "format": "pt" and the model shape ("n_layer",
//                          "n_head", "d_model", "vocab_size", "vocab_multiple",
//                          "seq_length", as decimal strings). model.arch = llama: under
//                          LlamaForCausalLM's names ("model.embed_tokens.weight",
//                          "model.layers.0.self_attn.q_proj.weight", ...,
//                          "model.norm.weight", "lm_head.weight" when untied), all
//                          [out, in] as dufu's, embed_tokens and lm_head cut to
//                          [vocab_size, C], loadable by LlamaForCausalLM; the metadata
//                          adds "arch" and the Llama knobs.
//   optimizer.safetensors  AdamW's moments in dufu's own layout, as
//                          "exp_avg.<name>" and "exp_avg_sq.<name>" (padded, untransposed,
//                          so loading them back is a copy), and the step count as the
//                          I64 scalar "step"; metadata "format": "dufu-adamw".
//
// A tensor- or pipeline-parallel run writes one file per model piece instead (as
// Megatron-LM does), each written by the rank that holds it, so no rank ever holds
// more than its own piece:
//
//   model[-tp<TT>][-pp<PPP>].safetensors      the piece of tensor rank TT on stage PPP
//                          (the parts whose size is 1 left out), dufu's layout: the
//                          serial names, each tensor's piece in the piece's shape
//                          (gpt_stage_layout of gpt_parameter_layout(config, tp));
//                          metadata "format": "dufu-piece", the model shape and the
//                          piece ("tensor_parallel_rank", "tensor_parallel_size",
//                          "pipeline_stage", "pipeline_parallel_size", "first_layer",
//                          "num_layers").
//   optimizer[-tp<TT>][-pp<PPP>].safetensors  the piece's moments as above, or, under
//                          ZeRO-1, optimizer[-tp<TT>][-pp<PPP>]-dp<DDD>.safetensors per
//                          data-parallel rank: its shard of the piece's flattened moments
//                          as 1-D "exp_avg" and "exp_avg_sq" plus "step"; metadata
//                          "format": "dufu-adamw-shard", "shard_begin",
//                          "piece_parameters".
//
// And in every checkpoint:
//
//   state.json             written last: format name and version, step, consumed
//                          samples and tokens, skipped steps, the train loader's state,
//                          the seeds, the model shape, the layout that wrote it (tensor,
//                          pipeline and data-parallel sizes, layers per stage, whether
//                          the optimizer state is sharded), the effective configuration
//                          (TOML text), the byte size and SHA-256 of every
//                          .safetensors file, so truncation or corruption is caught, and
//                          the identity of every shard of the training blend
//                          ("shards": sizes and digests, shard_identity.h), compared on
//                          resume; older checkpoints without it still read.
//   config.toml            the same effective configuration, for people.
//
// Any checkpoint loads into any layout (load_checkpoint assembles the serial model
// from the pieces; parallel_checkpoint.h reads a rank's own files when the layout is
// the same), and merge_checkpoint writes the serial layout of a sharded one.
//
// A checkpoint (a merged one too) is written into <name>.partial-<pid>/ and renamed
// into place once every file is synced, so a kill at any moment leaves either the
// complete checkpoint or none (plus a partial directory that the next run removes).
// One process saves into a run directory at a time (under MPI, the ranks of one job:
// all on a file system they share).
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
