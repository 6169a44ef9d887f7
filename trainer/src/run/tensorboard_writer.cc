// TensorBoard event files (see tensorboard_writer.h).
//
// The Event messages are encoded here by hand: they use five fields of three messages
// (Event, Summary.Value, SessionLog), and libprotobuf would bring a .proto compile
// step and a library to link for them. The CRC is Boost.CRC's (header-only, already a
// dependency); Google's crc32c library is not packaged in Debian 12.
#include "tensorboard_writer.h"

#include <simdjson.h>
#include <unistd.h>

#include <bit>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>

#include "dufu/common/error.h"

namespace dufu::trainer {

namespace fs = std::filesystem;

std::uint32_t crc32c(std::string_view bytes) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {

void append_little_endian(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// Protobuf's wire format: varints, and fields as (number << 3 | wire type) keys.
void append_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

enum WireType : std::uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void append_key(std::string& out, int field, WireType type) {
  append_varint(out, static_cast<std::uint64_t>(field) << 3 | type);
}

void append_bytes_field(std::string& out, int field, std::string_view bytes) {
  append_key(out, field, kLengthDelimited);
  append_varint(out, bytes.size());
  out.append(bytes);
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64; left out when 0, as
// protobuf does), then one of file_version = 3 (string), summary = 5 (Summary),
// session_log = 7 (SessionLog).
std::string event_header(double wall_time, std::int64_t step) {
  std::string event;
  append_key(event, 1, kFixed64);
  append_little_endian(event, std::bit_cast<std::uint64_t>(wall_time), 8);
  if (step != 0) {
    append_key(event, 2, kVarint);
    append_varint(event, static_cast<std::uint64_t>(step));
  }
  return event;
}

}  // namespace

std::string tfrecord_frame(std::string_view data) {
  std::string length;
  append_little_endian(length, data.size(), 8);
  std::string record = length;
  append_little_endian(record, masked_crc32c(length), 4);
  record.append(data);
  append_little_endian(record, masked_crc32c(data), 4);
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event = event_header(wall_time, 0);
  append_bytes_field(event, 3, "brain.Event:2");
  return event;
}

std::string session_start_event(double wall_time, std::int64_t step) {
  // SessionLog: status = 1 (enum), START = 1.
  std::string session_log;
  append_key(session_log, 1, kVarint);
  append_varint(session_log, 1);
  std::string event = event_header(wall_time, step);
  append_bytes_field(event, 7, session_log);
  return event;
}

std::string scalars_event(double wall_time, std::int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  // Summary: value = 1 (repeated Summary.Value); Summary.Value: tag = 1 (string),
  // simple_value = 2 (float).
  std::string summary;
  for (const TensorBoardScalar& scalar : scalars) {
    std::string value;
    append_bytes_field(value, 1, scalar.tag);
    append_key(value, 2, kFixed32);
    append_little_endian(value, std::bit_cast<std::uint32_t>(scalar.value), 4);
    append_bytes_field(summary, 1, value);
  }
  std::string event = event_header(wall_time, step);
  append_bytes_field(event, 5, summary);
  return event;
}

MetricsScalars metrics_record_scalars(std::string_view record_json) {
  simdjson::dom::parser parser;
  simdjson::dom::object record;
  std::string_view type;
  MetricsScalars result;
  if (parser.parse(record_json.data(), record_json.size()).get(record) != simdjson::SUCCESS ||
      record["type"].get(type) != simdjson::SUCCESS || record["step"].get(result.step) != simdjson::SUCCESS) {
    DUFU_FAIL("not a metrics record with a type and a step: ", record_json);
  }
  const bool is_eval = type == "eval";
  for (const auto field : record) {
    std::string_view name = field.key;
    if (name == "type" || name == "step") continue;
    float value = 0.0f;
    std::int64_t signed_number = 0;
    std::uint64_t unsigned_number = 0;
    double real_number = 0.0;
    bool flag = false;
    if (field.value.get(signed_number) == simdjson::SUCCESS) {
      value = static_cast<float>(signed_number);
    } else if (field.value.get(unsigned_number) == simdjson::SUCCESS) {
      value = static_cast<float>(unsigned_number);
    } else if (field.value.get(real_number) == simdjson::SUCCESS) {
      value = static_cast<float>(real_number);
    } else if (field.value.get(flag) == simdjson::SUCCESS) {
      value = flag ? 1.0f : 0.0f;
    } else if (field.value.is_null()) {
      value = std::numeric_limits<float>::quiet_NaN();
    } else {
      continue;  // strings, arrays and objects are not scalars
    }
    if (is_eval && name.starts_with("val_")) name.remove_prefix(4);
    result.scalars.push_back({str_cat(type, "/", name), value});
  }
  return result;
}

namespace {

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool is_event_file(const fs::path& path) { return path.filename().string().starts_with("events.out.tfevents."); }

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& run_dir, std::int64_t resume_step) {
  std::error_code error;
  if (resume_step == 0) {
    for (const auto& entry : fs::directory_iterator(run_dir, error)) {
      if (is_event_file(entry.path()) && !fs::remove(entry.path(), error)) {
        DUFU_FAIL("cannot remove ", entry.path().string(), " of an earlier run: ", error.message());
      }
    }
    if (error) DUFU_FAIL("cannot list ", run_dir, ": ", error.message());
  }
  // TensorFlow's name, events.out.tfevents.SECONDS.HOST, SECONDS in 10 digits so that
  // TensorBoard, which reads a directory's event files in name order, reads them in
  // the order they were written. A file of the same second (a run resumed at once)
  // takes the next second's name, which keeps that order.
  const double wall_time = seconds_since_epoch();
  const std::string host = host_name();
  char seconds[32];
  for (auto second = static_cast<long long>(wall_time);; ++second) {
    std::snprintf(seconds, sizeof seconds, "%010lld", second);
    path_ = (fs::path(run_dir) / str_cat("events.out.tfevents.", seconds, ".", host)).string();
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ != nullptr) break;
    if (errno != EEXIST) DUFU_FAIL("cannot create ", path_, ": ", errno_message(errno));
  }
  append(file_version_event(wall_time));
  append(session_start_event(wall_time, resume_step + 1));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write(const JsonWriter& record) {
  const MetricsScalars scalars = metrics_record_scalars(record.str());
  append(scalars_event(seconds_since_epoch(), scalars.step, scalars.scalars));
}

void TensorBoardWriter::append(const std::string& event) {
  const std::string record = tfrecord_frame(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    DUFU_FAIL("cannot write to ", path_, ": ", errno_message(errno));
  }
}

}  // namespace dufu::trainer
