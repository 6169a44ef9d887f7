// Arrow IPC input (table_rows.h): the random-access file format ("ARROW1" at both
// ends, what pyarrow.ipc.new_file and Feather v2 write) and the stream format (what
// HuggingFace datasets' save_to_disk and its cache write into *.arrow), told apart by
// the file's first bytes. Only the named columns are read (IpcReadOptions'
// included_fields), one record batch at a time as it was written (datasets writes
// 1000 rows a batch), with no threads of Arrow's own. An IPC file is never divided
// among the parts of a job: it goes whole to one (preprocess_plan.h).
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>

#include <array>
#include <cstring>

#include "arrow_batch_rows.h"
#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

constexpr char kFileMagic[] = "ARROW1";

class ArrowIpcRows final : public ArrowBatchRows {
 public:
  ArrowIpcRows(const std::string& path, const ReaderOptions& options) : ArrowBatchRows(path, options) {
    file_bytes_ = static_cast<std::uint64_t>(value_or_fail(open_file()->GetSize(), path_, ""));
    std::array<char, sizeof(kFileMagic) - 1> head{};
    {
      const std::shared_ptr<arrow::io::ReadableFile> probe = open_file();
      const std::int64_t got = value_or_fail(probe->Read(static_cast<std::int64_t>(head.size()), head.data()), path_, "");
      random_access_ = got == static_cast<std::int64_t>(head.size()) && std::memcmp(head.data(), kFileMagic, head.size()) == 0;
    }
    // The whole schema first, to check the columns and find their field indices; then
    // the reader that decodes those fields only.
    const std::shared_ptr<arrow::Schema> schema = open_reader(arrow::ipc::IpcReadOptions::Defaults());
    check_text_columns(*schema, options_.json_keys, path_);
    arrow::ipc::IpcReadOptions read_options = arrow::ipc::IpcReadOptions::Defaults();
    read_options.use_threads = false;
    for (int i = 0; i < schema->num_fields(); ++i) {
      for (const std::string& key : options_.json_keys) {
        if (schema->field(i)->name() == key) {
          read_options.included_fields.push_back(i);
          break;
        }
      }
    }
    open_reader(read_options);
  }

  std::uint64_t bytes_read() const override { return bytes_read_; }

 protected:
  std::shared_ptr<arrow::RecordBatch> next_batch(std::string* where) override {
    *where = str_cat("record batch ", batch_index_);
    std::shared_ptr<arrow::RecordBatch> batch;
    if (random_access_) {
      if (batch_index_ >= file_reader_->num_record_batches()) {
        bytes_read_ = file_bytes_;
        return nullptr;
      }
      batch = value_or_fail(file_reader_->ReadRecordBatch(batch_index_), path_, *where);
      // Progress only: the batches' share of the file.
      bytes_read_ = file_bytes_ * static_cast<std::uint64_t>(batch_index_ + 1) /
                    static_cast<std::uint64_t>(file_reader_->num_record_batches());
    } else {
      const arrow::Status status = stream_reader_->ReadNext(&batch);
      if (!status.ok()) fail_arrow(path_, *where, status);
      bytes_read_ = static_cast<std::uint64_t>(value_or_fail(stream_file_->Tell(), path_, *where));
    }
    ++batch_index_;
    return batch;
  }

 private:
  std::shared_ptr<arrow::io::ReadableFile> open_file() const {
    return value_or_fail(arrow::io::ReadableFile::Open(path_), path_, "");
  }

  // Opens the file's reader with `options`; returns the schema it reads.
  std::shared_ptr<arrow::Schema> open_reader(const arrow::ipc::IpcReadOptions& options) {
    const char* what = random_access_ ? "not a readable Arrow IPC file" : "not a readable Arrow IPC stream";
    if (random_access_) {
      file_reader_ = value_or_fail(arrow::ipc::RecordBatchFileReader::Open(open_file(), options), path_, what);
      return file_reader_->schema();
    }
    stream_file_ = open_file();
    stream_reader_ = value_or_fail(arrow::ipc::RecordBatchStreamReader::Open(stream_file_, options), path_, what);
    return stream_reader_->schema();
  }

  bool random_access_ = false;
  std::uint64_t file_bytes_ = 0;
  std::shared_ptr<arrow::ipc::RecordBatchFileReader> file_reader_;
  std::shared_ptr<arrow::io::ReadableFile> stream_file_;
  std::shared_ptr<arrow::ipc::RecordBatchStreamReader> stream_reader_;
  int batch_index_ = 0;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace

std::unique_ptr<TableRows> open_arrow_ipc_rows(const InputRange& input, const ReaderOptions& options) {
  return std::make_unique<ArrowIpcRows>(input.path, options);
}

}  // namespace dufu::dataprep
