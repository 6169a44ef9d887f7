// What a `train` run leaves in its run directory, read the way the end-to-end tests
// compare runs: the fields of metrics.jsonl and the checkpoint directories.
#pragma once

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

namespace dufu::testing {

// RUN_DIR/checkpoints/step_NNNNNNNN: the checkpoint of `step`.
inline std::string checkpoint_dir(const std::string& run_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "/checkpoints/step_%08d", step);
  return run_dir + name;
}

// "KEY":VALUE for each of `keys`, in that order, that a record of RUN_DIR/metrics.jsonl
// holds, record after record; VALUE as written (up to the next ',' or '}'). The
// writer prints the shortest digits that read back to the same double, so equal
// text is equal bits.
inline std::vector<std::string> metric_fields(const std::string& run_dir, std::initializer_list<std::string> keys) {
  std::vector<std::string> fields;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    for (const std::string& key : keys) {
      const std::string quoted = "\"" + key + "\":";
      const auto at = line.find(quoted);
      if (at == std::string::npos) continue;
      const auto begin = at + quoted.size();
      fields.push_back(quoted + line.substr(begin, line.find_first_of(",}", begin) - begin));
    }
  }
  return fields;
}

// The values of `key` in the records of RUN_DIR/metrics.jsonl that hold it, in order.
inline std::vector<double> metric_values(const std::string& run_dir, const std::string& key) {
  std::vector<double> values;
  const std::string quoted = "\"" + key + "\":";
  for (const std::string& field : metric_fields(run_dir, {key})) values.push_back(std::stod(field.substr(quoted.size())));
  return values;
}

}  // namespace dufu::testing
