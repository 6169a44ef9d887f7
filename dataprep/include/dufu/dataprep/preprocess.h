// `dataprep preprocess`: documents -> sentencepiece tokens -> indexed shards, with a
// reader thread, N tokenizer workers and an in-order writer, all connected by
// bounded queues so memory stays flat whatever the corpus size. Output bytes do not
// depend on the number of workers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dufu/common/progress.h"
#include "dufu/dataprep/document_reader.h"
#include "dufu/dataprep/dtype.h"
#include "dufu/dataprep/index.h"
#include "dufu/dataprep/tokenizer_model.h"  // TokenizerSpec

namespace dufu::dataprep {

// The most tokenizer threads preprocess starts (each holds about two batches).
inline constexpr int kMaxWorkers = 1024;
// The largest --batch-bytes: batches in flight are 2 x workers + 2 of them.
inline constexpr std::size_t kMaxBatchBytes = std::size_t{1} << 30;

struct PreprocessOptions {
  std::vector<std::string> inputs;  // paths, globs or "-"
  std::string output_prefix;
  TokenizerSpec tokenizer;          // any model Tokenizer::load takes (tokenizer.h), its merges, its pattern
  ReaderOptions reader;
  IndexImpl impl = IndexImpl::kMmap;
  LayoutFamily layout = LayoutFamily::kMegatron;  // with impl, picks the .idx layout
  bool append_eod = false;
  std::optional<int> eod_id;        // default: the tokenizer's own (</s>, <|endoftext|>)
  std::optional<DType> dtype;       // default: Megatron's rule from the vocab size (int32 for fairseq TNTIDX)
  int workers = 0;                  // 0 = all cores; at most kMaxWorkers
  // Documents per work item: large enough to amortize queue traffic, small enough
  // that workers stay balanced.
  std::size_t batch_bytes = 1 << 20;
  // Set from another thread to stop the run at the next batch it writes (the Python
  // package's Ctrl-C): the run then throws dufu::Error and, as on any error, leaves
  // no output and no temporary.
  const std::atomic<bool>* stop = nullptr;
  // Called once from the run's thread after its last batch, before anything is
  // committed: false stops the run there as `stop` does (the Python package makes its
  // last progress call in it, so that the call's exception leaves the old outputs).
  std::function<bool()> approve_commit;
};

struct PreprocessStats {
  std::uint64_t documents = 0;       // documents written (per key, summed)
  std::uint64_t records = 0;         // input records read (lines/objects/files)
  std::uint64_t empty_skipped = 0;   // fields empty after tokenization
  std::uint64_t bad_skipped = 0;     // bad records skipped with --on-error skip
  std::vector<std::string> first_errors;
  std::uint64_t tokens = 0;
  std::uint64_t input_bytes = 0;     // real bytes read (compressed size for .zst/.gz)
  std::uint64_t text_bytes = 0;      // UTF-8 bytes of text tokenized
  std::uint64_t output_bytes = 0;    // .bin + .idx of every output
  double seconds = 0;
  int workers = 0;
  DType dtype = DType::kUInt16;
  std::vector<std::string> output_prefixes;
};

// Megatron's naming: one key writes PREFIX.bin/.idx; several keys write
// PREFIX_{key}_document.bin/.idx each.
std::vector<std::string> output_prefixes_for(const std::string& prefix,
                                             const std::vector<std::string>& json_keys);

// Runs the whole job. Throws dufu::Error on bad input (unless skipping) and then no
// new output exists under the final names (an earlier pair there is left whole).
// Refuses out-of-range options (workers, batch bytes, an eod_id outside the
// vocabulary, a JSON key given twice) and an output that is one of the inputs.
// Messages name an option as `name`, the way these structs and the Python package's
// keyword arguments spell it (`workers`, `json_keys`, `tokenizer_merges`,
// `max_document_bytes`); the dataprep tool prints its flag instead (--workers).
// `progress` may be null; its counters are input bytes, documents and tokens, in
// that order, counted as batches are written: input bytes are those read, scaled by
// the share of the text read that is written, so the percentage (of input bytes) is
// of work done, not of input read ahead.
PreprocessStats preprocess(const PreprocessOptions& options, Progress* progress);

}  // namespace dufu::dataprep
