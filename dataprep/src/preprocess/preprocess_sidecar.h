// The sidecar (shard_sidecar.h) of one output of a preprocess job.
#pragma once

#include <cstddef>

#include "dufu/dataprep/shard_sidecar.h"
#include "preprocess_pipeline.h"

namespace dufu::dataprep {

// What the output of JSON key number `key` holds (the tokenizer: setup's record); the
// sizes are filled in when it is published.
ShardSidecar preprocess_sidecar(const PreprocessOptions& options, const PreprocessSetup& setup, std::size_t key);

}  // namespace dufu::dataprep
