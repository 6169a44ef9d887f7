// `dataprep merge`: concatenates shards into one, keeping every document boundary
// (older merge tools dropped the document indices of all but the first input). The
// parts of a divided preprocess job (each with its manifest) are checked as a set
// first, then joined by part_join.h, the code MPI ranks use, one part after another.
#include "dufu/dataprep/merge.h"

#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/part_join.h"
#include "dufu/dataprep/part_manifest.h"
#include "dufu/dataprep/shard_output.h"
#include "dufu/dataprep/shard_sidecar.h"

namespace dufu::dataprep {
namespace {

MergeStats merge_parts(const std::vector<std::string>& input_prefixes, const std::string& output_prefix,
                       std::optional<IndexLayout> output_layout) {
  std::vector<PartManifest> manifests;
  for (const auto& prefix : input_prefixes) {
    if (!has_part_manifest(prefix)) {
      DUFU_FAIL("'", prefix, "' has no manifest ('", manifest_path(prefix), "') but '", input_prefixes.front(),
                "' is a part of a divided preprocess job: merge the parts of one job only, all of them");
    }
    manifests.push_back(read_part_manifest(prefix));
  }
  const std::vector<std::string> parts = check_job_parts(input_prefixes, manifests);
  const PartManifest& job = manifests.front();
  const IndexLayout layout = output_layout.value_or(job.layout);
  std::vector<PartShape> shapes;
  for (const auto& prefix : parts) shapes.push_back(read_part_shape(prefix, nullptr, nullptr));
  const JoinLayout join(shapes, layout, job.dtype);
  std::optional<ShardSidecar> sidecar = merged_sidecar(parts);

  const ShardOutputLock lock(output_prefix);
  AtomicFile bin(bin_path(output_prefix)), idx(idx_path(output_prefix));
  {
    JoinTarget target(bin.temp_path(), idx.temp_path());
    target.set_sizes(join);
    target.write_header(join);
    for (std::size_t k = 0; k < parts.size(); ++k) target.write_part(join, k, parts[k]);
    target.finish();
  }
  commit_shard_pair(bin, idx, output_prefix);
  publish_shard_sidecar(output_prefix, std::move(sidecar));
  MergeStats stats;
  stats.parts = parts.size();
  stats.sequences = join.total().sequences;
  stats.documents = join.total().documents;
  stats.tokens = join.total().tokens;
  stats.output_bytes = join.bin_bytes() + join.idx_bytes();
  for (const PartManifest& m : manifests) {
    stats.records += m.records;
    stats.bad_skipped += m.bad_skipped;
    stats.empty_skipped += m.empty_skipped;
  }
  return stats;
}

}  // namespace

MergeStats merge_datasets(const std::vector<std::string>& input_prefixes, const std::string& output_prefix,
                          std::optional<IndexLayout> output_layout) {
  if (input_prefixes.empty()) DUFU_FAIL("merge into '", output_prefix, "' needs an input");
  check_output_prefix(output_prefix);
  std::vector<std::string> input_files;
  for (const auto& prefix : input_prefixes) {
    input_files.push_back(bin_path(prefix));
    input_files.push_back(idx_path(prefix));
  }
  refuse_output_that_is_an_input(output_prefix, input_files);
  for (const auto& prefix : input_prefixes) {
    if (has_part_manifest(prefix)) return merge_parts(input_prefixes, output_prefix, output_layout);
  }
  // Open and check everything before the output exists, so a bad input costs nothing.
  std::vector<std::unique_ptr<IndexedDataset>> inputs;
  inputs.reserve(input_prefixes.size());
  for (const auto& prefix : input_prefixes) {
    inputs.push_back(IndexedDataset::open(prefix, IndexImpl::kMmap));
    if (inputs.back()->dtype() != inputs.front()->dtype()) {
      DUFU_FAIL("cannot merge '", prefix, "' (", dtype_name(inputs.back()->dtype()), ") with '",
                input_prefixes.front(), "' (", dtype_name(inputs.front()->dtype()),
                "): all inputs must have the same dtype");
    }
  }
  std::optional<ShardSidecar> sidecar = merged_sidecar(input_prefixes);
  IndexedDatasetWriter writer(output_prefix, output_layout.value_or(IndexLayout::kMMIDIDX), inputs.front()->dtype());
  for (const auto& input : inputs) writer.append(*input);
  MergeStats stats;
  stats.sequences = writer.num_sequences();
  stats.documents = writer.num_documents();
  stats.tokens = writer.tokens();
  stats.output_bytes = writer.commit();
  publish_shard_sidecar(output_prefix, std::move(sidecar));
  return stats;
}

}  // namespace dufu::dataprep
