// Checkpoints of a parallel run (the files are described in checkpoint.h): every rank
// writes the files of its own model piece and optimizer state into one checkpoint
// directory, so no rank gathers more than it holds; and every rank loads its piece
// back, from its own files when the checkpoint's layout gives it the same piece, or
// cut from the assembled serial model when the layout changed (reshard on load).
#pragma once

#include <string>

#include "dufu/common/communicator.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"

namespace dufu::trainer {

// Where a rank sits in the run's layout (Topology's coordinates).
struct RankPlace {
  int tp_rank = 0;
  int pp_rank = 0;
  int dp_rank = 0;
};

// Collective over `world` (every rank of the run, each with its model piece and
// optimizer): writes the checkpoint of `state.step`, whose `state.layout` must be the
// run's. The first rank of each piece's data-parallel group writes the model piece
// and, unless the optimizer state is sharded, its moments; under ZeRO-1 every rank
// writes its shard. World rank 0 then writes state.json listing every file with its
// size and SHA-256, renames the directory into place and removes old checkpoints as
// save_checkpoint does. Returns the checkpoint's directory on every rank. If any rank
// fails to write (its piece holding a NaN or an infinity counts as failing), every
// rank throws dufu::Error (the failing ones with their reason,
// the others naming them) and no checkpoint appears; the run directory must be on a
// file system every rank sees.
std::string save_parallel_checkpoint(const std::string& run_dir, Communicator& world, const RankPlace& place,
                                     const GPT& model, const DataParallelOptimizer& optimizer,
                                     const TrainingState& state, int keep_last);

// Loads this rank's piece of the verified checkpoint `checkpoint_dir` (whose state.json
// says `saved`) into `model` and `optimizer`: from the rank's own files when the
// checkpoint holds the same piece (the moments too when the ZeRO-1 shards are the
// same, so resuming a layout is exact), otherwise from the serial model assembled from
// all pieces (which this rank then holds for a moment). No communication. Throws
// dufu::Error like load_checkpoint; on an error the model may be partly loaded.
void load_parallel_checkpoint(const std::string& checkpoint_dir, const TrainingState& saved, const RankPlace& place,
                              int data_parallel_size, GPT& model, DataParallelOptimizer& optimizer);

}  // namespace dufu::trainer
