// Assertions on dufu::Error messages, so every test checks that errors name the
// place and say what was wrong, the same way.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dufu/common/error.h"

namespace dufu::testing {

// Runs fn, which must throw dufu::Error; checks the message holds every needle and
// returns it.
inline std::string expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const auto& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos)
          << "message \"" << message << "\" lacks \"" << needle << "\"";
    }
    return message;
  }
  ADD_FAILURE() << "no dufu::Error thrown";
  return {};
}

// The message of the dufu::Error that `f` throws, or "no error".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace dufu::testing
