// model.init_from at another model.seq_length than the checkpoint's: fine-tuning at
// another context length. Every other knob that defines the model must be the
// checkpoint's (trainer_setup.cc's refuse_model_change); the length only sizes GPT-2's
// learned position table (wpe, [seq_length, C]), and RoPE (model.arch = llama) has none.
#pragma once

#include <string>
#include <vector>

#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

// Throws dufu::Error in one line naming model.seq_length and both values when `run`
// is GPT-2 and longer than `saved`: its positions past the checkpoint's table were
// never trained, and making them up would be a different model.
void refuse_positions_beyond_checkpoint(const GPTConfig& saved, const GPTConfig& run, const std::string& checkpoint);

// The serial (full-layout) weights of `run` from the checkpoint of `saved`, which
// differ at most in seq_length: every tensor as saved but wpe, whose first
// run.seq_length rows are kept. Assembled on the host from a checkpoint of any layout.
std::vector<float> weights_at_seq_length(const std::string& checkpoint, const GPTConfig& saved, const GPTConfig& run);

}  // namespace dufu::trainer
