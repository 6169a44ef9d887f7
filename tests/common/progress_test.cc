// Tests for Progress: what each mode writes, human units, percentages, rates that
// agree with the elapsed time, and exact counts under concurrent add().
#include "dufu/common/progress.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dufu/common/error.h"

namespace dufu {
namespace {

using std::chrono::milliseconds;

// An anonymous temporary file standing in for stderr; never a terminal.
class Stream {
 public:
  Stream() : file_(std::tmpfile()) {}
  ~Stream() {
    if (file_ != nullptr) std::fclose(file_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  std::FILE* get() const { return file_; }
  std::string text() const {
    std::fflush(file_);
    std::rewind(file_);
    std::string out;
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), file_)) > 0) out.append(buffer, n);
    std::fseek(file_, 0, SEEK_END);
    return out;
  }

 private:
  std::FILE* file_;
};

ProgressOptions options_for(const Stream& stream, ProgressOptions::Mode mode,
                            milliseconds interval) {
  ProgressOptions options;
  options.mode = mode;
  options.bar_interval = interval;
  options.line_interval = interval;
  options.stream = stream.get();
  return options;
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

std::vector<ProgressCounter> docs_and_mb() { return {{"docs", 1.0}, {"MB", 1e6}}; }

TEST(Progress, QuietPrintsNothing) {
  Stream stream;
  {
    ProgressOptions options = options_for(stream, ProgressOptions::Mode::kLines, milliseconds(0));
    options.quiet = true;
    Progress progress("job", docs_and_mb(), options);
    for (int i = 0; i < 100; ++i) progress.add(0, 1);
    progress.finish();
    EXPECT_EQ(progress.value(0), 100u);
  }
  EXPECT_EQ(stream.text(), "");
}

TEST(Progress, LinesModePrintsWhenDueAndOnFinish) {
  Stream stream;
  {
    Progress progress("job", docs_and_mb(),
                      options_for(stream, ProgressOptions::Mode::kLines, milliseconds(0)));
    // A zero interval makes every add() due.
    progress.add(0, 1);
    progress.add(1, 2'000'000);
    progress.add(0, 1);
    EXPECT_EQ(count(stream.text(), "\n"), 3u);
    progress.finish();
    progress.finish();
  }  // the destructor must not print again either
  const std::string text = stream.text();
  EXPECT_EQ(count(text, "\n"), 4u) << text;
  EXPECT_EQ(count(text, "job: "), 4u) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
  // The last line has the final values.
  const std::string last = text.substr(text.rfind("job: "));
  EXPECT_NE(last.find("2 docs"), std::string::npos) << last;
  EXPECT_NE(last.find("2.0 MB"), std::string::npos) << last;
}

TEST(Progress, LinesModeWaitsForInterval) {
  Stream stream;
  Progress progress("job", docs_and_mb(),
                    options_for(stream, ProgressOptions::Mode::kLines, milliseconds(3'600'000)));
  for (int i = 0; i < 1000; ++i) progress.add(0, 1);
  EXPECT_EQ(stream.text(), "");
  progress.finish();
  const std::string text = stream.text();
  EXPECT_EQ(count(text, "\n"), 1u) << text;
  EXPECT_NE(text.find("1.00k docs"), std::string::npos) << text;
}

TEST(Progress, LinesModePrintsAgainAfterInterval) {
  Stream stream;
  Progress progress("job", docs_and_mb(),
                    options_for(stream, ProgressOptions::Mode::kLines, milliseconds(50)));
  progress.add(0, 1);  // too early
  EXPECT_EQ(stream.text(), "");
  std::this_thread::sleep_for(milliseconds(60));
  progress.add(0, 1);
  progress.add(0, 1);  // the next one is 50 ms away again
  EXPECT_EQ(count(stream.text(), "\n"), 1u);
  std::this_thread::sleep_for(milliseconds(60));
  progress.add(0, 1);
  EXPECT_EQ(count(stream.text(), "\n"), 2u);
}

// Sets an environment variable for one scope, restoring the absence after.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnvironment() { ::unsetenv(name_); }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
};

TEST(Progress, EnvironmentIntervalOverridesTheCallers) {
  ScopedEnvironment interval("DUFU_PROGRESS_INTERVAL", "0.05");
  Stream stream;
  Progress progress("job", docs_and_mb(), options_for(stream, ProgressOptions::Mode::kLines, milliseconds(3'600'000)));
  progress.add(0, 1);
  EXPECT_EQ(stream.text(), "");
  std::this_thread::sleep_for(milliseconds(60));
  progress.add(0, 1);
  EXPECT_EQ(count(stream.text(), "\n"), 1u) << stream.text();
}

TEST(Progress, EnvironmentIntervalThatIsNotPositiveSecondsIsRefusedByName) {
  for (const char* bad : {"0", "-1", "fast", "1s", "nan", "inf"}) {
    ScopedEnvironment interval("DUFU_PROGRESS_INTERVAL", bad);
    Stream stream;
    try {
      Progress progress("job", docs_and_mb(), options_for(stream, ProgressOptions::Mode::kLines, milliseconds(50)));
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("DUFU_PROGRESS_INTERVAL='" + std::string(bad) + "'"), std::string::npos)
          << error.what();
    }
  }
}

TEST(Progress, BarModeRedrawsOneLine) {
  Stream stream;
  {
    Progress progress("job", docs_and_mb(),
                      options_for(stream, ProgressOptions::Mode::kBar, milliseconds(0)));
    progress.add(0, 5);
    progress.add(0, 5);
    const std::string during = stream.text();
    EXPECT_EQ(count(during, "\r"), 2u) << during;
    EXPECT_EQ(count(during, "\n"), 0u) << during;
  }
  const std::string text = stream.text();
  EXPECT_EQ(count(text, "\r"), 3u) << text;
  EXPECT_EQ(count(text, "\n"), 1u) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_NE(text.find("10 docs"), std::string::npos) << text;
}

