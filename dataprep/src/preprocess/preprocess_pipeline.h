// The parts of preprocess.cc that divided runs reuse (preprocess_part.cc and
// distributed_preprocess.cc): the checks and tokenizer loading done before any input
// is read, and the pipeline that turns a reader's documents into shard writers'
// documents, in order. preprocess.h is the public face of preprocess.cc, this the rest.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/preprocess.h"
#include "dufu/dataprep/tokenizer.h"
#include "dufu/dataprep/tokenizer_record.h"

namespace dufu::dataprep {

struct PreprocessSetup {
  std::vector<std::string> inputs;  // expanded, in order
  std::vector<std::string> output_prefixes;
  Tokenizer tokenizer;
  // Its files, hashed once per job: the sidecars', the part manifests' and the ranks'
  // agreement's one digest of them.
  TokenizerRecord tokenizer_record;
  std::optional<int> eod;  // appended to every non-empty document when set
  DType dtype;
  int workers;
};

// The .idx layout the options ask for.
IndexLayout output_layout(const PreprocessOptions& options);

// Checks the options (ranges, keys, output prefix, output-as-input), expands the
// inputs, loads the tokenizer and records it. Throws dufu::Error.
PreprocessSetup set_up_preprocess(const PreprocessOptions& options);

// Called by the writing thread between batches, and at least every `interval` while it
// waits for one; throwing from it stops the run (the pipeline rethrows that error).
struct PipelineTick {
  std::chrono::milliseconds interval{250};
  std::function<void()> call;
};

// Reads every document of `reader`, tokenizes with setup.workers threads and adds the
// non-empty ones to `writers` (one per JSON key) in reading order; does not commit.
// Fills documents, records, empty and bad counts, first errors, tokens, input and text
// bytes and workers of `stats`. Progress counters: input bytes, documents, tokens.
void run_pipeline(const PreprocessOptions& options, const PreprocessSetup& setup, DocumentReader& reader,
                  std::vector<std::unique_ptr<IndexedDatasetWriter>>& writers, Progress* progress,
                  PreprocessStats* stats, const PipelineTick* tick = nullptr);

}  // namespace dufu::dataprep
