// What the Parquet and Arrow IPC readers share (table_rows.h): the rows of a sequence of
// record batches, each batch's text columns looked up by name and read value by value,
// with the checks of a bad record. A reader supplies the batches and says where each
// came from ("row group 3", "record batch 7") for messages.
#pragma once

#include <arrow/api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "table_rows.h"

namespace dufu::dataprep {

// Whether values of `type` are text this reader takes (string, large_string,
// string_view, binary, large_binary, binary_view, or a dictionary of one of them).
bool is_text_type(const arrow::DataType& type);

// The error of an Arrow call, as "FILE: where: Arrow's message".
[[noreturn]] void fail_arrow(const std::string& path, const std::string& where, const arrow::Status& status);

template <typename T>
T value_or_fail(arrow::Result<T> result, const std::string& path, const std::string& where) {
  if (!result.ok()) fail_arrow(path, where, result.status());
  return std::move(result).ValueUnsafe();
}

// Checks that `schema` has every key as a top-level text column; throws naming the file,
// the key and the columns it has.
void check_text_columns(const arrow::Schema& schema, const std::vector<std::string>& keys, const std::string& path);

class ArrowBatchRows : public TableRows {
 public:
  Next next(std::vector<std::string>* fields, std::string* problem) final;
  std::uint64_t row() const final { return row_; }

 protected:
  ArrowBatchRows(std::string path, ReaderOptions options);
  // The next batch, or nullptr at the end; sets `where` to what a message about its
  // rows should say after the row ("row group 3"), and advances the bytes read.
  virtual std::shared_ptr<arrow::RecordBatch> next_batch(std::string* where) = 0;

  const std::string path_;
  const ReaderOptions options_;

 private:
  std::string bad_record(std::string_view what) const;

  std::shared_ptr<arrow::RecordBatch> batch_;
  std::vector<std::shared_ptr<arrow::Array>> columns_;  // one per key
  std::string where_;
  std::int64_t in_batch_ = 0;           // the next row of batch_
  std::uint64_t next_row_in_file_ = 0;  // of the next batch's first row, when a reader skips rows
  std::uint64_t row_ = 0;

 protected:
  // A reader that passes over rows (Parquet row groups of other parts) counts them here.
  void skip_rows(std::uint64_t rows) { next_row_in_file_ += rows; }
};

// The two readers (parquet_rows.cc, arrow_ipc_rows.cc).
std::unique_ptr<TableRows> open_parquet_rows(const InputRange& input, const ReaderOptions& options);
std::unique_ptr<TableRows> open_arrow_ipc_rows(const InputRange& input, const ReaderOptions& options);

}  // namespace dufu::dataprep
