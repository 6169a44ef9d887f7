// How the tensors of a tensor-parallel piece map onto the serial tensors, run by run
// of consecutive floats: the one loop behind the offline piece moves (gpt_pieces.cc)
// and the model's own gather and shard (gpt.cc). Private to the trainer library.
#pragma once

#include <algorithm>
#include <cstddef>

#include "dufu/common/error.h"
#include "dufu/trainer/model/gpt_layout.h"

namespace dufu::trainer::detail {

// Calls copy(local_offset, full_offset, count) for every run of consecutive floats of
// rank `rank`'s piece `local` of the full tensor `full` (offsets from each tensor's
// start), as ParamTensor::split describes. Full rows from real_rows on have no
// counterpart (wte's padding, whose extent depends on tp) and are left out.
template <typename Copy>
void for_each_run(const ParamTensor& local, const ParamTensor& full, int tp, int rank, std::size_t real_rows,
                  Copy&& copy) {
  DUFU_CHECK(local.name == full.name && local.shape.size() == full.shape.size(), local.name, " vs ", full.name);
  const std::size_t pieces = static_cast<std::size_t>(local.split_blocks);
  const std::size_t ranks = static_cast<std::size_t>(tp);
  const std::size_t r = static_cast<std::size_t>(rank);
  switch (local.split) {
    case TensorSplit::kReplicated:
      DUFU_CHECK(local.size() == full.size(), local.name);
      copy(std::size_t{0}, std::size_t{0}, local.size());
      return;
    case TensorSplit::kRows: {
      const std::size_t width = local.shape.size() == 2 ? local.shape[1] : 1;
      const std::size_t piece_rows = local.shape[0] / pieces;
      DUFU_CHECK(piece_rows * pieces == local.shape[0] && real_rows <= full.shape[0] &&
                     real_rows <= piece_rows * pieces * ranks,
                 local.name);
      for (std::size_t block = 0; block < pieces; ++block) {
        const std::size_t first = (block * ranks + r) * piece_rows;  // full row of the piece's row 0
        const std::size_t rows = first >= real_rows ? 0 : std::min(piece_rows, real_rows - first);
        if (rows > 0) copy(block * piece_rows * width, first * width, rows * width);
      }
      return;
    }
    case TensorSplit::kColumns: {
      const std::size_t rows = local.shape[0];
      const std::size_t local_width = local.shape[1];
      const std::size_t full_width = full.shape[1];
      const std::size_t piece_columns = local_width / pieces;
      DUFU_CHECK(piece_columns * pieces * ranks == full_width && rows == full.shape[0], local.name);
      for (std::size_t row = 0; row < rows; ++row) {
        for (std::size_t block = 0; block < pieces; ++block) {
          copy(row * local_width + block * piece_columns, row * full_width + (block * ranks + r) * piece_columns,
               piece_columns);
        }
      }
      return;
    }
  }
}

// The rows of `full` that have a counterpart in the pieces: all, except wte's
// padding rows (and the real ones must fit the pieces of every tp).
inline std::size_t real_rows(const ParamTensor& full, const GPTConfig& config) {
  const bool vocabulary_rows = full.name == "wte.weight" || full.name == "lm_head.weight";
  return vocabulary_rows ? static_cast<std::size_t>(config.vocab_size) : full.shape[0];
}

inline void check_buffer_sizes(const char* operation, std::size_t full_got, std::size_t full_want,
                               std::size_t local_got, std::size_t local_want) {
  if (full_got != full_want || local_got != local_want) {
    DUFU_FAIL(operation, ": buffers of ", full_got, " (full) and ", local_got, " (this rank's piece) floats, the ",
              "layouts need ", full_want, " and ", local_want);
  }
}

}  // namespace dufu::trainer::detail