TEST(Progress, AutoModeOnFileUsesLines) {
  Stream stream;
  {
    Progress progress("job", docs_and_mb(),
                      options_for(stream, ProgressOptions::Mode::kAuto, milliseconds(0)));
    progress.add(0, 1);
  }
  const std::string text = stream.text();
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(count(text, "\n"), 2u) << text;
}

TEST(Progress, RenderLineShowsHumanUnitsAndPercentage) {
  Stream stream;
  Progress progress("preprocess", {{"docs", 1.0}, {"MB", 1e6}, {"tokens", 1.0}},
                    options_for(stream, ProgressOptions::Mode::kLines, milliseconds(3'600'000)));
  progress.add(0, 1'234'567);
  progress.add(1, 123'456'789);
  progress.add(2, 45'600);
  std::string line = progress.render_line();
  EXPECT_EQ(line.rfind("preprocess: 1.23M docs (", 0), 0u) << line;
  EXPECT_NE(line.find(" docs/s) | 123.5 MB ("), std::string::npos) << line;
  EXPECT_NE(line.find(" MB/s) | 45.6k tokens ("), std::string::npos) << line;
  EXPECT_NE(line.find(" tokens/s) | 0:00:0"), std::string::npos) << line;
  EXPECT_EQ(line.find('%'), std::string::npos) << "no percentage without a total: " << line;

  progress.set_total(4'938'268);  // counter 0 is a quarter of the way
  line = progress.render_line();
  EXPECT_NE(line.find(" | 25.0% | 0:00:0"), std::string::npos) << line;

  progress.add(0, 3'703'701);
  progress.add(2, 1'230'000'000 - 45'600);
  line = progress.render_line();
  EXPECT_NE(line.find("4.94M docs"), std::string::npos) << line;
  EXPECT_NE(line.find("1.23G tokens"), std::string::npos) << line;
  EXPECT_NE(line.find(" | 100.0% | "), std::string::npos) << line;
}

TEST(Progress, SmallCountsAreWholeNumbers) {
  Stream stream;
  Progress progress("", {{"docs", 1.0}},
                    options_for(stream, ProgressOptions::Mode::kLines, milliseconds(3'600'000)));
  EXPECT_EQ(progress.render_line().rfind("0 docs (", 0), 0u) << progress.render_line();
  progress.add(0, 999);
  EXPECT_EQ(progress.render_line().rfind("999 docs (", 0), 0u) << progress.render_line();
  progress.add(0, 1);
  EXPECT_EQ(progress.render_line().rfind("1.00k docs (", 0), 0u) << progress.render_line();
}

// Parses "45.6k" style numbers back into a value.
double parse_human(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  switch (*end) {
    case 'k': value *= 1e3; break;
    case 'M': value *= 1e6; break;
    case 'G': value *= 1e9; break;
    case 'T': value *= 1e12; break;
    default: break;
  }
  return value;
}

TEST(Progress, RateMatchesElapsedTime) {
  Stream stream;
  Progress progress("job", {{"docs", 1.0}, {"MB", 1e6}},
                    options_for(stream, ProgressOptions::Mode::kLines, milliseconds(3'600'000)));
  std::this_thread::sleep_for(milliseconds(100));
  progress.add(0, 5'000'000);
  progress.add(1, 300'000'000);
  const double before = progress.elapsed_seconds();
  const std::string line = progress.render_line();
  const double after = progress.elapsed_seconds();
  ASSERT_GE(before, 0.1);

  const auto docs_open = line.find("docs (");
  ASSERT_NE(docs_open, std::string::npos) << line;
  const double docs_rate = parse_human(line.substr(docs_open + 6));
  // Three significant digits: allow rounding of half a unit in the last place.
  EXPECT_LE(docs_rate, 5e6 / before * 1.01) << line;
  EXPECT_GE(docs_rate, 5e6 / after * 0.99) << line;

  const auto mb_open = line.find("MB (");
  ASSERT_NE(mb_open, std::string::npos) << line;
  const double mb_rate = std::strtod(line.c_str() + mb_open + 4, nullptr);
  EXPECT_LE(mb_rate, 300.0 / before + 0.05) << line;
  EXPECT_GE(mb_rate, 300.0 / after - 0.05) << line;
}

TEST(Progress, ConcurrentAddsAreExact) {
  Stream stream;
  Progress progress("job", docs_and_mb(),
                    options_for(stream, ProgressOptions::Mode::kLines, milliseconds(1)));
  constexpr int kThreads = 4;
  constexpr int kAdds = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) {
        progress.add(0, 1);
        progress.add(1, 3);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  progress.finish();
  EXPECT_EQ(progress.value(0), std::uint64_t{kThreads} * kAdds);
  EXPECT_EQ(progress.value(1), std::uint64_t{kThreads} * kAdds * 3);
  // Every printed line is whole, and the last one has the final count.
  const std::string text = stream.text();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(count(text, "job: "), count(text, "\n")) << text;
  EXPECT_NE(text.substr(text.rfind("job: ")).find("200k docs"), std::string::npos) << text;
}

TEST(Progress, UnknownCounterIsAnInternalError) {
  Stream stream;
  ProgressOptions options = options_for(stream, ProgressOptions::Mode::kLines, milliseconds(0));
  options.quiet = true;
  Progress progress("job", docs_and_mb(), options);
  EXPECT_THROW(progress.add(2, 1), InternalError);  // a bug of the caller's, not bad input
  EXPECT_THROW(progress.value(2), InternalError);
}

}  // namespace
}  // namespace dufu
