// Tests for dufu::Error, dufu::InternalError, str_cat, errno_message and the
// DUFU_FAIL/DUFU_CHECK macros.
#include "dufu/common/error.h"

#include <cerrno>
#include <stdexcept>
#include <type_traits>
#include <string>

#include <gtest/gtest.h>

namespace dufu {
namespace {

TEST(StrCat, JoinsMixedTypes) {
  EXPECT_EQ(str_cat("a", 1, '-', 2.5, std::string("z")), "a1-2.5z");
}

TEST(ErrnoMessage, MatchesKnownErrors) {
  EXPECT_EQ(errno_message(ENOENT), "No such file or directory");
  EXPECT_EQ(errno_message(EACCES), "Permission denied");
  EXPECT_EQ(errno_message(ENOSPC), "No space left on device");
}

TEST(ErrnoMessage, UnknownErrorIsNotEmpty) {
  const std::string message = errno_message(123456);
  EXPECT_FALSE(message.empty());
  EXPECT_NE(message.find("123456"), std::string::npos) << message;
}

TEST(Fail, ThrowsErrorWithMessage) {
  try {
    DUFU_FAIL("cannot open '", "x.bin", "': ", errno_message(ENOENT));
    FAIL() << "DUFU_FAIL did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "cannot open 'x.bin': No such file or directory");
  }
}

TEST(Check, PassesSilentlyWhenTrue) {
  EXPECT_NO_THROW(DUFU_CHECK(1 + 1 == 2));
  EXPECT_NO_THROW(DUFU_CHECK(true, "never shown"));
}

TEST(Check, ThrowsWithConditionLocationAndDetail) {
  try {
    const int value = 3;
    DUFU_CHECK(value < 2, "value=", value);
    FAIL() << "DUFU_CHECK did not throw";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("internal check failed: value < 2"), std::string::npos) << what;
    EXPECT_NE(what.find("error_test.cc:"), std::string::npos) << what;
    EXPECT_NE(what.find(": value=3"), std::string::npos) << what;
    EXPECT_NE(what.find("a bug in dufu; please report it"), std::string::npos) << what;
    EXPECT_STREQ(e.condition(), "value < 2");
    EXPECT_NE(std::string(e.file()).find("error_test.cc"), std::string::npos) << e.file();
    EXPECT_GT(e.line(), 0);
  }
}

TEST(Check, WorksWithoutDetail) {
  try {
    DUFU_CHECK(false);
    FAIL() << "DUFU_CHECK did not throw";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("internal check failed: false at "), std::string::npos) << what;
    EXPECT_EQ(what.find(": ("), std::string::npos) << "no empty detail: " << what;
  }
}

// A bug is not bad input: code that catches dufu::Error (to add context, to fall back)
// does not catch a failed DUFU_CHECK, which reaches the tool's boundary as itself.
static_assert(!std::is_base_of_v<Error, InternalError>);
static_assert(!std::is_base_of_v<std::runtime_error, InternalError>);
TEST(Check, IsNotCaughtAsBadInput) {
  bool caught_as_error = false;
  bool caught_as_internal = false;
  try {
    try {
      DUFU_CHECK(2 < 1, "in the inner block");
    } catch (const Error&) {
      caught_as_error = true;
    }
  } catch (const InternalError&) {
    caught_as_internal = true;
  }
  EXPECT_FALSE(caught_as_error);
  EXPECT_TRUE(caught_as_internal);
  EXPECT_THROW(DUFU_FAIL("bad input"), Error);
}

}  // namespace
}  // namespace dufu
