// Rows of Parquet and Arrow IPC files (issue 41), behind an interface that needs no
// Arrow header, so only the files that read them compile against Arrow and a build
// without Arrow refuses such inputs in one line (table_input.h opens them).
//
// One row is one document; its text comes from the columns named by the reader's keys
// (ReaderOptions::json_keys, as Megatron's --json-keys name JSON keys), each a string,
// large_string, string_view, binary, large_binary or binary_view column, plain or
// dictionary-encoded; other columns are never decoded. A null, invalid UTF-8 or a
// value longer than max_document_bytes is a bad record (the caller skips or throws);
// a missing column, a column of another type, a corrupt or truncated file is an error
// naming the file (and the row group or record batch where one is known).
//
// Memory: batches of kTableBatchRows rows of the named columns (about that many times
// the mean document, 1-5 MB for web text); for Parquet, pages read through a buffered
// stream, though Arrow's reader was measured to hold a few times the largest row
// group's text column (docs/dataprep.md, "Parquet and Arrow inputs").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dufu/dataprep/reader_options.h"

namespace dufu::dataprep {

inline constexpr std::int64_t kTableBatchRows = 1024;

class TableRows {
 public:
  virtual ~TableRows() = default;
  enum class Next { kRow, kBadRecord, kEnd };
  // kRow: `fields` holds the next row's texts, one per key. kBadRecord: the row is
  // passed over and `problem` says "FILE: row R (row group G): what". kEnd: no more.
  virtual Next next(std::vector<std::string>* fields, std::string* problem) = 0;
  // 0-based row in the file of the last row next() looked at.
  virtual std::uint64_t row() const = 0;
  // Bytes of the file consumed so far (the compressed size of the row groups or
  // record batches read), for progress.
  virtual std::uint64_t bytes_read() const = 0;
};

}  // namespace dufu::dataprep
