// What the indexed-dataset tests share (indexed_dataset_test.cc, index_test.cc): the
// hand-written golden shards of tests/data/golden and byte patches of copies of them.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "dufu/dataprep/index.h"
#include "support/temp_dir.h"

namespace dufu::dataprep::indexed_dataset_testing {

using dufu::testing::TempDir;

inline std::string read_file(const std::string& path) { return dufu::testing::read_all(path); }
inline void write_file(const std::string& path, const std::string& bytes) {
  dufu::testing::write_all(path, bytes);
}

inline std::string golden(const std::string& name) {
  return std::string(DUFU_TEST_DATA_DIR) + "/golden/" + name;
}

// Copies a golden shard next to the test so it can be patched.
inline std::string copy_golden(const TempDir& dir, const std::string& name) {
  const std::string prefix = dir.file(name);
  write_file(idx_path(prefix), read_file(idx_path(golden(name))));
  write_file(bin_path(prefix), read_file(bin_path(golden(name))));
  return prefix;
}

template <typename T>
void patch(std::string& bytes, std::size_t at, T value) {
  ASSERT_LE(at + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

}  // namespace dufu::dataprep::indexed_dataset_testing
