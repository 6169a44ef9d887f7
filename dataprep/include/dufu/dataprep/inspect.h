// `dataprep inspect`: a human-readable description of a shard (header, layout, dtype,
// counts and token statistics), computed from the index alone.
#pragma once

#include <cstdint>
#include <string>

#include "dufu/dataprep/indexed_dataset.h"

namespace dufu::dataprep {

struct ShardSummary {
  std::string prefix;
  IndexLayout layout = IndexLayout::kMMIDIDX;
  DType dtype = DType::kUInt16;
  std::uint64_t version = 0;
  std::uint64_t sequences = 0;
  std::uint64_t documents = 0;
  std::uint64_t tokens = 0;
  std::uint64_t min_length = 0, max_length = 0;
  double mean_length = 0;
  std::uint64_t median_length = 0, p99_length = 0;
  std::uint64_t idx_bytes = 0, bin_bytes = 0;
};

ShardSummary summarize(const IndexedDataset& dataset);
std::string format_summary(const ShardSummary& summary);

}  // namespace dufu::dataprep
