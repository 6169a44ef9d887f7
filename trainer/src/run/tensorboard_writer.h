// TensorBoard event files of a run directory, beside metrics.jsonl: every numeric
// member of every metrics record as a scalar at the record's step, so that
// `tensorboard --logdir RUN_DIR` shows a run while it trains. Internal to the trainer
// library.
//
// An event file is a sequence of TFRecords, each
//   uint64 length | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of the data
// (little-endian) around one serialized `tensorflow.Event` protobuf. The first event
// carries file_version "brain.Event:2"; the next a SessionLog START at the first step
// this process will run, which tells TensorBoard's loader to drop the events of later
// steps that earlier files hold (a resumed run writes those steps again).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "dufu/common/json_writer.h"

namespace dufu::trainer {

// CRC-32C (Castagnoli polynomial, reflected, as iSCSI and TFRecord use) of `bytes`.
std::uint32_t crc32c(std::string_view bytes);
// The CRC as TFRecord stores it: rotated right by 15 bits plus 0xa282ead8, so that a
// CRC of data holding CRCs stays well distributed.
std::uint32_t masked_crc32c(std::string_view bytes);
// `data` framed as one TFRecord.
std::string tfrecord_frame(std::string_view data);

struct TensorBoardScalar {
  std::string tag;
  float value = 0.0f;
};

// Serialized tensorflow.Event messages: the file's first, the restart marker, and
// one holding `scalars` as summary values (simple_value).
std::string file_version_event(double wall_time);
std::string session_start_event(double wall_time, std::int64_t step);
std::string scalars_event(double wall_time, std::int64_t step, const std::vector<TensorBoardScalar>& scalars);

// The step and scalars of one metrics.jsonl record (a JSON object with "type" and
// "step"): each other member that is a number or a boolean (1 or 0), tagged
// "TYPE/NAME", an eval record's "val_" prefix left out ("eval/loss"); null, which the
// record writes for a NaN or infinite value, as NaN. Throws dufu::Error if the text is
// not such an object.
struct MetricsScalars {
  std::int64_t step = 0;
  std::vector<TensorBoardScalar> scalars;
};
MetricsScalars metrics_record_scalars(std::string_view record_json);

class TensorBoardWriter {
 public:
  // Starts a new event file in `run_dir` and writes its first two events (the restart
  // marker at resume_step + 1). A new run (resume_step 0) first removes the event
  // files an earlier run left there, as metrics.jsonl starts empty. Throws dufu::Error
  // naming the file.
  TensorBoardWriter(const std::string& run_dir, std::int64_t resume_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends the scalars of one metrics record and flushes, so a killed run leaves a
  // file that reads up to its last whole record; throws dufu::Error naming the file.
  void write(const JsonWriter& record);

  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dufu::trainer
