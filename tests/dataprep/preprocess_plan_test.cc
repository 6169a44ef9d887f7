// The division of a preprocess job (preprocess_plan.h) and the byte ranges it reads
// (line_range_source.h), against plain references: the interval boundaries written
// out, a whole file split at '\n' by hand, and the reader over the whole file.
#include "dufu/dataprep/preprocess_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/document_reader.h"
#include "dufu/dataprep/line_range_source.h"
#include "support/temp_dir.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::TempDir;
using dufu::testing::write_all;

// floor(k * total / parts), the k-th interval boundary, by long division in doubles
// checked exactly (sizes here are small).
std::uint64_t naive_boundary(int k, int parts, std::uint64_t total) { return total * k / parts; }

TEST(PreprocessPlan, PiecesTileTheInputsAndEachLiesInItsInterval) {
  std::mt19937_64 random(14);
  for (int trial = 0; trial < 400; ++trial) {
    const int parts = 1 + static_cast<int>(random() % 9);
    std::vector<PlanInput> inputs(1 + random() % 8);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      inputs[i].path = str_cat("f", i);
      inputs[i].bytes = random() % 4 == 0 ? 0 : random() % 100000;
      inputs[i].cuttable = random() % 3 != 0;
      total += inputs[i].bytes;
    }
    const PreprocessPlan plan = divide_inputs(inputs, parts);
    std::vector<std::uint64_t> boundaries;
    for (int k = 0; k <= parts; ++k) boundaries.push_back(naive_boundary(k, parts, total));
    std::uint64_t offset = 0;
    std::size_t at = 0;
    int last_part = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      std::uint64_t covered = 0;
      for (; at < plan.pieces.size() && plan.pieces[at].input == i; ++at) {
        const PlanPiece& piece = plan.pieces[at];
        ASSERT_EQ(piece.begin, covered) << "trial " << trial;
        ASSERT_GE(piece.part, last_part);
        last_part = piece.part;
        const std::uint64_t a = offset + piece.begin, b = offset + piece.end;
        if (!piece.whole) {
          ASSERT_TRUE(inputs[i].cuttable);
          // A cut piece lies inside its part's interval.
          EXPECT_GE(a, boundaries[static_cast<std::size_t>(piece.part)]) << "trial " << trial;
          EXPECT_LE(b, boundaries[static_cast<std::size_t>(piece.part) + 1]) << "trial " << trial;
        } else {
          EXPECT_EQ(piece.end, inputs[i].bytes);
          // A whole one goes to the interval that holds its middle.
          int expected = 0;
          for (int k = 1; k < parts; ++k) {
            if (2 * boundaries[static_cast<std::size_t>(k)] <= a + b) expected = k;
          }
          EXPECT_EQ(piece.part, expected) << "trial " << trial;
        }
        covered = piece.end;
      }
      ASSERT_EQ(covered, inputs[i].bytes) << "trial " << trial << " input " << i;
      offset += inputs[i].bytes;
    }
    ASSERT_EQ(at, plan.pieces.size());
    // All cuttable: every part gets exactly its interval.
    bool all_cuttable = true;
    for (const auto& input : inputs) all_cuttable = all_cuttable && (input.cuttable || input.bytes == 0);
    if (all_cuttable && total > 0) {
      for (int k = 0; k < parts; ++k) {
        EXPECT_EQ(plan.part_bytes(k),
                  boundaries[static_cast<std::size_t>(k) + 1] - boundaries[static_cast<std::size_t>(k)])
            << "trial " << trial;
      }
    }
    EXPECT_EQ(parse_plan_inputs(plan.inputs_text()), inputs);
  }
}

TEST(PreprocessPlan, StandardInputCannotBeDivided) {
  try {
    describe_inputs({"-"}, ReaderOptions{}, 2);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("standard input (-) cannot be divided"), std::string::npos);
  }
}

// Text of random lines: empty ones, long ones, '\r\n' ones, maybe no final '\n'.
std::string random_lines(std::mt19937_64& random) {
  std::string text;
  const std::size_t lines = random() % 60;
  for (std::size_t i = 0; i < lines; ++i) {
    const std::size_t length = random() % 5 == 0 ? random() % 3000 : random() % 40;
    for (std::size_t j = 0; j < length; ++j) text += static_cast<char>('a' + random() % 26);
    if (random() % 7 == 0) text += '\r';
    if (i + 1 < lines || random() % 2 == 0) text += '\n';
  }
  return text;
}

std::string read_range(LineRangeSource& source) {
  std::string out;
  char block[777];
  for (std::size_t n; (n = source.read(block, sizeof(block))) > 0;) out.append(block, n);
  return out;
}

TEST(LineRangeSource, RangesAtAnyCutsDeliverEachLineOnceAndCountLinesBefore) {
  TempDir dir;
  std::mt19937_64 random(41);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_lines(random);
    const std::string path = dir.file("t.txt");
    write_all(path, text);
    std::vector<std::uint64_t> cuts{0, text.size()};
    for (std::size_t c = random() % 6; c > 0; --c) cuts.push_back(text.empty() ? 0 : random() % (text.size() + 1));
    std::sort(cuts.begin(), cuts.end());
    std::string joined;
    std::uint64_t delivered = 0;
    for (std::size_t r = 0; r + 1 < cuts.size(); ++r) {
      LineRangeSource source(path, cuts[r], cuts[r + 1]);
      const std::string got = read_range(source);
      // It starts at a line start and ends at a line end (or the end of the file).
      const std::size_t at = joined.size();
      EXPECT_TRUE(got.empty() || at == 0 || text[at - 1] == '\n') << "trial " << trial;
      EXPECT_TRUE(got.empty() || got.back() == '\n' || at + got.size() == text.size()) << "trial " << trial;
      // The lines before it, counted by hand.
      EXPECT_EQ(source.lines_before(), static_cast<std::uint64_t>(std::count(text.begin(), text.begin() + at, '\n')));
      // The lines it owns are the ones that start in [begin, end).
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (i == 0 || got[i - 1] == '\n') {
          EXPECT_GE(at + i, cuts[r]) << "trial " << trial;
          EXPECT_LT(at + i, cuts[r + 1]) << "trial " << trial;
        }
      }
      joined += got;
      delivered += source.raw_bytes_read();
    }
    EXPECT_EQ(joined, text) << "trial " << trial;
    EXPECT_EQ(delivered, text.size());
  }
}

TEST(LineRangeSource, TheReaderNamesTheLineInTheFile) {
  TempDir dir;
  std::string text;
  for (int i = 1; i <= 500; ++i)
    text += i == 321 ? std::string("{\"text\": [1]}\n") : str_cat("{\"text\": \"line ", i, "\"}\n");
  const std::string path = dir.file("t.jsonl");
  write_all(path, text);
  auto first_error = [](DocumentReader reader) {
    Document document;
    try {
      while (reader.next(&document)) {
      }
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::string whole = first_error(DocumentReader(std::vector<std::string>{path}, ReaderOptions{}));
  EXPECT_EQ(whole, path + ":321: key 'text' is not a string (it is an array)");
  const std::uint64_t cut = text.size() / 2 + 3;  // inside a line before line 321
  std::vector<InputRange> ranges{{.path = path, .whole = false, .begin = 0, .end = cut},
                                 {.path = path, .whole = false, .begin = cut, .end = text.size()}};
  EXPECT_EQ(first_error(DocumentReader(ranges, ReaderOptions{})), whole);
  EXPECT_EQ(first_error(DocumentReader(std::vector<InputRange>{ranges[1]}, ReaderOptions{})), whole);
}

}  // namespace
}  // namespace dufu::dataprep
