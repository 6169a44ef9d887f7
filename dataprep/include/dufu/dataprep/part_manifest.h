// The manifest of one part of a divided preprocess job (`--shard K/N`): what the part
// covers (its pieces of the inputs), what it was made with (the division's inputs,
// the options that change the output, the tokenizer's file digests) and what it holds
// (counts, the sizes of its files and the SHA-256 of its .idx). It sits beside the
// part as PREFIX.manifest, written after the part's pair. `dataprep merge` reads the
// manifests to refuse missing, repeated or mismatched parts before writing anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/index.h"
#include "dufu/dataprep/preprocess_plan.h"
#include "dufu/dataprep/tokenizer_record.h"  // sha256_of_file

namespace dufu::dataprep {

struct PartManifest {
  int part = 0;                  // K, 0-based
  int parts = 1;                 // N
  std::string key;               // the JSON key this output holds
  std::string inputs_sha256;     // of PreprocessPlan::inputs_text(): the inputs and the division
  std::string options;           // the options that change the output, canonical text
  std::string tokenizer;         // the tokenizer file(s) as given
  std::string tokenizer_sha256;  // of their contents (model, merges, pattern)
  std::string job_sha256;        // of all of the above but part and key: one per job
  IndexLayout layout = IndexLayout::kMMIDIDX;
  DType dtype = DType::kUInt16;
  std::vector<InputRange> covers;
  std::uint64_t sequences = 0, documents = 0, tokens = 0;
  std::uint64_t bin_bytes = 0, idx_bytes = 0;
  std::string idx_sha256;
  // Of the part's run, for merge's summary.
  std::uint64_t records = 0, empty_skipped = 0, bad_skipped = 0, input_bytes = 0, text_bytes = 0;
  std::vector<std::string> first_errors;
};

std::string manifest_path(const std::string& part_prefix);  // PREFIX.manifest
// PREFIX.part-K-of-N: where `--shard K/N` writes the part of output prefix PREFIX.
std::string part_prefix(const std::string& output_prefix, int part, int parts);

// The job_sha256 of a manifest's inputs, options, tokenizer and part count.
std::string job_sha256_of(const PartManifest& manifest);

// Written atomically (AtomicFile). Throws dufu::Error.
void write_part_manifest(const std::string& part_prefix, const PartManifest& manifest);
// Throws naming the file when it is missing, unreadable or not a manifest, or when
// its job_sha256 is not that of its own fields or its name (PREFIX.part-K-of-N) gives
// another part or part count: a manifest edited by hand to claim fewer parts would let
// merge publish a shard that lacks the others' documents.
PartManifest read_part_manifest(const std::string& part_prefix);
bool has_part_manifest(const std::string& part_prefix);

// Checks that `prefixes` (with their manifests) are every part of one job, each once,
// and that each part's files are the ones its manifest describes. Returns the prefixes
// ordered by part. Throws naming the missing part, the repeated one (with both
// prefixes), or the two parts that differ and in what (tokenizer, options, inputs, key).
std::vector<std::string> check_job_parts(const std::vector<std::string>& prefixes,
                                         const std::vector<PartManifest>& manifests);

}  // namespace dufu::dataprep
