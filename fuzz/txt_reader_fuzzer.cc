// The txt document reader (dataprep preprocess on .txt inputs), one document per line
// or per file. For an input read as it is, the documents must be exactly the input
// split at '\n' (one '\r' before it dropped), with each line over the limit or not
// UTF-8 counted as a bad record at its line number, whatever the line lengths are
// against the reader's buffer.
#include <simdjson.h>

#include <string>
#include <string_view>
#include <vector>

#include "document_input.h"
#include "dufu/dataprep/document_reader.h"
#include "fuzz_input.h"

namespace {

using dufu::fuzz::fuzz_require;

struct Expected {
  std::vector<std::string_view> documents;
  std::vector<std::uint64_t> lines;
  std::uint64_t bad = 0;
};

Expected split_lines(std::string_view input, std::size_t limit) {
  Expected expected;
  std::uint64_t line_number = 0;
  while (!input.empty()) {
    const std::size_t newline = input.find('\n');
    std::string_view line = input.substr(0, newline);
    input.remove_prefix(newline == std::string_view::npos ? input.size() : newline + 1);
    ++line_number;
    if (line.size() > limit) {
      ++expected.bad;
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!simdjson::validate_utf8(line.data(), line.size())) {
      ++expected.bad;
      continue;
    }
    expected.documents.push_back(line);
    expected.lines.push_back(line_number);
  }
  return expected;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::dataprep;
  using namespace dufu::fuzz;
  const std::string path = write_input("input.txt", data, size);
  ReaderOptions options;
  options.txt_document = size_bit(size, 0) ? TxtDocument::kFile : TxtDocument::kLine;
  options.max_document_bytes = size_bit(size, 1) ? kShortDocumentLimit : kDefaultMaxDocumentBytes;
  options.skip_bad_records = size_bit(size, 2);

  std::vector<Document> documents;
  std::uint64_t bad = 0;
  const bool read_all = refused_cleanly_or_parsed([&] {
    DocumentReader reader({path}, options);
    Document document;
    while (reader.next(&document)) {
      for (const std::string& field : document.fields) {
        fuzz_require(field.size() <= options.max_document_bytes, "a document is longer than the limit");
        fuzz_require(simdjson::validate_utf8(field.data(), field.size()), "a document is not UTF-8");
      }
      fuzz_require(document.fields.size() == 1, "a txt document has more than one field");
      documents.push_back(document);
    }
    bad = reader.bad_records();
    fuzz_require(reader.reported_errors().size() <= std::min<std::uint64_t>(bad, options.max_reported_errors),
                 "more errors reported than bad records");
  });

  if (!is_plain(data, size)) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (options.txt_document == TxtDocument::kFile) {
    const bool good = size <= options.max_document_bytes && simdjson::validate_utf8(input.data(), input.size());
    fuzz_require(read_all == (good || options.skip_bad_records), "a whole-file document's verdict is wrong");
    if (read_all) {
      fuzz_require(documents.size() == (good ? 1 : 0) && bad == (good ? 0 : 1), "wrong whole-file document count");
      fuzz_require(!good || documents[0].fields[0] == input, "the whole-file document is not the file");
    }
    return 0;
  }
  const Expected expected = split_lines(input, options.max_document_bytes);
  fuzz_require(read_all == (expected.bad == 0 || options.skip_bad_records), "a line's verdict is wrong");
  if (!read_all) return 0;
  fuzz_require(bad == expected.bad, "wrong number of bad lines");
  fuzz_require(documents.size() == expected.documents.size(), "wrong number of line documents");
  for (std::size_t i = 0; i < documents.size(); ++i) {
    fuzz_require(documents[i].fields[0] == expected.documents[i], "a line document differs from the line");
    fuzz_require(documents[i].line == expected.lines[i], "a line document has the wrong line number");
  }
  return 0;
}
