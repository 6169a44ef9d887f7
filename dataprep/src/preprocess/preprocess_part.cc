// `dataprep preprocess --shard K/N`: one part of a divided job, written with its
// manifest.
#include "dufu/dataprep/preprocess_part.h"

#include <unistd.h>

#include <charconv>
#include <chrono>

#include "dufu/common/digest.h"
#include "dufu/common/json_writer.h"
#include "dufu/dataprep/part_join.h"
#include "dufu/dataprep/part_manifest.h"
#include "dufu/dataprep/preprocess_plan.h"
#include "preprocess_pipeline.h"
#include "preprocess_sidecar.h"

namespace dufu::dataprep {
namespace {

// What makes two parts' outputs belong together, besides the inputs: every option
// that changes the bytes written (not --workers, --batch-bytes or --on-error).
std::string options_text(const PreprocessOptions& options, const PreprocessSetup& setup) {
  std::string keys;
  for (const auto& key : options.reader.json_keys) {
    if (!keys.empty()) keys += ',';
    keys += quote_json_string(key);
  }
  return str_cat("keys=", keys, " layout=", layout_name(output_layout(options)), " dtype=", dtype_name(setup.dtype),
                 " eod=", setup.eod ? std::to_string(*setup.eod) : "none",
                 " txt_document=", options.reader.txt_document == TxtDocument::kFile ? "file" : "line",
                 " max_document_bytes=", options.reader.max_document_bytes);
}

}  // namespace

std::vector<AgreedSetting> preprocess_job_settings(const PreprocessOptions& options, const PreprocessSetup& setup) {
  std::string inputs;
  for (const std::string& input : setup.inputs) inputs += (inputs.empty() ? "" : " ") + input;
  std::string keys;
  for (const std::string& key : options.reader.json_keys) keys += (keys.empty() ? "" : " ") + key;
  std::vector<AgreedSetting> settings = {
      {"`inputs` (expanded)", inputs, ""},
      {"`output_prefix`", options.output_prefix, ""},
      {"the SHA-256 of `tokenizer_model`", setup.tokenizer_record.model.sha256, options.tokenizer.model}};
  if (setup.tokenizer_record.merges) {
    settings.push_back(
        {"the SHA-256 of `tokenizer_merges`", setup.tokenizer_record.merges->sha256, options.tokenizer.merges});
  }
  const std::vector<AgreedSetting> choices = {
      {"`tokenizer_pattern`", options.tokenizer.pattern, ""},
      {"`json_keys`", keys, ""},
      {"`impl`", std::string(impl_name(options.impl)), ""},
      {"`layout`", std::string(layout_name(output_layout(options))), ""},
      {"`dtype`", std::string(dtype_name(setup.dtype)), options.dtype ? "" : "from the vocabulary size"},
      {"`append_eod`", options.append_eod ? "given" : "not given", ""},
      {"`eod_id`", setup.eod ? std::to_string(*setup.eod) : "none", ""},
      {"`txt_document`", options.reader.txt_document == TxtDocument::kFile ? "file" : "line", ""},
      {"`stdin_format`", options.reader.stdin_format == InputFormat::kTxt ? "txt" : "jsonl", ""},
      {"`max_document_bytes`", std::to_string(options.reader.max_document_bytes), ""},
      {"`on_error`", options.reader.skip_bad_records ? "skip" : "fail", ""}};
  settings.insert(settings.end(), choices.begin(), choices.end());
  return settings;
}

ShardSpec parse_shard(std::string_view text) {
  ShardSpec shard;
  const auto slash = text.find('/');
  const auto number = [](std::string_view digits, int* value) {
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), *value);
    return !digits.empty() && error == std::errc() && end == digits.data() + digits.size();
  };
  if (slash == std::string_view::npos || !number(text.substr(0, slash), &shard.part) ||
      !number(text.substr(slash + 1), &shard.parts) || shard.parts < 1 || shard.part < 0 || shard.part >= shard.parts) {
    DUFU_FAIL("`shard` '", text, "' is not K/N with 0 <= K < N (part K of N, counted from 0)");
  }
  return shard;
}

PreprocessStats preprocess_part(const PreprocessOptions& options, ShardSpec shard, Progress* progress) {
  const auto start = std::chrono::steady_clock::now();
  check_joinable_layout(output_layout(options));
  const PreprocessSetup setup = set_up_preprocess(options);
  const PreprocessPlan plan = divide_inputs(describe_inputs(setup.inputs, options.reader, shard.parts), shard.parts);
  PreprocessStats stats;
  stats.dtype = setup.dtype;
  for (const auto& prefix : setup.output_prefixes) {
    stats.output_prefixes.push_back(part_prefix(prefix, shard.part, shard.parts));
    refuse_output_that_is_an_input(stats.output_prefixes.back(), setup.inputs);
  }

  PartManifest manifest;
  manifest.part = shard.part;
  manifest.parts = shard.parts;
  manifest.inputs_sha256 = sha256_hex(plan.inputs_text());
  manifest.options = options_text(options, setup);
  manifest.tokenizer = options.tokenizer.model;
  if (!options.tokenizer.merges.empty()) manifest.tokenizer += " + " + options.tokenizer.merges;
  manifest.tokenizer_sha256 = setup.tokenizer_record.identity_sha256();
  manifest.job_sha256 = job_sha256_of(manifest);
  manifest.layout = output_layout(options);
  manifest.dtype = setup.dtype;
  manifest.covers = plan.part_inputs(shard.part);

  DocumentReader reader(manifest.covers, options.reader);
  if (progress) progress->set_total(reader.total_input_bytes());
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const auto& prefix : stats.output_prefixes) {
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, manifest.layout, stats.dtype));
    // A manifest left by an earlier run of this part must not describe the new pair
    // even for a moment: without one, merge refuses the part until it is complete.
    ::unlink(manifest_path(prefix).c_str());
  }
  run_pipeline(options, setup, reader, writers, progress, &stats);
  manifest.records = stats.records;
  manifest.empty_skipped = stats.empty_skipped;
  manifest.bad_skipped = stats.bad_skipped;
  manifest.input_bytes = stats.input_bytes;
  manifest.text_bytes = stats.text_bytes;
  manifest.first_errors = stats.first_errors;
  for (std::size_t key = 0; key < writers.size(); ++key) {
    IndexedDatasetWriter& writer = *writers[key];
    const std::string& prefix = stats.output_prefixes[key];
    manifest.key = options.reader.json_keys[key];
    manifest.sequences = writer.num_sequences();
    manifest.documents = writer.num_documents();
    manifest.tokens = writer.tokens();
    manifest.bin_bytes = writer.bin_bytes();
    const std::uint64_t bytes = writer.commit();
    publish_shard_sidecar(prefix, preprocess_sidecar(options, setup, key));
    stats.output_bytes += bytes;
    manifest.idx_bytes = bytes - manifest.bin_bytes;
    manifest.idx_sha256 = sha256_of_file(idx_path(prefix));
    write_part_manifest(prefix, manifest);
  }
  if (progress) progress->finish();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace dufu::dataprep
