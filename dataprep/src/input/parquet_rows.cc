// Parquet input (table_rows.h) through Arrow's Parquet reader: the named columns only,
// one row group at a time, in batches of kTableBatchRows rows, pages read through a
// buffered stream rather than the column chunk at once, no threads of Arrow's own. A part of a divided job (preprocess_plan.h) reads the row groups whose
// first byte lies in its byte range, so the parts together read every row group once.
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include <algorithm>
#include <exception>

#include "arrow_batch_rows.h"
#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

// The buffered stream's size: pages are read through it.
constexpr std::int64_t kReadBufferBytes = std::int64_t{1} << 20;

// The byte at which row group `group` starts: its earliest column chunk's first page
// (the dictionary page when there is one).
std::uint64_t row_group_start(const parquet::RowGroupMetaData& group) {
  std::int64_t start = -1;
  for (int c = 0; c < group.num_columns(); ++c) {
    const std::unique_ptr<parquet::ColumnChunkMetaData> chunk = group.ColumnChunk(c);
    const std::int64_t first =
        chunk->has_dictionary_page() && chunk->dictionary_page_offset() > 0 ? chunk->dictionary_page_offset()
                                                                            : chunk->data_page_offset();
    start = start < 0 ? first : std::min(start, first);
  }
  return static_cast<std::uint64_t>(std::max<std::int64_t>(start, 0));
}

class ParquetRows final : public ArrowBatchRows {
 public:
  ParquetRows(const InputRange& input, const ReaderOptions& options) : ArrowBatchRows(input.path, options) {
    try {
      open(input);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {  // parquet::ParquetException from the metadata
      DUFU_FAIL(path_, ": not a readable Parquet file: ", error.what());
    }
  }

  std::uint64_t bytes_read() const override { return bytes_read_; }

 protected:
  std::shared_ptr<arrow::RecordBatch> next_batch(std::string* where) override {
    for (;;) {
      if (batches_ != nullptr) {
        std::shared_ptr<arrow::RecordBatch> batch;
        const arrow::Status status = batches_->ReadNext(&batch);
        if (!status.ok()) fail_arrow(path_, group_name(group_), status);
        if (batch != nullptr) {
          *where = group_name(group_);
          return batch;
        }
        bytes_read_ += group_bytes_[static_cast<std::size_t>(group_)];
        batches_.reset();
        ++group_;
      }
      while (group_ < metadata_->num_row_groups() && !selected_[static_cast<std::size_t>(group_)]) {
        skip_rows(static_cast<std::uint64_t>(metadata_->RowGroup(group_)->num_rows()));
        ++group_;
      }
      if (group_ >= metadata_->num_row_groups()) return nullptr;
      try {
        batches_ = value_or_fail(reader_->GetRecordBatchReader({group_}, leaf_columns_), path_, group_name(group_));
      } catch (const Error&) {
        throw;
      } catch (const std::exception& error) {
        DUFU_FAIL(path_, ": ", group_name(group_), ": ", error.what());
      }
    }
  }

 private:
  static std::string group_name(int group) { return str_cat("row group ", group); }

  void open(const InputRange& input) {
    std::shared_ptr<arrow::io::ReadableFile> file = value_or_fail(arrow::io::ReadableFile::Open(path_), path_, "");
    parquet::ReaderProperties properties;
    properties.enable_buffered_stream();
    properties.set_buffer_size(kReadBufferBytes);
    parquet::ArrowReaderProperties arrow_properties;
    arrow_properties.set_use_threads(false);
    arrow_properties.set_pre_buffer(false);
    arrow_properties.set_batch_size(kTableBatchRows);
    parquet::arrow::FileReaderBuilder builder;
    const arrow::Status opened = builder.Open(file, properties);
    if (!opened.ok()) fail_arrow(path_, "not a readable Parquet file", opened);
    builder.properties(arrow_properties);
    reader_ = value_or_fail(builder.Build(), path_, "not a readable Parquet file");
    metadata_ = reader_->parquet_reader()->metadata();

    std::shared_ptr<arrow::Schema> schema;
    const arrow::Status read_schema = reader_->GetSchema(&schema);
    if (!read_schema.ok()) fail_arrow(path_, "its schema", read_schema);
    check_text_columns(*schema, options_.json_keys, path_);
    for (const std::string& key : options_.json_keys) {
      const int leaf = metadata_->schema()->ColumnIndex(key);
      if (leaf < 0) DUFU_FAIL(path_, ": column '", key, "' is not a plain column of the Parquet schema");
      if (std::find(leaf_columns_.begin(), leaf_columns_.end(), leaf) == leaf_columns_.end()) {
        leaf_columns_.push_back(leaf);
      }
    }
    std::sort(leaf_columns_.begin(), leaf_columns_.end());
    const std::size_t groups = static_cast<std::size_t>(metadata_->num_row_groups());
    std::vector<std::uint64_t> starts(groups);
    for (std::size_t g = 0; g < groups; ++g) starts[g] = row_group_start(*metadata_->RowGroup(static_cast<int>(g)));
    const std::uint64_t file_bytes = static_cast<std::uint64_t>(value_or_fail(file->GetSize(), path_, ""));
    selected_.resize(groups);
    group_bytes_.resize(groups);
    for (std::size_t g = 0; g < groups; ++g) {
      selected_[g] = input.whole || (starts[g] >= input.begin && starts[g] < input.end);
      // For progress: the bytes up to the next row group (the last one's reach the
      // footer), so a whole file's row groups add up to its size.
      const std::uint64_t end = g + 1 < groups ? starts[g + 1] : file_bytes;
      group_bytes_[g] = end > starts[g] ? end - starts[g] : 0;
    }
    if (input.whole && groups > 0) group_bytes_[0] += starts[0];
  }

  std::unique_ptr<parquet::arrow::FileReader> reader_;
  std::shared_ptr<parquet::FileMetaData> metadata_;
  std::vector<int> leaf_columns_;
  std::vector<bool> selected_;  // the row groups this input reads
  std::vector<std::uint64_t> group_bytes_;
  int group_ = 0;               // the row group being read, or the next
  std::unique_ptr<arrow::RecordBatchReader> batches_;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace

std::unique_ptr<TableRows> open_parquet_rows(const InputRange& input, const ReaderOptions& options) {
  return std::make_unique<ParquetRows>(input, options);
}

}  // namespace dufu::dataprep
