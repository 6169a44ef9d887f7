// Joining shards into one: merge.cc, behind `dataprep merge`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dufu/dataprep/index.h"

namespace dufu::dataprep {

// `dataprep merge`: concatenates shards of one dtype into `output_prefix` with the
// layout of `output_layout` (default MMIDIDX). Throws if dtypes differ. Inputs with a
// manifest are the parts of a divided preprocess job (part_manifest.h): they must be
// all the parts of one job, each once, and are joined in part order, in the job's
// layout by default, into what the undivided job writes. Returns the merged counts.
struct MergeStats {
  std::uint64_t sequences = 0;
  std::uint64_t documents = 0;
  std::uint64_t tokens = 0;
  std::uint64_t output_bytes = 0;
  // For parts: how many, and their runs' record counts summed.
  std::uint64_t parts = 0;
  std::uint64_t records = 0, empty_skipped = 0, bad_skipped = 0;
};
MergeStats merge_datasets(const std::vector<std::string>& input_prefixes, const std::string& output_prefix,
                          std::optional<IndexLayout> output_layout = std::nullopt);

}  // namespace dufu::dataprep
