// Error measures for comparing float tensors against a reference, shared by the
// model-level tests (tensor- and pipeline-parallel against the serial model).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

namespace dufu::testing {

inline double relative_error(double got, double want) {
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-30);
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

inline bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace dufu::testing
