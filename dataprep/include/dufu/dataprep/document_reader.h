// Reads documents from txt and jsonl inputs (plain, .zst or .gz, or stdin) and from
// Parquet and Arrow IPC files, one at a time with bounded memory. txt: one document per
// line (OSLO's convention) or one per file; jsonl: one JSON object per line, parsed with
// simdjson, text taken from the requested keys; Parquet and Arrow: one document per
// row, text taken from the columns of those names (table_rows.h). Bad records
// (malformed JSON, missing key, non-string value, a null, invalid UTF-8, a document
// longer than max_document_bytes) either throw or are skipped and counted, by option.
// No input makes memory grow past a few times that limit (a table: one batch of rows).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dufu/dataprep/reader_options.h"

namespace dufu::dataprep {


// Format from the name: .parquet/.pq -> Parquet, .arrow -> Arrow IPC (file or stream);
// otherwise with any .zst/.zstd/.gz removed: .jsonl/.json/.ndjson -> jsonl, anything
// else -> txt. For "-" the caller's default applies.
InputFormat detect_input_format(const std::string& path, InputFormat stdin_format);
// The same, and a regular file whose name says nothing of its format (not .txt, .jsonl,
// .parquet, .arrow, .zst or .gz) but whose bytes are a Parquet file ("PAR1" at both
// ends) or an Arrow IPC file or stream (its magic, or the stream's continuation
// marker) is that: the names published shards carry are not always the format's (e.g.
// part-00000 from Spark, a renamed cache file of `datasets`).
InputFormat detect_input_format_of_file(const std::string& path, InputFormat stdin_format);
bool is_table_format(InputFormat format);

// Expands shell globs (no match is an error naming the pattern); "-" passes through.
// Order: patterns in given order, each pattern's matches sorted.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

struct Document {
  // One entry per JSON key (a single entry for txt), UTF-8 validated.
  std::vector<std::string> fields;
  std::string source;        // input path
  // 1-based line; 0 for whole-file documents, table rows and those of a byte range
  // that starts inside its file (whose line numbers are counted only for messages).
  std::uint64_t line = 0;
  // Where it was read, for a message about it later (DocumentReader::place): the
  // index of its input, and its 1-based line in what was read of that input (the
  // file, or the byte range), or for a table row its 0-based row in the file plus 1;
  // 0 for whole-file documents.
  std::size_t input = 0;
  std::uint64_t input_line = 0;
};


class DocumentReader {
 public:
  // `inputs` are already expanded paths (or "-").
  DocumentReader(const std::vector<std::string>& inputs, ReaderOptions options);
  // Whole files and byte ranges, read in this order. Messages about a range name the
  // file and the line in the file.
  DocumentReader(std::vector<InputRange> inputs, ReaderOptions options);
  ~DocumentReader();

  // Fills `doc` with the next good document; false at the end of all inputs.
  // Throws dufu::Error "FILE:LINE: what" for a bad record unless skipping; IO errors
  // and corrupt compressed streams always throw.
  bool next(Document* doc);

  // "FILE:LINE" of a document read from input `input` at `input_line` (a Document's
  // fields), the line counted in the file; "FILE: row R" (0-based) for a table row;
  // "FILE" for whole-file documents. Safe to
  // call from any thread while the reader lives (a range's line count reads the file).
  std::string place(std::size_t input, std::uint64_t input_line) const;

  std::uint64_t raw_bytes_read() const;     // real bytes consumed from all inputs so far
  std::uint64_t total_input_bytes() const;  // sum of regular-file sizes and ranges (0 for stdin)
  std::uint64_t bad_records() const { return bad_records_; }
  // The first max_reported_errors messages of skipped records.
  const std::vector<std::string>& reported_errors() const { return reported_errors_; }

 private:
  struct State;
  bool open_next_input();
  bool next_table_row(Document* doc);  // of the open table input; false at its end
  void record_bad(const std::string& message);
  std::string too_long_message(const std::string& where, std::uint64_t line) const;
  std::uint64_t line_number() const;  // of the current line in its file

  std::vector<InputRange> inputs_;
  ReaderOptions options_;
  std::unique_ptr<State> state_;
  // Each input's format, written when it is opened (before any of its documents is
  // handed out), read by place() from any thread.
  std::vector<InputFormat> formats_;
  std::size_t next_input_ = 0;
  std::uint64_t finished_inputs_bytes_ = 0;
  std::uint64_t total_input_bytes_ = 0;
  std::uint64_t bad_records_ = 0;
  std::vector<std::string> reported_errors_;
};

}  // namespace dufu::dataprep
