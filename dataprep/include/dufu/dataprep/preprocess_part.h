// One part of a divided `dataprep preprocess` job (`--shard K/N`), written with its
// manifest; distributed_preprocess.h divides a job among MPI ranks.
#pragma once

#include <string_view>
#include <vector>

#include "dufu/common/rank_agreement.h"
#include "dufu/dataprep/preprocess.h"

namespace dufu::dataprep {

struct ShardSpec {
  int part = 0;   // K, 0-based
  int parts = 1;  // N
};
// "K/N" with 0 <= K < N; throws naming the text otherwise.
ShardSpec parse_shard(std::string_view text);

// Writes part K of the job's N-way division as PREFIX.part-K-of-N (per JSON key, as
// output_prefixes_for names them) and its manifest (part_manifest.h). Stats are the
// part's.
PreprocessStats preprocess_part(const PreprocessOptions& options, ShardSpec shard, Progress* progress);

// Every setting of a job that decides the bytes it writes (not `workers` or
// `batch_bytes`), named as its option, the tokenizer by its files' SHA-256 (hashed
// once per job, by set_up_preprocess), and the expanded input list and output prefix:
// what the ranks of a divided job must agree on.
// PreprocessSetup is preprocess.cc's (src/preprocess/preprocess_pipeline.h): this is
// for distributed_preprocess.cc.
struct PreprocessSetup;
std::vector<AgreedSetting> preprocess_job_settings(const PreprocessOptions& options, const PreprocessSetup& setup);

}  // namespace dufu::dataprep
