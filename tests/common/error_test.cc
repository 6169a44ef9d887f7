// Tests for dufu::Error, str_cat, errno_message and the DUFU_FAIL/DUFU_CHECK macros.
#include "dufu/common/error.h"

#include <cerrno>
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
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("internal check failed: value < 2"), std::string::npos) << what;
    EXPECT_NE(what.find("error_test.cc:"), std::string::npos) << what;
    EXPECT_NE(what.find("value=3"), std::string::npos) << what;
  }
}

TEST(Check, WorksWithoutDetail) {
  EXPECT_THROW(DUFU_CHECK(false), Error);
}

}  // namespace
}  // namespace dufu
