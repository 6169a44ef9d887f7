// Moving buffers between the serial model's layout and the pieces that tensor-
// parallel ranks and pipeline stages hold (gpt_layout.h says how each tensor is cut).
// No communication: checkpoint tools merge and reshard offline with these, and the
// model uses them to initialise its piece the same way for every layout.
#pragma once

#include <span>

#include "dufu/trainer/model/gpt_layout.h"

namespace dufu::trainer {

// Moving between the full (serial) layout, gpt_parameter_layout(config), and the
// piece of tensor-parallel rank `rank` of `tp`, gpt_parameter_layout(config, tp); no
// communication, so checkpoint tools can merge or reshard offline. Work for any
// buffer in those layouts: parameters, gradients, optimizer moments.
// shard_gpt_buffer writes all of `local` (wte's padding rows, beyond vocab_size, get
// 0); unshard_gpt_buffer writes the entries of `full` that rank's piece holds (the
// replicated tensors whole; wte's padding rows never), so calling it for every rank
// assembles the full buffer. Throw dufu::Error for buffers of the wrong size.
void shard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> full, std::span<float> local);
void unshard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> local,
                        std::span<float> full);

// Between the full serial layout and a stage's part of it (gpt_stage_layout of
// gpt_parameter_layout(config)); no communication. unstage_gpt_buffer writes the
// stage's tensors into `full` and leaves the rest; wte goes in from both the first and
// the last stage, so writing every stage but the last's copy assembles a model.
void stage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> full,
                      std::span<float> staged);
void unstage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> staged,
                        std::span<float> full);

// Both moves at once, between the full serial layout and the piece that tensor-
// parallel rank `tp_rank` of `tp` holds on pipeline stage `stage`: the layout of
// GPT(config, <group of tp>, stage).parameter_tensors(), i.e. gpt_stage_layout(config,
// gpt_parameter_layout(config, tp), stage). No communication, so sharded checkpoints
// merge and reshard offline. shard_gpt_piece writes all of `piece` (wte's padding
// rows 0); unshard_gpt_piece writes the entries of `full` the piece holds, so calling
// it for every (tp rank, stage) assembles the full buffer. Throw dufu::Error for
// buffers of the wrong size.
void shard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                     std::span<const float> full, std::span<float> piece);
void unshard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                       std::span<const float> piece, std::span<float> full);

}  // namespace dufu::trainer
