// What a DocumentReader is asked to read (document_reader.h): the input formats, the
// options of reading them, and one input (a whole file or a part of one). Apart from
// the reader so that the table readers (src/input/table_rows.h) need only this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dufu::dataprep {

enum class InputFormat { kTxt, kJsonl, kParquet, kArrow };
enum class TxtDocument { kLine, kFile };

// The default --max-document-bytes: 16 MiB. Longer lines (or whole-file documents)
// are bad records. Tokenizing takes about 55 bytes of memory per byte of document
// (sentencepiece's lattice and pieces), so a 16 MiB document costs a worker about 1 GB
// and half a minute; real prose documents (a whole long novel is 2-5 MB) fit well
// below it, and lines beyond it are almost always dumps (base64, tables, logs).
inline constexpr std::size_t kDefaultMaxDocumentBytes = std::size_t{16} << 20;

struct ReaderOptions {
  // The JSON keys of jsonl records, and the column names of Parquet and Arrow tables.
  std::vector<std::string> json_keys{"text"};
  // Longest line (txt line, jsonl record) or whole-file document accepted, in bytes.
  std::size_t max_document_bytes = kDefaultMaxDocumentBytes;
  TxtDocument txt_document = TxtDocument::kLine;
  InputFormat stdin_format = InputFormat::kJsonl;
  bool skip_bad_records = false;
  std::size_t max_reported_errors = 10;
};

// One input of a reader: a whole file (or "-"), or the lines of a byte range of a
// plain file that start in [begin, end) (line_range_source.h), or the row groups of a
// Parquet file whose first byte is in [begin, end).
struct InputRange {
  std::string path;
  bool whole = true;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

}  // namespace dufu::dataprep
