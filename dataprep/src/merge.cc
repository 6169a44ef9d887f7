// `dataprep merge`: concatenates shards into one, keeping every document boundary
// (older merge tools dropped the document indices of all but the first input).
#include "dufu/common/error.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/shard_output.h"

namespace dufu::dataprep {

MergeStats merge_datasets(const std::vector<std::string>& input_prefixes,
                          const std::string& output_prefix, IndexLayout output_layout) {
  if (input_prefixes.empty()) DUFU_FAIL("merge into '", output_prefix, "' needs an input");
  check_output_prefix(output_prefix);
  std::vector<std::string> input_files;
  for (const auto& prefix : input_prefixes) {
    input_files.push_back(bin_path(prefix));
    input_files.push_back(idx_path(prefix));
  }
  refuse_output_that_is_an_input(output_prefix, input_files);
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
  IndexedDatasetWriter writer(output_prefix, output_layout, inputs.front()->dtype());
  for (const auto& input : inputs) writer.append(*input);
  MergeStats stats;
  stats.sequences = writer.num_sequences();
  stats.documents = writer.num_documents();
  stats.tokens = writer.tokens();
  stats.output_bytes = writer.commit();
  return stats;
}

}  // namespace dufu::dataprep
