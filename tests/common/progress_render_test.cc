// Tests of the progress text: the bar line fits every width from 2 to 250 columns
// (never more than columns - 1 characters, so a terminal never wraps it), keeps the
// most important parts as it shrinks, draws the fraction done, and gives an ETA from
// recent rates; the plain line of logs keeps its format. tests/common/progress_pty_test.py
// draws the real thing in pseudo-terminals of 40, 80 and 200 columns.
#include "dufu/common/progress_render.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>

#include "dufu/common/progress.h"

namespace dufu {
namespace {

// A preprocess run 42% of the way through 300 MB, rates in raw units per second.
ProgressSnapshot preprocess_snapshot() {
  ProgressSnapshot snapshot;
  snapshot.label = "preprocess";
  snapshot.counters = {{"MB", 1e6, 126'000'000, 5'600'000.0},
                       {"docs", 1.0, 12'300, 45'600.0},
                       {"tokens", 1.0, 31'000'000, 1'230'000.0}};
  snapshot.total = 300'000'000;
  snapshot.elapsed_seconds = 22.4;
  snapshot.eta_seconds = 31.1;
  return snapshot;
}

bool has(const std::string& line, const std::string& part) { return line.find(part) != std::string::npos; }

TEST(ProgressRender, BarLineNeverReachesTheLastColumn) {
  for (const bool known_total : {true, false}) {
    for (const bool finished : {false, true}) {
      ProgressSnapshot snapshot = preprocess_snapshot();
      if (!known_total) snapshot.total = 0;
      snapshot.finished = finished;
      for (std::size_t columns = 0; columns <= 250; ++columns) {
        const std::string line = render_progress_bar(snapshot, columns);
        EXPECT_LE(line.size() + 1, std::max<std::size_t>(columns, 1))
            << columns << " columns: \"" << line << "\"";
        EXPECT_EQ(line.find_first_of("\r\n\t\033"), std::string::npos) << line;
        for (const char c : line) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "non-ASCII in \"" << line << "\"";
      }
    }
  }
}

TEST(ProgressRender, WideTerminalShowsEverything) {
  const std::string line = render_progress_bar(preprocess_snapshot(), 200);
  EXPECT_EQ(line.rfind("preprocess:  [", 0), 0u) << line;
  // Rates and amounts are right-aligned in fixed widths (6 or 5 digits and the unit).
  EXPECT_TRUE(has(line, "]   42.0%  126.0/300.0 MB     5.6 MB/s  12.3k docs  45.6k docs/s  31.0M tokens  "
                        "1.23M tokens/s  ETA 0:00:31"))
      << line;
  // The bar is at its widest, 50 columns: "[" 48 cells "]", 42% of 48 = 20 cells filled.
  EXPECT_EQ(line.substr(13, 50), "[" + std::string(20, '=') + ">" + std::string(27, ' ') + "]") << line;
}

TEST(ProgressRender, NarrowTerminalsKeepPercentEtaBarAndRateFirst) {
  const ProgressSnapshot snapshot = preprocess_snapshot();
  const std::string at80 = render_progress_bar(snapshot, 80);
  EXPECT_EQ(at80.size(), 79u) << at80;  // the bar takes up the slack
  for (const char* part : {"preprocess:", "[===", " 42.0%", "126.0/300.0 MB", "5.6 MB/s", "ETA 0:00:31"}) {
    EXPECT_TRUE(has(at80, part)) << part << " missing at 80: " << at80;
  }
  EXPECT_FALSE(has(at80, "docs")) << at80;
  const std::string at40 = render_progress_bar(snapshot, 40);
  // 39 columns: the bar gets 18 ("[" 16 cells "]"), 42% of 16 cells is 6.
  EXPECT_EQ(at40, "[======>         ]   42.0%  ETA 0:00:31");
  const std::string at20 = render_progress_bar(snapshot, 20);
  EXPECT_EQ(at20, " 42.0%  ETA 0:00:31");
  EXPECT_EQ(render_progress_bar(snapshot, 7), " 42.0%");
  EXPECT_EQ(render_progress_bar(snapshot, 4), " 42");  // cut, never wrapped
  EXPECT_EQ(render_progress_bar(snapshot, 1), "");
}

TEST(ProgressRender, PartsKeepTheirWidthAsNumbersChange) {
  ProgressSnapshot snapshot = preprocess_snapshot();
  const std::string before = render_progress_bar(snapshot, 100);
  snapshot.counters[0].value = 7'500'000;  // "7.5" instead of "126.0"
  snapshot.counters[0].rate = 298'200'000;  // "298.2" instead of "5.6"
  const std::string after = render_progress_bar(snapshot, 100);
  EXPECT_EQ(after.size(), before.size()) << before << "\n" << after;
  EXPECT_EQ(before.find(" ETA "), after.find(" ETA ")) << before << "\n" << after;
  EXPECT_TRUE(has(after, "    2.5%    7.5/300.0 MB   298.2 MB/s")) << after;
}

TEST(ProgressRender, BarFillsWithTheFractionDone) {
  ProgressSnapshot snapshot = preprocess_snapshot();
  snapshot.counters[0].value = 0;
  EXPECT_TRUE(has(render_progress_bar(snapshot, 200), "[>" + std::string(47, ' ') + "]    0.0%"));
  snapshot.counters[0].value = snapshot.total - 1;  // 99.99...%: not yet full
  EXPECT_TRUE(has(render_progress_bar(snapshot, 200), std::string(47, '=') + ">]  100.0%"));
  snapshot.counters[0].value = snapshot.total;
  EXPECT_TRUE(has(render_progress_bar(snapshot, 200), "[" + std::string(48, '=') + "]  100.0%"));
  snapshot.counters[0].value = 2 * snapshot.total;  // a total that was too small
  EXPECT_TRUE(has(render_progress_bar(snapshot, 200), "[" + std::string(48, '=') + "]  100.0%"));
}

TEST(ProgressRender, WithoutATotalThereIsNoBarPercentOrEta) {
  ProgressSnapshot snapshot = preprocess_snapshot();
  snapshot.total = 0;
  const std::string line = render_progress_bar(snapshot, 200);
  EXPECT_EQ(line,
            "preprocess:   126.0 MB     5.6 MB/s  12.3k docs  45.6k docs/s  31.0M tokens  1.23M tokens/s  0:00:22");
  EXPECT_EQ(render_progress_bar(snapshot, 30), "preprocess:     5.6 MB/s");
}

TEST(ProgressRender, UnknownEtaAndTheFinishedLine) {
  ProgressSnapshot snapshot = preprocess_snapshot();
  snapshot.eta_seconds.reset();
  EXPECT_TRUE(has(render_progress_bar(snapshot, 200), "ETA -:--:--"));
  EXPECT_FALSE(has(render_progress_line(snapshot), "ETA"));
  snapshot.finished = true;
  snapshot.eta_seconds = 0.0;
  const std::string line = render_progress_bar(snapshot, 200);
  EXPECT_FALSE(has(line, "ETA")) << line;
  EXPECT_TRUE(has(line, "tokens/s  0:00:22")) << line;
}

TEST(ProgressRender, PlainLineKeepsItsFormat) {
  ProgressSnapshot snapshot = preprocess_snapshot();
  EXPECT_EQ(render_progress_line(snapshot),
            "preprocess: 126.0 MB (5.6 MB/s) | 12.3k docs (45.6k docs/s) | 31.0M tokens (1.23M tokens/s) | 42.0% | "
            "0:00:22 | ETA 0:00:31");
  snapshot.finished = true;
  const std::string last = render_progress_line(snapshot);
  EXPECT_EQ(last.substr(last.size() - 17), "| 42.0% | 0:00:22") << last;
}

TEST(ProgressRender, ClockRoundsToSeconds) {
  EXPECT_EQ(format_clock(0), "0:00:00");
  EXPECT_EQ(format_clock(59.6), "0:01:00");
  EXPECT_EQ(format_clock(3 * 3600 + 25 * 60 + 7), "3:25:07");
  EXPECT_EQ(format_clock(-5), "0:00:00");
  EXPECT_EQ(format_clock(1e30), "99999:59:59");
  EXPECT_EQ(format_clock(std::numeric_limits<double>::infinity()), "99999:59:59");
  EXPECT_EQ(format_clock(std::numeric_limits<double>::quiet_NaN()), "0:00:00");
}

// Progress feeds the renderer: rates over the recent window, the ETA from them, and
// the width it was told.
TEST(ProgressRender, ProgressGivesEtaFromTheRateOfWorkDone) {
  std::FILE* stream = std::tmpfile();
  ASSERT_NE(stream, nullptr);
  {
    ProgressOptions options;
    options.mode = ProgressOptions::Mode::kBar;
    options.bar_interval = std::chrono::milliseconds(3'600'000);
    options.stream = stream;
    options.columns = 60;
    Progress progress("job", {{"MB", 1e6}}, options);
    EXPECT_FALSE(has(progress.render_bar(200), "ETA")) << "no total: elapsed instead";
    progress.set_total(100'000'000);
    EXPECT_TRUE(has(progress.render_bar(200), "ETA -:--:--")) << progress.render_bar(200);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    progress.add(0, 25'000'000);
    const std::string line = progress.render_bar(200);
    const double elapsed = progress.elapsed_seconds();
    // A quarter done in `elapsed` seconds: three times as long to go.
    const auto eta_at = line.find("ETA ");
    ASSERT_NE(eta_at, std::string::npos) << line;
    const int seconds = std::stoi(line.substr(eta_at + 4 + 5, 2)) + 60 * std::stoi(line.substr(eta_at + 4 + 2, 2));
    EXPECT_NEAR(seconds, 3 * elapsed, 1.0) << line;
    EXPECT_TRUE(has(line, " 25.0%")) << line;
    progress.finish();
  }
  std::fseek(stream, 0, SEEK_END);
  const long size = std::ftell(stream);
  std::rewind(stream);
  std::string text(static_cast<std::size_t>(size), '\0');
  ASSERT_EQ(std::fread(text.data(), 1, text.size(), stream), text.size());
  std::fclose(stream);
  // Only the last line, at the width of the options, with the elapsed time.
  ASSERT_EQ(text.rfind("\r", 0), 0u) << text;
  const std::string line = text.substr(1, text.find("\033[K") - 1);
  EXPECT_EQ(line.size(), 59u) << line;
  EXPECT_FALSE(has(line, "ETA")) << line;
  EXPECT_TRUE(has(line, "0:00:00")) << line;
}

}  // namespace
}  // namespace dufu
