// Opening a Parquet or Arrow IPC input (table_rows.h), or, in a build without Arrow,
// the one line that says what is missing.
#pragma once

#include <memory>
#include <string>

#include "dufu/dataprep/reader_options.h"
#include "table_rows.h"

namespace dufu::dataprep {

// Opens `input` (a whole file, or for Parquet the row groups whose first byte lies in
// [begin, end)). Throws dufu::Error naming the file; in a build without Arrow, the one
// line saying what is missing.
std::unique_ptr<TableRows> open_table_rows(const InputRange& input, InputFormat format, const ReaderOptions& options);

// Empty when this build reads Parquet and Arrow; otherwise the one line saying why not.
std::string table_input_missing();

}  // namespace dufu::dataprep
