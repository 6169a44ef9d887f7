// Error measures for comparing floats and float tensors against a reference, shared
// by the model-level tests (the PyTorch comparison, checkpoints, tensor- and
// pipeline-parallel against the serial model, data-parallel training).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

namespace dufu::testing {

// |got - want| / |want|.
inline double relative_error(double got, double want) {
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-30);
}

// For EXPECT_PRED_FORMAT3 (see EXPECT_RELATIVE_NEAR): passes when |got - want| <=
// tolerance x |want|, and otherwise says both values and their relative error.
inline ::testing::AssertionResult relatively_near(const char* got_text, const char* want_text,
                                                  const char* tolerance_text, double got, double want,
                                                  double tolerance) {
  const double error = relative_error(got, want);
  if (error <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got_text << " = " << got << " is not within " << tolerance_text << " = "
                                       << tolerance << " relative of " << want_text << " = " << want
                                       << " (relative error " << error << ")";
}

// The difference between `got` and `want` is at most `tolerance` times |want|.
#define EXPECT_RELATIVE_NEAR(got, want, tolerance) \
  EXPECT_PRED_FORMAT3(::dufu::testing::relatively_near, got, want, tolerance)

// Differences of one tensor against its reference. The scale is the reference's
// largest magnitude: gradients of different tensors differ by orders of magnitude,
// and a tolerance relative to each tensor's own scale treats them alike.
struct Difference {
  double max_abs = 0;  // max |got - want|
  double max_rel = 0;  // max |got - want| / |want| over entries above 1% of the scale
  double scale = 0;    // max |want|
  double scaled() const { return max_abs / std::max(scale, 1e-30); }
};

// The Difference of got against want over their common length (a size mismatch is a
// test failure); a NaN difference makes max_abs and max_rel infinite.
inline Difference tensor_difference(std::span<const float> got, std::span<const float> want) {
  EXPECT_EQ(got.size(), want.size());
  Difference diff;
  const std::size_t n = std::min(got.size(), want.size());
  for (std::size_t i = 0; i < n; ++i) diff.scale = std::max(diff.scale, std::fabs(static_cast<double>(want[i])));
  for (std::size_t i = 0; i < n; ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    // A NaN must fail the comparison, and max() would drop it.
    if (std::isnan(error)) {
      diff.max_abs = diff.max_rel = std::numeric_limits<double>::infinity();
      return diff;
    }
    diff.max_abs = std::max(diff.max_abs, error);
    if (std::fabs(want[i]) > 0.01 * diff.scale) diff.max_rel = std::max(diff.max_rel, error / std::fabs(want[i]));
  }
  return diff;
}

// max |got - want| / max |want|; infinity for a NaN or a size mismatch.
inline double scaled_error(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double scale = 0.0;
  double error = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    const double difference = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (std::isnan(difference)) return std::numeric_limits<double>::infinity();
    error = std::max(error, difference);
  }
  return error / std::max(scale, 1e-30);
}

// max |got - want| over elements of equal-sized spans (a size mismatch is a test
// failure, and only the common length is compared); infinity for a NaN.
inline double largest_difference(std::span<const float> got, std::span<const float> want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double difference = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (std::isnan(difference)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, difference);
  }
  return worst;
}

inline bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace dufu::testing
