// metrics.jsonl (see metrics_log.h).
#include "metrics_log.h"

#include <simdjson.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"

namespace dufu::trainer {

namespace {

// The lines of `path` up to the last record of `last_step`.
std::string records_up_to(const std::string& path, std::int64_t last_step) {
  std::ifstream in(path, std::ios::binary);
  std::string kept;
  std::string line;
  simdjson::dom::parser parser;
  while (std::getline(in, line)) {
    simdjson::dom::element record;
    // A line cut short by a kill mid-write is dropped with the steps after it.
    if (parser.parse(line).get(record) != simdjson::SUCCESS) break;
    std::int64_t step = 0;
    if (record["step"].get_int64().get(step) != simdjson::SUCCESS) break;
    if (step > last_step) break;
    kept += line;
    kept += '\n';
  }
  return kept;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, std::int64_t resume_step) : path_(path) {
  std::string kept;
  if (resume_step > 0 && std::filesystem::exists(path)) kept = records_up_to(path, resume_step);
  AtomicFile rewritten(path);
  rewritten.write(kept.data(), kept.size());
  rewritten.commit();
  file_ = std::fopen(path.c_str(), "ab");
  if (file_ == nullptr) DUFU_FAIL("cannot append to ", path, ": ", errno_message(errno));
}

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsLog::write(const JsonWriter& record) {
  const std::string line = record.str() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    DUFU_FAIL("cannot write to ", path_, ": ", errno_message(errno));
  }
}

}  // namespace dufu::trainer
