// The jsonl document reader (dataprep preprocess on .jsonl inputs): one JSON object
// per line parsed in place in the line buffer (simdjson reads up to its padding past
// the line), text from one or two keys, bad records thrown or skipped. Every document
// it returns must be UTF-8, within the limit, with one field per key, at a line
// number that grows, and hold what Python's json.loads (Megatron's reader) gives for
// its line: each key's last value when a key is given twice (a dict filled in order).
#include <simdjson.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "document_input.h"
#include "dufu/dataprep/document_reader.h"
#include "fuzz_input.h"

namespace {

using dufu::fuzz::fuzz_require;

// Line `number` (from 1) of the input, without its '\r\n' or '\n'.
std::string_view input_line(std::string_view input, std::uint64_t number) {
  std::size_t begin = 0;
  for (std::uint64_t line = 1; line < number; ++line) {
    const std::size_t newline = input.find('\n', begin);
    if (newline == std::string_view::npos) return {};
    begin = newline + 1;
  }
  std::string_view line = input.substr(begin, input.find('\n', begin) - begin);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// The document as json.loads reads its line: the members put into a map in order, a
// later one replacing an earlier one of the same key.
void check_as_python_reads(std::string_view line, const std::vector<std::string>& keys,
                           const std::vector<std::string>& fields) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(line);
  simdjson::dom::object object;
  fuzz_require(!parser.parse(padded).get_object().get(object),
               "a document's line is not a JSON object");
  std::map<std::string, std::string_view, std::less<>> as_dict;
  for (const simdjson::dom::key_value_pair member : object) {
    std::string_view text;
    as_dict.insert_or_assign(std::string(member.key), member.value.get_string().get(text) ? std::string_view() : text);
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto found = as_dict.find(keys[i]);
    fuzz_require(found != as_dict.end() && found->second == fields[i],
                 "a document's field is not the value json.loads gives its key (the last of equal keys)");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::dataprep;
  using namespace dufu::fuzz;
  const std::string path = write_input("input.jsonl", data, size);
  ReaderOptions options;
  options.skip_bad_records = size_bit(size, 0);
  if (size_bit(size, 1)) options.json_keys = {"text", "meta"};
  options.max_document_bytes = size_bit(size, 2) ? kShortDocumentLimit : kDefaultMaxDocumentBytes;

  const std::string_view input(reinterpret_cast<const char*>(data), size);
  // Compressed input is detected from its magic bytes: its lines are not the input's.
  const bool plain = !input.starts_with("\x28\xb5\x2f\xfd") && !input.starts_with("\x1f\x8b");
  refused_cleanly_or_parsed([&] {
    DocumentReader reader({path}, options);
    Document document;
    std::uint64_t previous_line = 0;
    std::uint64_t documents = 0;
    while (reader.next(&document)) {
      ++documents;
      fuzz_require(document.fields.size() == options.json_keys.size(), "a document lacks a field per key");
      for (const std::string& field : document.fields) {
        // A JSON string is never longer than the line it is in.
        fuzz_require(field.size() <= options.max_document_bytes, "a document is longer than the limit");
        fuzz_require(simdjson::validate_utf8(field.data(), field.size()), "a document is not UTF-8");
      }
      fuzz_require(document.line > previous_line, "document line numbers do not grow");
      if (plain) check_as_python_reads(input_line(input, document.line), options.json_keys, document.fields);
      previous_line = document.line;
    }
    fuzz_require(documents <= previous_line, "more documents than lines");
    fuzz_require(reader.reported_errors().size() <=
                     std::min<std::uint64_t>(reader.bad_records(), options.max_reported_errors),
                 "more errors reported than bad records");
    fuzz_require(options.skip_bad_records || reader.bad_records() == 0, "bad records counted without skipping");
  });
  return 0;
}
