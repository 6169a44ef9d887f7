// The offline moves between the serial layout and the pieces of tensor-parallel ranks
// and pipeline stages.
#include "dufu/trainer/model/gpt_pieces.h"

#include <algorithm>
#include <vector>

#include "dufu/common/error.h"
#include "gpt_tensor_runs.h"

namespace dufu::trainer {

using detail::check_buffer_sizes;
using detail::for_each_run;
using detail::real_rows;

namespace {
// Calls copy(staged tensor, full tensor) for every tensor the stage holds.
template <typename Copy>
void for_each_staged(const GPTConfig& config, const PipelineStage& stage, std::size_t full_size,
                     std::size_t staged_size, const char* operation, Copy&& copy) {
  const std::vector<ParamTensor> full_layout = gpt_parameter_layout(config);
  const std::vector<ParamTensor> staged_layout = gpt_stage_layout(config, full_layout, stage);
  check_buffer_sizes(operation, full_size, gpt_layout_size(full_layout), staged_size, gpt_layout_size(staged_layout));
  std::size_t j = 0;
  for (const ParamTensor& tensor : staged_layout) {
    while (full_layout[j].name != tensor.name) ++j;
    copy(tensor, full_layout[j]);
  }
}
}  // namespace

void stage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> full,
                      std::span<float> staged) {
  for_each_staged(config, stage, full.size(), staged.size(), "stage_gpt_buffer",
                  [&](const ParamTensor& mine, const ParamTensor& whole) {
                    std::copy_n(full.data() + whole.offset, whole.size(), staged.data() + mine.offset);
                  });
}

void unstage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> staged,
                        std::span<float> full) {
  for_each_staged(config, stage, full.size(), staged.size(), "unstage_gpt_buffer",
                  [&](const ParamTensor& mine, const ParamTensor& whole) {
                    std::copy_n(staged.data() + mine.offset, mine.size(), full.data() + whole.offset);
                  });
}

namespace {
// Calls copy(piece offset, full offset, count) for every run of consecutive floats the
// piece of (tp_rank, stage) shares with the full serial layout, after checking both
// buffers' sizes.
template <typename Copy>
void for_each_piece_run(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage, std::size_t full_size,
                        std::size_t piece_size, const char* operation, Copy&& copy) {
  if (tp_rank < 0 || tp_rank >= tp) DUFU_FAIL(operation, ": tensor rank ", tp_rank, " is not in [0, ", tp, ")");
  const std::vector<ParamTensor> full_layout = gpt_parameter_layout(config);
  const std::vector<ParamTensor> piece_layout = gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage);
  check_buffer_sizes(operation, full_size, gpt_layout_size(full_layout), piece_size, gpt_layout_size(piece_layout));
  std::size_t j = 0;
  for (const ParamTensor& piece : piece_layout) {
    while (full_layout[j].name != piece.name) ++j;
    const ParamTensor& whole = full_layout[j];
    for_each_run(piece, whole, tp, tp_rank, real_rows(whole, config),
                 [&](std::size_t piece_offset, std::size_t full_offset, std::size_t count) {
                   copy(piece.offset + piece_offset, whole.offset + full_offset, count);
                 });
  }
}

// The moves between the serial layout and a piece, with `operation` naming the
// public function in messages.
void shard_piece(const char* operation, const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                 std::span<const float> full, std::span<float> piece) {
  std::fill(piece.begin(), piece.end(), 0.0f);  // wte's padding rows
  for_each_piece_run(config, tp, tp_rank, stage, full.size(), piece.size(), operation,
                     [&](std::size_t piece_offset, std::size_t full_offset, std::size_t count) {
                       std::copy_n(full.data() + full_offset, count, piece.data() + piece_offset);
                     });
}

void unshard_piece(const char* operation, const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                   std::span<const float> piece, std::span<float> full) {
  for_each_piece_run(config, tp, tp_rank, stage, full.size(), piece.size(), operation,
                     [&](std::size_t piece_offset, std::size_t full_offset, std::size_t count) {
                       std::copy_n(piece.data() + piece_offset, count, full.data() + full_offset);
                     });
}
}  // namespace

void shard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> full, std::span<float> local) {
  shard_piece("shard_gpt_buffer", config, tp, rank, PipelineStage{}, full, local);
}

void unshard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> local,
                        std::span<float> full) {
  unshard_piece("unshard_gpt_buffer", config, tp, rank, PipelineStage{}, local, full);
}

void shard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                     std::span<const float> full, std::span<float> piece) {
  shard_piece("shard_gpt_piece", config, tp, tp_rank, stage, full, piece);
}

void unshard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                       std::span<const float> piece, std::span<float> full) {
  unshard_piece("unshard_gpt_piece", config, tp, tp_rank, stage, piece, full);
}

}  // namespace dufu::trainer
