// The division of a preprocess job into parts (preprocess_plan.h).
#include "dufu/dataprep/preprocess_plan.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "dufu/common/error.h"
#include "dufu/dataprep/line_range_source.h"

namespace dufu::dataprep {
namespace {

// Interval boundary k of `parts` over `total` bytes: floor(k * total / parts), exact
// for any sizes (the product is taken in 128 bits).
std::uint64_t boundary(int k, int parts, std::uint64_t total) {
  return static_cast<std::uint64_t>(static_cast<unsigned __int128>(total) * static_cast<unsigned>(k) /
                                    static_cast<unsigned>(parts));
}

// The part whose interval holds the middle of the global byte range [a, b): the
// number of inner boundaries t with 2t <= a + b (for an empty range, its position).
int part_of(std::uint64_t a, std::uint64_t b, int parts, std::uint64_t total) {
  const unsigned __int128 twice_middle = static_cast<unsigned __int128>(a) + b;
  int part = 0;
  // Boundaries increase with k: a binary search over 1..parts-1.
  int low = 1, high = parts - 1;
  while (low <= high) {
    const int k = low + (high - low) / 2;
    if (2 * static_cast<unsigned __int128>(boundary(k, parts, total)) <= twice_middle) {
      part = k;
      low = k + 1;
    } else {
      high = k - 1;
    }
  }
  return part;
}

std::uint64_t parse_number(std::string_view text, const char* what) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    DUFU_FAIL("internal error: bad ", what, " '", text, "' in a preprocess plan");
  }
  return value;
}

}  // namespace

std::vector<InputRange> PreprocessPlan::part_inputs(int part) const {
  std::vector<InputRange> ranges;
  for (const PlanPiece& piece : pieces) {
    if (piece.part != part) continue;
    ranges.push_back(
        InputRange{.path = inputs[piece.input].path, .whole = piece.whole, .begin = piece.begin, .end = piece.end});
  }
  return ranges;
}

std::uint64_t PreprocessPlan::part_bytes(int part) const {
  std::uint64_t bytes = 0;
  for (const PlanPiece& piece : pieces) {
    if (piece.part == part) bytes += piece.end - piece.begin;
  }
  return bytes;
}

std::string PreprocessPlan::inputs_text() const {
  // One line per input: size, cuttable flag, path length, path (any bytes).
  std::string text;
  for (const PlanInput& input : inputs) {
    text += str_cat(input.bytes, " ", input.cuttable ? 1 : 0, " ", input.path.size(), " ", input.path, "\n");
  }
  return text;
}

std::vector<PlanInput> parse_plan_inputs(const std::string& text) {
  std::vector<PlanInput> inputs;
  std::size_t at = 0;
  auto field = [&](const char* what) {
    const std::size_t space = text.find(' ', at);
    if (space == std::string::npos) DUFU_FAIL("internal error: a preprocess plan ends inside its ", what);
    const std::uint64_t value = parse_number(std::string_view(text).substr(at, space - at), what);
    at = space + 1;
    return value;
  };
  while (at < text.size()) {
    PlanInput input;
    input.bytes = field("size");
    input.cuttable = field("flag") != 0;
    const std::uint64_t length = field("path length");
    if (length > text.size() - at || at + length >= text.size() || text[at + length] != '\n') {
      DUFU_FAIL("internal error: a preprocess plan's path is cut short");
    }
    input.path = text.substr(at, length);
    at += length + 1;
    inputs.push_back(std::move(input));
  }
  return inputs;
}

PreprocessPlan divide_inputs(std::vector<PlanInput> inputs, int parts) {
  if (parts < 1) DUFU_FAIL("internal error: a job divided into ", parts, " parts");
  PreprocessPlan plan;
  plan.parts = parts;
  plan.inputs = std::move(inputs);
  std::uint64_t total = 0;
  for (const PlanInput& input : plan.inputs) total += input.bytes;
  std::uint64_t offset = 0;  // of the current input on the global byte axis
  for (std::size_t i = 0; i < plan.inputs.size(); ++i) {
    const PlanInput& input = plan.inputs[i];
    const std::uint64_t end = offset + input.bytes;
    std::vector<std::uint64_t> cuts;  // global positions strictly inside the file
    if (input.cuttable) {
      for (int k = 1; k < parts; ++k) {
        const std::uint64_t at = boundary(k, parts, total);
        if (at > offset && at < end && (cuts.empty() || cuts.back() != at)) cuts.push_back(at);
      }
    }
    if (cuts.empty()) {
      plan.pieces.push_back(PlanPiece{
          .input = i, .whole = true, .begin = 0, .end = input.bytes, .part = part_of(offset, end, parts, total)});
    } else {
      std::uint64_t from = offset;
      cuts.push_back(end);
      for (const std::uint64_t to : cuts) {
        plan.pieces.push_back(PlanPiece{.input = i,
                                        .whole = false,
                                        .begin = from - offset,
                                        .end = to - offset,
                                        .part = part_of(from, to, parts, total)});
        from = to;
      }
    }
    offset = end;
  }
  return plan;
}

std::vector<PlanInput> describe_inputs(const std::vector<std::string>& paths, const ReaderOptions& reader, int parts) {
  std::vector<PlanInput> inputs;
  std::uint64_t total = 0;
  inputs.reserve(paths.size());
  for (const std::string& path : paths) {
    if (path == "-") {
      DUFU_FAIL("standard input (-) cannot be divided among several processes; give files (or run one process)");
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) DUFU_FAIL("cannot open '", path, "': ", errno_message(errno));
    PlanInput input{.path = path, .bytes = S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : 0};
    total += input.bytes;
    inputs.push_back(std::move(input));
  }
  // Only a file that an interval boundary can fall inside needs opening (to see its
  // magic bytes); whether a boundary does depends on the sizes of all.
  std::uint64_t offset = 0;
  for (PlanInput& input : inputs) {
    const std::uint64_t end = offset + input.bytes;
    bool crossed = false;
    for (int k = 1; k < parts && !crossed; ++k) {
      const std::uint64_t at = boundary(k, parts, total);
      crossed = at > offset && at < end;
    }
    // A Parquet file is cut between row groups whatever its codecs (its pages are
    // compressed, not the file); an Arrow IPC file stays whole.
    const InputFormat format = crossed ? detect_input_format_of_file(input.path, reader.stdin_format) : InputFormat::kTxt;
    const bool line_documents = format == InputFormat::kJsonl ||
                                (format == InputFormat::kTxt && reader.txt_document == TxtDocument::kLine);
    input.cuttable = crossed && (format == InputFormat::kParquet || (line_documents && is_uncompressed_file(input.path)));
    offset = end;
  }
  return inputs;
}

}  // namespace dufu::dataprep
