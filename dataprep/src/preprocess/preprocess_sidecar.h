// The sidecar (shard_sidecar.h) of one output of a preprocess job.
#pragma once

#include <cstddef>

#include "dufu/dataprep/shard_sidecar.h"
#include "preprocess_pipeline.h"

namespace dufu::dataprep {

// The tokenizer of `options`, recorded (its files hashed) once per job.
TokenizerRecord record_preprocess_tokenizer(const PreprocessOptions& options);

// What the output of JSON key number `key` holds; the sizes are filled in when it is
// published.
ShardSidecar preprocess_sidecar(const PreprocessOptions& options, const PreprocessSetup& setup,
                                const TokenizerRecord& tokenizer, std::size_t key);

}  // namespace dufu::dataprep
