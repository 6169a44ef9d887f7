// The rows of record batches, text column by text column (arrow_batch_rows.h).
#include "arrow_batch_rows.h"

#include <simdjson.h>

#include <optional>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

bool is_plain_text_type(arrow::Type::type id) {
  switch (id) {
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
    case arrow::Type::BINARY:
    case arrow::Type::LARGE_BINARY:
    case arrow::Type::BINARY_VIEW:
      return true;
    default:
      return false;
  }
}

// Value `row` of a plain text column (is_plain_text_type), or nullopt for a null.
std::optional<std::string_view> plain_value(const arrow::Array& column, std::int64_t row) {
  if (column.IsNull(row)) return std::nullopt;
  switch (column.type_id()) {
    case arrow::Type::STRING:
      return static_cast<const arrow::StringArray&>(column).GetView(row);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(column).GetView(row);
    case arrow::Type::STRING_VIEW:
      return static_cast<const arrow::StringViewArray&>(column).GetView(row);
    case arrow::Type::BINARY:
      return static_cast<const arrow::BinaryArray&>(column).GetView(row);
    case arrow::Type::LARGE_BINARY:
      return static_cast<const arrow::LargeBinaryArray&>(column).GetView(row);
    case arrow::Type::BINARY_VIEW:
      return static_cast<const arrow::BinaryViewArray&>(column).GetView(row);
    default:
      DUFU_FAIL("internal error: column of type ", column.type()->ToString(), " read as text");
  }
}

std::optional<std::string_view> text_value(const arrow::Array& column, std::int64_t row) {
  if (column.type_id() != arrow::Type::DICTIONARY) return plain_value(column, row);
  if (column.IsNull(row)) return std::nullopt;
  const auto& encoded = static_cast<const arrow::DictionaryArray&>(column);
  return plain_value(*encoded.dictionary(), encoded.GetValueIndex(row));
}

}  // namespace

bool is_text_type(const arrow::DataType& type) {
  if (type.id() == arrow::Type::DICTIONARY) {
    return is_plain_text_type(static_cast<const arrow::DictionaryType&>(type).value_type()->id());
  }
  return is_plain_text_type(type.id());
}

void fail_arrow(const std::string& path, const std::string& where, const arrow::Status& status) {
  DUFU_FAIL(path, where.empty() ? "" : ": ", where, ": ", status.ToString());
}

void check_text_columns(const arrow::Schema& schema, const std::vector<std::string>& keys, const std::string& path) {
  for (const std::string& key : keys) {
    const std::vector<int> matches = schema.GetAllFieldIndices(key);
    if (matches.empty()) {
      std::string names;
      for (const auto& field : schema.fields()) names += (names.empty() ? "" : ", ") + field->name();
      DUFU_FAIL(path, ": no column '", key, "' (its columns: ", names.empty() ? "none" : names,
                "); HINT: --json-keys names the columns of Parquet and Arrow inputs");
    }
    if (matches.size() > 1) DUFU_FAIL(path, ": ", matches.size(), " columns are named '", key, "'");
    const arrow::DataType& type = *schema.field(matches.front())->type();
    if (!is_text_type(type)) {
      DUFU_FAIL(path, ": column '", key, "' holds ", type.ToString(),
                ", not text (string, large_string, string_view, binary, large_binary, binary_view or a dictionary "
                "of one)");
    }
  }
}

ArrowBatchRows::ArrowBatchRows(std::string path, ReaderOptions options)
    : path_(std::move(path)), options_(std::move(options)) {}

std::string ArrowBatchRows::bad_record(std::string_view what) const {
  return str_cat(path_, ": row ", row_, " (", where_, "): ", what);
}

TableRows::Next ArrowBatchRows::next(std::vector<std::string>* fields, std::string* problem) {
  while (batch_ == nullptr || in_batch_ >= batch_->num_rows()) {
    if (batch_ != nullptr) next_row_in_file_ += static_cast<std::uint64_t>(batch_->num_rows());
    batch_ = next_batch(&where_);
    in_batch_ = 0;
    if (batch_ == nullptr) return Next::kEnd;
    columns_.clear();
    for (const std::string& key : options_.json_keys) {
      std::shared_ptr<arrow::Array> column = batch_->GetColumnByName(key);
      // The schema was checked when the file was opened; a batch is the schema's.
      if (column == nullptr || !is_text_type(*column->type())) {
        DUFU_FAIL(path_, ": ", where_, " has no text column '", key, "' although the file's schema does");
      }
      columns_.push_back(std::move(column));
    }
  }
  const std::int64_t at = in_batch_++;
  row_ = next_row_in_file_ + static_cast<std::uint64_t>(at);
  fields->resize(columns_.size());
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    const std::optional<std::string_view> text = text_value(*columns_[i], at);
    const std::string& key = options_.json_keys[i];
    if (!text) {
      *problem = bad_record(str_cat("null in column '", key, "'"));
      return Next::kBadRecord;
    }
    if (text->size() > options_.max_document_bytes) {
      *problem = bad_record(str_cat("column '", key, "' holds ", text->size(), " bytes, longer than ",
                                    options_.max_document_bytes,
                                    " bytes, the limit of one document (`max_document_bytes`)"));
      return Next::kBadRecord;
    }
    if (!simdjson::validate_utf8(text->data(), text->size())) {
      *problem = bad_record(str_cat("invalid UTF-8 in column '", key, "'"));
      return Next::kBadRecord;
    }
    (*fields)[i].assign(*text);
  }
  return Next::kRow;
}

}  // namespace dufu::dataprep
