// The jsonl document reader (dataprep preprocess on .jsonl inputs): one JSON object
// per line parsed in place in the line buffer (simdjson reads up to its padding past
// the line), text from one or two keys, bad records thrown or skipped. Every document
// it returns must be UTF-8, within the limit, with one field per key, at a line
// number that grows.
#include <simdjson.h>

#include <string>
#include <vector>

#include "document_input.h"
#include "dufu/dataprep/document_reader.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::dataprep;
  using namespace dufu::fuzz;
  const std::string path = write_input("input.jsonl", data, size);
  ReaderOptions options;
  options.skip_bad_records = size_bit(size, 0);
  if (size_bit(size, 1)) options.json_keys = {"text", "meta"};
  options.max_document_bytes = size_bit(size, 2) ? kShortDocumentLimit : kDefaultMaxDocumentBytes;

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
