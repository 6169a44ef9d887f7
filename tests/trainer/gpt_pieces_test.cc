// The pieces of the model's parameter buffer that tensor and pipeline parallelism
// give each rank (gpt_pieces.h): the pieces of every (tensor rank, stage) of a layout
// tile the serial buffer, and each piece is what the separate tensor-parallel and
// pipeline moves give.
#include "dufu/trainer/model/gpt_pieces.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/gpt_layout.h"
#include "support/expect_error.h"
#include "support/gpt_fixture.h"

namespace dufu::trainer {
namespace {

using dufu::testing::expect_error;

GPTConfig four_layer_config() {
  // vocab_size 100 is padded to 128: 28 padding rows that no piece carries.
  return dufu::testing::small_gpt_config(
      {.n_layer = 4, .n_head = 4, .d_model = 32, .vocab_size = 100, .vocab_multiple = 64, .seq_length = 16});
}

std::size_t layout_size(const std::vector<ParamTensor>& layout) {
  return layout.back().offset + layout.back().size();
}

// The piece of (tensor rank `rank`, `stage`) holds, tensor by tensor, what the
// reference gives: the whole model cut for the rank as shard_gpt_buffer cuts it
// (tensor by tensor, by name), of which the stage's tensors are taken.
void expect_piece_matches_the_shard(const GPTConfig& config, int tp, int rank, const PipelineStage& stage,
                                    std::span<const float> full, const std::vector<float>& piece) {
  const std::vector<ParamTensor> piece_layout = gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage);
  const std::vector<ParamTensor> local_layout = gpt_parameter_layout(config, tp);
  std::vector<float> local(layout_size(local_layout));
  shard_gpt_buffer(config, tp, rank, full, local);
  for (const ParamTensor& tensor : piece_layout) {
    const auto match = std::find_if(local_layout.begin(), local_layout.end(),
                                    [&](const ParamTensor& t) { return t.name == tensor.name; });
    ASSERT_NE(match, local_layout.end());
    ASSERT_EQ(match->size(), tensor.size());
    EXPECT_TRUE(std::equal(piece.begin() + static_cast<std::ptrdiff_t>(tensor.offset),
                           piece.begin() + static_cast<std::ptrdiff_t>(tensor.offset + tensor.size()),
                           local.begin() + static_cast<std::ptrdiff_t>(match->offset)))
        << tensor.name << " of rank " << rank;
  }
}

// Every piece of a layout of `tp` tensor ranks and the stages of `split`: each matches
// the reference, under tp 1 it is the stage's part of the serial buffer, and together
// they put the serial buffer back.
void expect_pieces_tile_the_serial_buffer(const GPTConfig& config, int tp, const std::vector<int>& split,
                                          const std::vector<float>& full) {
  std::vector<float> assembled(full.size(), 0.0f);
  for (int stage_index = 0; stage_index < static_cast<int>(split.size()); ++stage_index) {
    const PipelineStage stage = pipeline_stage(split, stage_index);
    std::vector<float> staged(layout_size(gpt_stage_layout(config, gpt_parameter_layout(config), stage)));
    stage_gpt_buffer(config, stage, full, staged);
    const std::size_t piece_size = layout_size(gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage));
    for (int rank = 0; rank < tp; ++rank) {
      std::vector<float> piece(piece_size, -7.0f);
      shard_gpt_piece(config, tp, rank, stage, full, piece);
      expect_piece_matches_the_shard(config, tp, rank, stage, full, piece);
      if (tp == 1) {
        EXPECT_EQ(piece, staged);
      }
      unshard_gpt_piece(config, tp, rank, stage, piece, assembled);
    }
  }
  EXPECT_EQ(assembled, full);
}

TEST(GptPieces, TileTheSerialLayoutLikeShardAndStage) {
  const GPTConfig config = four_layer_config();
  const std::size_t full_size = GPT(config).num_parameters();
  std::vector<float> full = dufu::testing::random_floats(full_size, 5, -1.0f, 1.0f);
  // wte's padding rows are not carried by the pieces: the serial buffer holds 0 there.
  const ParamTensor wte = gpt_parameter_layout(config).front();
  std::fill(full.begin() + static_cast<std::ptrdiff_t>(config.vocab_size * config.d_model),
            full.begin() + static_cast<std::ptrdiff_t>(wte.size()), 0.0f);
  for (const int tp : {1, 2, 4}) {
    for (const std::vector<int>& split : {std::vector<int>{4}, std::vector<int>{1, 3}, std::vector<int>{2, 1, 1}}) {
      SCOPED_TRACE(str_cat("tp ", tp, ", ", split.size(), " stages starting with ", split.front(), " layers"));
      expect_pieces_tile_the_serial_buffer(config, tp, split, full);
    }
  }
  std::vector<float> wrong(3);
  expect_error([&] { shard_gpt_piece(config, 2, 0, PipelineStage{}, full, wrong); },
               {"shard_gpt_piece", "floats"});
  expect_error([&] { unshard_gpt_piece(config, 2, 2, PipelineStage{}, wrong, full); },
               {"unshard_gpt_piece", "tensor rank 2 is not in [0, 2)"});
}

}  // namespace
}  // namespace dufu::trainer
