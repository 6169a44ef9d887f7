// A HuggingFace model directory as a dufu checkpoint, what `train import-hf` writes:
// the inverse of export_hf (hf_export.h), so that `train` fine-tunes (init.from) or
// resumes from a model trained elsewhere.
//
// The directory holds config.json and the weights as model.safetensors, or sharded as
// model.safetensors.index.json with the files its weight_map names. The architecture
// comes from config.json's "architectures" (or "model_type"); each one dufu reads has
// its own entry, which checks the config, gives the dufu model shape and maps the
// tensors: GPT2LMHeadModel as model.arch = gpt2; LlamaForCausalLM (and
// MistralForCausalLM, the same tensors) as model.arch = llama, GQA, untied or tied
// head (hf_import_llama.h lists what it refuses: rope_scaling, biases, active sliding
// windows, ...); Qwen2ForCausalLM is refused (biases on q, k and v). Every key dufu
// cannot honour exactly is refused in one line naming it, as is a missing or unexpected tensor, a tensor of the wrong shape and a dtype
// other than F32, BF16 and F16 (BF16 and F16 widen to fp32 exactly).
//
// The checkpoint is written directly in the chosen (tp, pp) layout, through the same
// piece writers a run's checkpoints use (checkpoint.h describes the files): step 0,
// AdamW's moments zero, the data position at the start. The tokenizer files of the
// directory (tokenizer.model, else tokenizer.json, else vocab.json with merges.txt) go
// into the checkpoint's tokenizer/ as a run's do, unless told to leave them out.
// Written as <destination>.partial-<pid>/ and renamed into place, like a merged
// checkpoint: a failure leaves nothing under the destination's name.
#pragma once

#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

struct HfImportOptions {
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  std::vector<int> pipeline_layers;  // layers per stage; empty = an even split
  int vocab_multiple = GPTConfig{}.vocab_multiple;
  bool with_tokenizer = true;
};

struct HfImport {
  std::string checkpoint;     // the written checkpoint directory (absolute)
  std::string architecture;   // e.g. "GPT2LMHeadModel", "LlamaForCausalLM"
  GPTConfig model;
  CheckpointLayout layout;
  std::vector<std::string> weight_files;  // the .safetensors files read
  std::string tokenizer;                  // the tokenizer file copied; empty for none
};

// Throws dufu::Error (one line, naming the key, tensor or file) for an unsupported
// architecture or config, a bad tensor, a layout that does not fit the model, or a
// destination that exists.
HfImport import_hf(const std::string& hf_dir, const std::string& destination, const HfImportOptions& options);

}  // namespace dufu::trainer
