// Synthetic shards whose token values encode their position: token k of the shard
// (counting from 0 across all documents) has the value k (mod 2^31 - 1 for int32,
// mod 65536 for uint16). Every dataset, blend, loader and resume test can then assert
// exact content: a sample is right when its values are the right runs of positions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/indexed_dataset_writer.h"

namespace dufu::testing {

inline std::int32_t synthetic_token(std::uint64_t position, dataprep::DType dtype) {
  if (dtype == dataprep::DType::kUInt16) return static_cast<std::int32_t>(position % 65536);
  return static_cast<std::int32_t>(position % 2147483647ULL);
}

// Writes PREFIX.bin/.idx with one sequence per document of the given lengths.
inline void write_synthetic_shard(const std::string& prefix, const std::vector<std::uint64_t>& lengths,
                                  dataprep::IndexLayout layout = dataprep::IndexLayout::kMMIDIDX,
                                  dataprep::DType dtype = dataprep::DType::kInt32) {
  dataprep::IndexedDatasetWriter writer(prefix, layout, dtype);
  std::uint64_t position = 0;
  std::vector<std::int32_t> tokens;
  for (const std::uint64_t length : lengths) {
    tokens.resize(length);
    for (auto& token : tokens) token = synthetic_token(position++, dtype);
    writer.add_document(tokens);
  }
  writer.commit();
}

// Start position (in tokens) of every document of a synthetic shard.
inline std::vector<std::uint64_t> synthetic_offsets(const std::vector<std::uint64_t>& lengths) {
  std::vector<std::uint64_t> offsets;
  std::uint64_t position = 0;
  for (const std::uint64_t length : lengths) {
    offsets.push_back(position);
    position += length;
  }
  return offsets;
}

}  // namespace dufu::testing
