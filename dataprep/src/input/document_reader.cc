// Turns input files into documents: txt lines or whole files, or text fields of jsonl
// objects. Documents are refilled in place (field strings keep their capacity) and
// JSON is parsed straight from the line buffer, so reading costs no allocation per
// document once warmed up.
#include "dufu/dataprep/document_reader.h"

#include <glob.h>
#include <simdjson.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <optional>

#include "dufu/common/error.h"
#include "dufu/dataprep/byte_source.h"
#include "dufu/dataprep/line_range_source.h"
#include "dufu/dataprep/line_reader.h"
#include "dufu/common/json_members.h"
#include "table_input.h"

namespace dufu::dataprep {
namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

const char* json_type_name(simdjson::dom::element_type type) {
  using simdjson::dom::element_type;
  switch (type) {
    case element_type::ARRAY:
      return "an array";
    case element_type::OBJECT:
      return "an object";
    case element_type::INT64:
    case element_type::UINT64:
    case element_type::DOUBLE:
      return "a number";
    case element_type::STRING:
      return "a string";
    case element_type::BOOL:
      return "a boolean";
    case element_type::NULL_VALUE:
      return "null";
  }
  return "of an unknown type";
}

}  // namespace

InputFormat detect_input_format(const std::string& path, InputFormat stdin_format) {
  if (path == "-") return stdin_format;
  std::string_view name = path;
  for (std::string_view parquet : {".parquet", ".pq"}) {
    if (ends_with(name, parquet)) return InputFormat::kParquet;
  }
  if (ends_with(name, ".arrow")) return InputFormat::kArrow;
  for (std::string_view compressed : {".zst", ".zstd", ".gz"}) {
    if (ends_with(name, compressed)) {
      name.remove_suffix(compressed.size());
      break;
    }
  }
  for (std::string_view json : {".jsonl", ".json", ".ndjson"}) {
    if (ends_with(name, json)) return InputFormat::kJsonl;
  }
  return InputFormat::kTxt;
}

bool is_table_format(InputFormat format) { return format == InputFormat::kParquet || format == InputFormat::kArrow; }

InputFormat detect_input_format_of_file(const std::string& path, InputFormat stdin_format) {
  const InputFormat by_name = detect_input_format(path, stdin_format);
  if (by_name != InputFormat::kTxt || path == "-") return by_name;
  // A name that says what the file is (.txt, or compressed) is taken at its word: a txt
  // line of any bytes stays a txt line (a bad record, if not UTF-8).
  for (std::string_view known : {".txt", ".zst", ".zstd", ".gz"}) {
    if (ends_with(path, known)) return by_name;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8) return by_name;
  std::ifstream file(path, std::ios::binary);
  std::array<char, 8> head{}, tail{};
  if (!file.read(head.data(), head.size())) return by_name;
  if (!file.seekg(-4, std::ios::end) || !file.read(tail.data(), 4)) return by_name;
  // Parquet: "PAR1" at both ends. Arrow IPC: the file format's "ARROW1", or the stream
  // format's continuation marker 0xFFFFFFFF, which no UTF-8 text begins with.
  if (std::memcmp(head.data(), "PAR1", 4) == 0 && std::memcmp(tail.data(), "PAR1", 4) == 0) return InputFormat::kParquet;
  if (std::memcmp(head.data(), "ARROW1", 6) == 0) return InputFormat::kArrow;
  if (std::memcmp(head.data(), "\xff\xff\xff\xff", 4) == 0) return InputFormat::kArrow;
  return by_name;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> inputs;
  for (const std::string& pattern : patterns) {
    // A plain path passes through untouched, so a missing file is reported by open()
    // with its real reason rather than as "no match".
    if (pattern == "-" || pattern.find_first_of("*?[") == std::string::npos) {
      inputs.push_back(pattern);
      continue;
    }
    glob_t matches{};
    // GLOB_NOSORT: glob sorts by locale collation; byte order is the same everywhere.
    const int result = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &matches);
    if (result == GLOB_NOMATCH) {
      globfree(&matches);
      DUFU_FAIL("no input file matches '", pattern, "'");
    }
    if (result != 0) {
      globfree(&matches);
      DUFU_FAIL("cannot expand '", pattern, "'", result == GLOB_NOSPACE ? ": out of memory" : ": read error");
    }
    std::vector<std::string> expanded(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    globfree(&matches);
    std::sort(expanded.begin(), expanded.end());
    inputs.insert(inputs.end(), expanded.begin(), expanded.end());
  }
  return inputs;
}

