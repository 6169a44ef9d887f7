// Tests for logging: level parsing, filtering, line format, rank prefix, and reading
// DUFU_LOG_LEVEL (in a fresh copy of this test program, since it is read only once).
#include "dufu/common/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/fork_child.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

// Restores level and rank so tests do not leak settings into each other.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = log_level(); }
  void TearDown() override {
    set_log_level(saved_);
    set_log_rank(0, 1);
  }
  LogLevel saved_ = LogLevel::kInfo;
};

std::string capture(void (*body)()) {
  ::testing::internal::CaptureStderr();
  body();
  return ::testing::internal::GetCapturedStderr();
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(ParseLogLevel, AcceptsAllNamesCaseInsensitively) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("info"), LogLevel::kInfo);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_EQ(parse_log_level("error"), LogLevel::kError);
  EXPECT_EQ(parse_log_level("off"), LogLevel::kOff);
  EXPECT_EQ(parse_log_level("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("Warn"), LogLevel::kWarn);
}

TEST(ParseLogLevel, RejectsOthersNamingTheValue) {
  for (const char* bad : {"", "verbose", "warning", "info ", "2"}) {
    try {
      parse_log_level(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(LogTest, LevelFiltersMessages) {
  set_log_level(LogLevel::kWarn);
  EXPECT_FALSE(log_enabled(LogLevel::kDebug));
  EXPECT_FALSE(log_enabled(LogLevel::kInfo));
  EXPECT_TRUE(log_enabled(LogLevel::kWarn));
  EXPECT_TRUE(log_enabled(LogLevel::kError));
  const std::string out = capture([] {
    DUFU_LOG_INFO("DATA", "hidden");
    DUFU_LOG_WARN("DATA", "shown ", 1);
    DUFU_LOG_ERROR("CKPT", "shown ", 2);
    log_message(LogLevel::kDebug, "DATA", "hidden even without the macro");
  });
  EXPECT_EQ(out, "[dufu WARN DATA] shown 1\n[dufu ERROR CKPT] shown 2\n");
}

TEST_F(LogTest, OffSilencesEverything) {
  set_log_level(LogLevel::kOff);
  EXPECT_FALSE(log_enabled(LogLevel::kError));
  EXPECT_FALSE(log_enabled(LogLevel::kOff));
  const std::string out = capture([] {
    DUFU_LOG_ERROR("DATA", "nothing");
    log_message(LogLevel::kOff, "DATA", "nothing");
  });
  EXPECT_EQ(out, "");
}

TEST_F(LogTest, MacroDoesNotEvaluateArgumentsWhenDisabled) {
  set_log_level(LogLevel::kError);
  int evaluated = 0;
  auto touch = [&] { return ++evaluated; };
  DUFU_LOG_DEBUG("DATA", touch());
  EXPECT_EQ(evaluated, 0);
}

TEST_F(LogTest, DebugLineFormat) {
  set_log_level(LogLevel::kDebug);
  const std::string out = capture([] { DUFU_LOG_DEBUG("COMM", "x=", 42); });
  EXPECT_EQ(out, "[dufu DEBUG COMM] x=42\n");
}

TEST_F(LogTest, RankPrefixOnlyWithSeveralRanks) {
  set_log_level(LogLevel::kInfo);
  set_log_rank(3, 8);
  EXPECT_EQ(capture([] { DUFU_LOG_INFO("DATA", "hello"); }), "[rank 3] [dufu INFO DATA] hello\n");
  set_log_rank(0, 1);
  EXPECT_EQ(capture([] { DUFU_LOG_INFO("DATA", "hello"); }), "[dufu INFO DATA] hello\n");
}

TEST_F(LogTest, ConcurrentLinesDoNotInterleave) {
  set_log_level(LogLevel::kInfo);
  const std::string out = capture([] {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([t] {
        for (int i = 0; i < 200; ++i) DUFU_LOG_INFO("DATA", "thread ", t, " line ", i, " end");
      });
    }
    for (auto& thread : threads) thread.join();
  });
  EXPECT_EQ(count(out, "\n"), 800u);
  EXPECT_EQ(count(out, "[dufu INFO DATA] thread "), 800u);
  // Each line is whole: starts with the prefix and ends with " end".
  std::size_t start = 0;
  while (start < out.size()) {
    const auto end = out.find('\n', start);
    const std::string line = out.substr(start, end - start);
    ASSERT_EQ(line.rfind("[dufu INFO DATA] thread ", 0), 0u) << line;
    ASSERT_TRUE(line.ends_with(" end")) << line;
    start = end + 1;
  }
}

// The environment is read once per process, so each case runs this program again
// with DUFU_LOG_LEVEL set and only the child test below selected.
struct ChildResult {
  int exit_code = -1;
  std::string stderr_text;
};

ChildResult run_child(const char* level_value, const char* expected) {
  dufu::testing::TempDir dir;
  const std::string err_path = dir.file("stderr.txt");
  ChildResult result;
  result.exit_code = dufu::testing::run_in_child([&] {
    const int err = ::open(err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    const int null = ::open("/dev/null", O_WRONLY);
    if (err < 0 || null < 0) return 120;
    ::dup2(err, STDERR_FILENO);
    ::dup2(null, STDOUT_FILENO);
    ::setenv("DUFU_LOG_LEVEL", level_value, 1);
    ::setenv("DUFU_LOG_TEST_EXPECT", expected, 1);
    const char* argv[] = {"common_test", "--gtest_filter=LogEnvChild.*", nullptr};
    ::execv("/proc/self/exe", const_cast<char* const*>(argv));
    return 121;
  });
  result.stderr_text = dufu::testing::read_all(err_path);
  return result;
}

// Only does something when started by run_child.
TEST(LogEnvChild, LevelFromEnvironment) {
  const char* expected = std::getenv("DUFU_LOG_TEST_EXPECT");
  if (expected == nullptr) GTEST_SKIP() << "runs only as a child of LogEnvironment tests";
  EXPECT_EQ(log_level(), parse_log_level(expected));
  EXPECT_EQ(log_level(), parse_log_level(expected));  // read once: no second warning
  DUFU_LOG_ERROR("TEST", "marker");
}

TEST(LogEnvironment, ValidValueIsUsed) {
  const ChildResult r = run_child("DeBuG", "debug");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(count(r.stderr_text, "DUFU_LOG_LEVEL"), 0u) << r.stderr_text;
  EXPECT_EQ(count(r.stderr_text, "[dufu ERROR TEST] marker"), 1u) << r.stderr_text;
}

TEST(LogEnvironment, OffSilencesEvenErrors) {
  const ChildResult r = run_child("off", "off");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(count(r.stderr_text, "marker"), 0u) << r.stderr_text;
}

TEST(LogEnvironment, InvalidValueWarnsOnceAndUsesInfo) {
  const ChildResult r = run_child("loud", "info");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(count(r.stderr_text, "DUFU_LOG_LEVEL='loud'"), 1u) << r.stderr_text;
  EXPECT_EQ(count(r.stderr_text, "[dufu WARN"), 1u) << r.stderr_text;
  EXPECT_EQ(count(r.stderr_text, "[dufu ERROR TEST] marker"), 1u) << r.stderr_text;
}

TEST(LogEnvironment, EmptyValueMeansInfo) {
  const ChildResult r = run_child("", "info");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(count(r.stderr_text, "DUFU_LOG_LEVEL"), 0u) << r.stderr_text;
}

}  // namespace
}  // namespace dufu
