// Helpers shared by the kernel tests: seeded inputs, float <-> double copies, and one
// tolerance comparison that reports the largest absolute and relative errors, so the
// test log shows how close each kernel is and not only whether it passed.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "dufu/trainer/device/device.h"

namespace dufu::trainer::testing {

using Vec = std::vector<double>;

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Model dimensions a kernel is run at; N = B * T rows.
struct Shape {
  const char* name;
  int B, T, C, NH, V, Vp;
  int N() const { return B * T; }
};

// Names the shape in test output instead of gtest's dump of its bytes.
inline void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.name << " (B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " V=" << s.V << " Vp=" << s.Vp
      << ")";
}

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

inline std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, vocab - 1);
  std::vector<std::int32_t> tokens(n);
  for (std::int32_t& t : tokens) t = dist(rng);
  return tokens;
}

inline Vec widen(const std::vector<float>& values) { return Vec(values.begin(), values.end()); }

// |got - want| <= atol + rtol * |want| element-wise.
struct Tolerance {
  double atol;
  double rtol;
};

// Returns true when every element is within tolerance (two NaNs count as equal: they
// mark entries a kernel must leave untouched). Prints the worst errors; the relative
// error ignores entries below 1e-3 of the largest reference, where it means nothing.
inline bool report_close(const std::string& label, const Vec& got, const Vec& want, Tolerance tol) {
  EXPECT_EQ(got.size(), want.size()) << label;
  if (got.size() != want.size()) return false;
  double scale = 0.0;
  for (const double w : want) {
    if (!std::isnan(w)) scale = std::max(scale, std::abs(w));
  }
  double max_abs = 0.0;
  double max_rel = 0.0;
  std::size_t failures = 0;
  std::size_t first_failure = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    const double err = std::abs(got[i] - want[i]);
    const bool ok = err <= tol.atol + tol.rtol * std::abs(want[i]);  // false for a lone NaN
    if (!ok && failures++ == 0) first_failure = i;
    if (std::isnan(err)) continue;
    max_abs = std::max(max_abs, err);
    if (std::abs(want[i]) >= 1e-3 * scale && want[i] != 0.0) max_rel = std::max(max_rel, err / std::abs(want[i]));
  }
  std::printf("  %-52s n=%-7zu max|ref|=%-9.3g max abs err=%-9.3g max rel err=%.3g\n", label.c_str(), got.size(), scale,
              max_abs, max_rel);
  EXPECT_EQ(failures, 0u) << label << ": first mismatch at " << first_failure << ": got " << got[first_failure]
                          << ", want " << want[first_failure] << " (atol " << tol.atol << ", rtol " << tol.rtol << ")";
  return failures == 0;
}

// The devices every kernel test runs on, present here or not: a device that is not
// present is reported and its rows are skipped with the reason, never silently left out.
struct TestDevice {
  const char* name;
  DeviceKind kind;
};
inline const TestDevice kTestDevices[] = {{"cpu", DeviceKind::kCpu}, {"cuda", DeviceKind::kCuda}};
inline void PrintTo(const TestDevice& device, std::ostream* os) { *os << device.name; }

// Runs a kernel on a device from host vectors: in() uploads a vector and returns its
// device copy; out() does the same and downloads it back into the vector at finish().
// One vector gets one device copy however often it is named, so in-place calls
// (out == in) see the same memory as on the host.
class DeviceArgs {
 public:
  explicit DeviceArgs(Device& device) : device_(device) {}
  DeviceArgs(const DeviceArgs&) = delete;
  DeviceArgs& operator=(const DeviceArgs&) = delete;

  template <typename T>
  const T* in(const std::vector<T>& host) {
    return static_cast<const T*>(copy_of(host.data(), host.size() * sizeof(T)));
  }
  template <typename T>
  T* out(std::vector<T>& host) {
    T* copy = static_cast<T*>(copy_of(host.data(), host.size() * sizeof(T)));
    outputs_[host.data()].host = host.data();
    return copy;
  }
  // in() for a const vector, out() for one the kernel may write.
  template <typename T>
  const T* arg(const std::vector<T>& host) {
    return in(host);
  }
  template <typename T>
  T* arg(std::vector<T>& host) {
    return out(host);
  }
  // Downloads every out() vector.
  void finish() {
    device_.synchronize();
    for (auto& [key, entry] : outputs_) {
      const Copy& copy = copies_.at(key);
      device_.download(entry.host, copy.memory.get(), copy.bytes);
    }
  }

 private:
  struct Release {
    Device* device;
    void operator()(void* memory) const { device->release(memory); }
  };
  struct Copy {
    std::unique_ptr<void, Release> memory;
    std::size_t bytes;
  };
  struct Output {
    void* host = nullptr;
  };
  void* copy_of(const void* host, std::size_t bytes) {
    auto found = copies_.find(host);
    if (found != copies_.end()) return found->second.memory.get();
    Copy copy{std::unique_ptr<void, Release>(device_.allocate(bytes), Release{&device_}), bytes};
    device_.upload(copy.memory.get(), host, bytes);
    return copies_.emplace(host, std::move(copy)).first->second.memory.get();
  }

  Device& device_;
  std::map<const void*, Copy> copies_;
  std::map<const void*, Output> outputs_;
};

}  // namespace dufu::trainer::testing
