// The library names its options in messages as `name`, the way PreprocessOptions, its
// ReaderOptions and the Python package's keyword arguments spell them (`workers`,
// `json_keys`, `tokenizer_merges`), so that a Python caller reads the names it passes.
// The tools say their flags instead: with_flag_names turns each `name` it knows into
// the flag (--workers, --json-keys, --tokenizer-merges) where an error or a skipped
// record's message is printed, in dataprep and in train (whose --tokenizer flags are
// the same, tokenizer_flags.h). A name it does not know is left as it is.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dufu::tools {

inline std::string_view flag_of_option(std::string_view name) {
  struct Pair {
    std::string_view option, flag;
  };
  static constexpr Pair kFlags[] = {
      {"inputs", "--input"},
      {"output_prefix", "--output-prefix"},
      {"tokenizer_model", "--tokenizer-model"},
      {"tokenizer_merges", "--tokenizer-merges"},
      {"tokenizer_pattern", "--tokenizer-pattern"},
      {"json_keys", "--json-keys"},
      {"impl", "--impl"},
      {"layout", "--layout"},
      {"dtype", "--dtype"},
      {"append_eod", "--append-eod"},
      {"eod_id", "--eod-id"},
      {"txt_document", "--txt-document"},
      {"stdin_format", "--stdin-format"},
      {"max_document_bytes", "--max-document-bytes"},
      {"on_error", "--on-error"},
      {"workers", "--workers"},
      {"batch_bytes", "--batch-bytes"},
      {"shard", "--shard"},
  };
  for (const Pair& pair : kFlags) {
    if (pair.option == name) return pair.flag;
  }
  return {};
}

inline std::string with_flag_names(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  std::size_t at = 0;
  while (at < message.size()) {
    const std::size_t open = message.find('`', at);
    const std::size_t close = open == std::string_view::npos ? open : message.find('`', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view flag = flag_of_option(message.substr(open + 1, close - open - 1));
    if (flag.empty()) {
      out.append(message.substr(at, close - at));  // the closing ` may open a known name
      at = close;
      continue;
    }
    out.append(message.substr(at, open - at));
    out.append(flag);
    at = close + 1;
  }
  out.append(message.substr(at));
  return out;
}

}  // namespace dufu::tools
