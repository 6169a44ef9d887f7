// Assertions on dufu::Error messages, so every test checks that errors name the
// place and say what was wrong, the same way (and on dufu::InternalError's, for the
// tests of DUFU_CHECKs).
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

// expect_error for a failed DUFU_CHECK: fn must throw dufu::InternalError.
inline std::string expect_internal_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const InternalError& e) {
    const std::string message = e.what();
    for (const auto& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos)
          << "message \"" << message << "\" lacks \"" << needle << "\"";
    }
    return message;
  }
  ADD_FAILURE() << "no dufu::InternalError thrown";
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

// The message of the dufu::InternalError (a failed DUFU_CHECK: a bug, not bad input)
// that `f` throws, or "no internal error"; a dufu::Error is not one and propagates.
template <typename F>
std::string internal_error_of(F&& f) {
  try {
    f();
  } catch (const InternalError& error) {
    return error.what();
  }
  return "no internal error";
}

}  // namespace dufu::testing
