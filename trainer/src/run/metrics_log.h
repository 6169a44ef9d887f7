// metrics.jsonl of a run directory: one JSON object per line ("train" and "eval"
// records), flushed as written so a killed run keeps every finished step. Internal to
// the trainer library.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "dufu/common/json_writer.h"

namespace dufu::trainer {

class MetricsLog {
 public:
  // Opens `path` for appending. On resume (resume_step > 0) the records after the
  // checkpoint's step are dropped first (they belong to steps that will run again), so
  // the file reads as one run; a new run (resume_step 0) starts it empty. Throws
  // dufu::Error naming the file.
  MetricsLog(const std::string& path, std::int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends `record` as one line and flushes; throws dufu::Error naming the file.
  void write(const JsonWriter& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dufu::trainer