struct DocumentReader::State {
  // Kept across inputs so its buffers, sized for the longest line so far, are reused.
  simdjson::dom::parser parser;
  std::unique_ptr<LineReader> reader;
  std::unique_ptr<TableRows> table;  // instead of the reader, for Parquet and Arrow inputs
  LineRangeSource* range = nullptr;  // the reader's source when the input is a byte range
  InputFormat format = InputFormat::kTxt;
  std::string path;
  bool whole_file_done = false;
};

namespace {

std::vector<InputRange> whole_files(const std::vector<std::string>& paths) {
  std::vector<InputRange> inputs;
  inputs.reserve(paths.size());
  for (const std::string& path : paths) inputs.push_back(InputRange{.path = path});
  return inputs;
}

}  // namespace

DocumentReader::DocumentReader(const std::vector<std::string>& inputs, ReaderOptions options)
    : DocumentReader(whole_files(inputs), std::move(options)) {}

DocumentReader::DocumentReader(std::vector<InputRange> inputs, ReaderOptions options)
    : inputs_(std::move(inputs)),
      options_(std::move(options)),
      state_(std::make_unique<State>()),
      formats_(inputs_.size(), InputFormat::kTxt) {
  for (const InputRange& input : inputs_) {
    if (!input.whole) {
      total_input_bytes_ += input.end - input.begin;
      continue;
    }
    struct stat st {};
    // Unreadable inputs are reported when opened, with the reason.
    if (input.path != "-" && ::stat(input.path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      total_input_bytes_ += static_cast<std::uint64_t>(st.st_size);
    }
  }
}

DocumentReader::~DocumentReader() = default;

std::uint64_t DocumentReader::raw_bytes_read() const {
  std::uint64_t bytes = finished_inputs_bytes_;
  if (state_->reader) bytes += state_->reader->source().raw_bytes_read();
  if (state_->table) bytes += state_->table->bytes_read();
  return bytes;
}

std::uint64_t DocumentReader::total_input_bytes() const { return total_input_bytes_; }

bool DocumentReader::open_next_input() {
  if (next_input_ >= inputs_.size()) return false;
  const InputRange& input = inputs_[next_input_++];
  const std::string& path = input.path;
  State& s = *state_;
  std::unique_ptr<ByteSource> source;
  s.range = nullptr;
  s.path = path;
  s.format = detect_input_format_of_file(path, options_.stdin_format);
  formats_[next_input_ - 1] = s.format;
  if (is_table_format(s.format)) {
    s.table = open_table_rows(input, s.format, options_);
    return true;
  }
  if (input.whole) {
    source = open_byte_source(path);
  } else {
    auto range = std::make_unique<LineRangeSource>(path, input.begin, input.end);
    s.range = range.get();
    source = std::move(range);
  }
  s.reader = std::make_unique<LineReader>(std::move(source), simdjson::SIMDJSON_PADDING, options_.max_document_bytes);
  s.whole_file_done = false;
  return true;
}

std::string DocumentReader::place(std::size_t input, std::uint64_t input_line) const {
  const InputRange& range = inputs_.at(input);
  const std::string name = range.path == "-" ? "<stdin>" : range.path;
  if (input_line == 0) return name;
  if (is_table_format(formats_.at(input))) return str_cat(name, ": row ", input_line - 1);
  if (range.whole) return str_cat(name, ":", input_line);
  try {
    return str_cat(name, ":", LineRangeSource(range.path, range.begin, range.end).lines_before() + input_line);
  } catch (const Error&) {
    return str_cat(name, ", line ", input_line, " of its bytes ", range.begin, " to ", range.end);
  }
}

std::string DocumentReader::too_long_message(const std::string& where, std::uint64_t line) const {
  return str_cat(where, ":", line, ": line longer than ", options_.max_document_bytes,
                 " bytes, the limit of one document (`max_document_bytes`)");
}

std::uint64_t DocumentReader::line_number() const {
  const State& s = *state_;
  return s.reader->line_number() + (s.range != nullptr ? s.range->lines_before() : 0);
}

bool DocumentReader::next_table_row(Document* doc) {
  TableRows& table = *state_->table;
  std::string problem;
  for (;;) {
    switch (table.next(&doc->fields, &problem)) {
      case TableRows::Next::kEnd:
        return false;
      case TableRows::Next::kBadRecord:
        record_bad(problem);
        continue;
      case TableRows::Next::kRow:
        doc->source = state_->path;
        doc->line = 0;
        doc->input = next_input_ - 1;
        doc->input_line = table.row() + 1;
        return true;
    }
  }
}

void DocumentReader::record_bad(const std::string& message) {
  ++bad_records_;
  if (!options_.skip_bad_records) throw Error(message);
  if (reported_errors_.size() < options_.max_reported_errors) reported_errors_.push_back(message);
}

bool DocumentReader::next(Document* doc) {
  State& s = *state_;
  for (;;) {
    if (!s.reader && !s.table && !open_next_input()) return false;
    if (s.table) {
      if (next_table_row(doc)) return true;
      finished_inputs_bytes_ += s.table->bytes_read();
      s.table.reset();
      continue;
    }
    LineReader& reader = *s.reader;
    const std::string& where = reader.source().name();

    if (s.format == InputFormat::kTxt && options_.txt_document == TxtDocument::kFile) {
      if (!s.whole_file_done) {
        s.whole_file_done = true;
        std::string content;
        if (!reader.read_all(&content)) {
          record_bad(str_cat(where, ": longer than ", options_.max_document_bytes,
                             " bytes, the limit of one document (`max_document_bytes`)"));
        } else if (!simdjson::validate_utf8(content.data(), content.size())) {
          record_bad(str_cat(where, ": invalid UTF-8"));
        } else {
          doc->fields.resize(1);
          doc->fields[0] = std::move(content);
          doc->source = s.path;
          doc->line = 0;
          doc->input = next_input_ - 1;
          doc->input_line = 0;
          return true;
        }
      }
    } else if (s.format == InputFormat::kTxt) {
      std::string_view line;
      while (reader.next_line(&line)) {
        if (reader.too_long()) {
          record_bad(too_long_message(where, line_number()));
          continue;
        }
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (!simdjson::validate_utf8(line.data(), line.size())) {
          record_bad(str_cat(where, ":", line_number(), ": invalid UTF-8"));
          continue;
        }
        doc->fields.resize(1);
        doc->fields[0].assign(line);
        doc->source = s.path;
        doc->line = s.range == nullptr ? reader.line_number() : 0;
        doc->input = next_input_ - 1;
        doc->input_line = reader.line_number();
        return true;
      }
    } else {
      std::string_view line;
      while (reader.next_line(&line)) {
        if (reader.too_long()) {
          record_bad(too_long_message(where, line_number()));
          continue;
        }
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (is_blank(line)) continue;
        // The line stays in the reader's buffer, which keeps SIMDJSON_PADDING readable
        // bytes after it: no copy. The DOM parse (unlike on-demand) checks the whole
        // line, so trailing garbage cannot slip through.
        simdjson::dom::element root;
        const simdjson::error_code parse_error =
            s.parser.parse(line.data(), line.size(), false).get(root);
        if (parse_error) {
          record_bad(parse_error == simdjson::UTF8_ERROR ? str_cat(where, ":", line_number(), ": invalid UTF-8")
                                                         : str_cat(where, ":", line_number(), ": malformed JSON (",
                                                                   simdjson::error_message(parse_error), ")"));
          continue;
        }
        simdjson::dom::object object;
        if (root.get_object().get(object)) {
          record_bad(str_cat(where, ":", line_number(), ": expected a JSON object"));
          continue;
        }
        doc->fields.resize(options_.json_keys.size());
        bool good = true;
        for (std::size_t i = 0; i < options_.json_keys.size() && good; ++i) {
          const std::string& key = options_.json_keys[i];
          // {"text": "a", "text": "b"} is "b", as Megatron's json.loads reads it.
          const std::optional<simdjson::dom::element> value = last_member(object, key);
          std::string_view text;
          if (!value) {
            record_bad(str_cat(where, ":", line_number(), ": missing key '", key, "'"));
            good = false;
          } else if (value->get_string().get(text)) {
            record_bad(str_cat(where, ":", line_number(), ": key '", key, "' is not a string (it is ",
                               json_type_name(value->type()), ")"));
            good = false;
          } else {
            doc->fields[i].assign(text);
          }
        }
        if (!good) continue;
        doc->source = s.path;
        doc->line = s.range == nullptr ? reader.line_number() : 0;
        doc->input = next_input_ - 1;
        doc->input_line = reader.line_number();
        return true;
      }
    }

    finished_inputs_bytes_ += reader.source().raw_bytes_read();
    s.reader.reset();
  }
}

}  // namespace dufu::dataprep
