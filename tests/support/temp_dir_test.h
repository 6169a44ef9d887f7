// A GoogleTest fixture with a scratch directory, for suites whose tests write files.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "support/temp_dir.h"

namespace dufu::testing {

class TempDirTest : public ::testing::Test {
 protected:
  // Writes `bytes` to `name` inside the directory and returns the full path.
  std::string write(const std::string& name, const std::string& bytes) {
    write_all(dir_.file(name), bytes);
    return dir_.file(name);
  }

  TempDir dir_;
};

}  // namespace dufu::testing
