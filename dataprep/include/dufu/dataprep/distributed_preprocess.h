// `dataprep preprocess` divided among processes, with the output of the undivided job:
// under mpirun or srun (one part per rank, joined into the final shard by the ranks
// together), or one part per `--shard K/N` run (a job-array task, another machine),
// joined later by `dataprep merge` (preprocess_part.h). The division is preprocess_plan.h's, the parts are
// ordinary shards written by the same pipeline, and the join is part_join.h's.
//
// Under MPI every rank writes its part beside the output (hidden names), then copies
// it to its offset in the output's temporaries, which rank 0 renames as a pair. The
// ranks meet every 200 ms (a small all-reduce of progress counters and failure flags),
// so a bad record on one rank stops all of them within about that, each removing its
// files; rank 0 then reports that rank's message. The output directory must be one
// file system that all ranks see; a rank that does not see a file rank 0 created there
// stops the job at start.
#pragma once

#include <optional>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/rank_agreement.h"
#include "dufu/dataprep/preprocess.h"
#include "dufu/dataprep/preprocess_part.h"

namespace dufu::dataprep {

// A divided job that stopped because some rank failed, or because the ranks were not
// started alike, throws RanksStopped (rank_agreement.h) on every rank, after every
// rank removed its files.

// Every rank of `world` calls it; the job's output is the undivided job's. Stats are
// the whole job's (every rank gets them); `progress` is used on rank 0 only.
PreprocessStats preprocess_distributed(const PreprocessOptions& options, Communicator& world, Progress* progress);

// What the tool runs: preprocess_part with a shard, preprocess_distributed under a
// launcher of several processes, else preprocess().
PreprocessStats run_preprocess(const PreprocessOptions& options, const std::optional<ShardSpec>& shard,
                               Progress* progress);

}  // namespace dufu::dataprep
