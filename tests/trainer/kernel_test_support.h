// Helpers shared by the kernel tests: seeded inputs, float <-> double copies, and one
// tolerance comparison that reports the largest absolute and relative errors, so the
// test log shows how close each kernel is and not only whether it passed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <source_location>
#include <string>
#include <type_traits>
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

// Documents packed into B rows of T (document masking): each row's documents of random
// lengths from 1 to max(T / 3, 2) (row 0 one document when B > 1, as unpacked rows are),
// as document_starts [B, T] (where each token's document starts in its row) and the
// positions [B, T] in the documents.
struct PackedRows {
  std::vector<std::int32_t> document_starts, positions;
};
inline PackedRows packed_rows(int B, int T, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(1, std::max(T / 3, 2));
  PackedRows rows;
  for (int b = 0; b < B; ++b) {
    int start = 0;
    int next = b == 0 && B > 1 ? T : length(rng);
    for (int t = 0; t < T; ++t) {
      if (t == next) {
        start = t;
        next = t + length(rng);
      }
      rows.document_starts.push_back(start);
      rows.positions.push_back(t - start);
    }
  }
  return rows;
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

// The sentinel written around every device copy, one element of the copy's type: a
// NaN with a payload no kernel computes for the floating-point types (a kernel that
// reads one past an input gets NaN in its answer), and 0xDEADBEEF-like words, negative
// as ints (a token or target read past its buffer is out of range), for the others.
template <typename T>
std::uint64_t sentinel_bits() {
  if constexpr (std::is_same_v<T, float>) return 0x7fdeadbeu;
  if constexpr (std::is_same_v<T, double>) return 0x7ffdeadbeefdeadbull;
  if constexpr (sizeof(T) == 2) return 0xffdbu;  // a bf16 NaN, for bf16 bits
  if constexpr (sizeof(T) == 1) return 0xdbu;
  if constexpr (sizeof(T) == 4) return 0xdeadbeefu;
  return 0xdeadbeefdeadbeefull;
}
template <typename T>
const char* element_type_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, double>) return "fp64";
  if constexpr (std::is_same_v<T, std::uint16_t>) return "bf16 bits";
  if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  return "element";
}

// Runs a kernel on a device from host vectors: in() uploads a vector and returns its
// device copy; out() does the same and downloads it back into the vector at finish().
// One vector gets one device copy however often it is named, so in-place calls
// (out == in) see the same memory as on the host.
//
// Sentinels (as ggml's test-backend-ops puts around its tensors): every copy, input or
// output, sits between two guard regions of kGuardBytes filled with sentinel_bits<T>(),
// and an input (a vector only ever named by in()) must come back as it went: finish()
// (or the destructor, when a runner has no outputs) downloads each copy with its
// guards through the device, never dereferencing device memory, and fails the running
// test naming the test, the buffer (where the runner named it, its type and size) and
// the first element written outside what the kernel may write. A runner that hands
// every buffer of every kernel call to a DeviceArgs gets this for all its rows; an op
// that writes an input in place names that buffer with out().
class DeviceArgs {
 public:
  // A multiple of kTensorAlignmentBytes, so a copy is as aligned as an allocation (the
  // CUDA norms take float4), and of every element size.
  static constexpr std::size_t kGuardBytes = kTensorAlignmentBytes;

  explicit DeviceArgs(Device& device) : device_(device) {}
  DeviceArgs(const DeviceArgs&) = delete;
  DeviceArgs& operator=(const DeviceArgs&) = delete;
  // Checks what finish() did not, without downloading; a check that fails is a test
  // failure, never an exception out of a destructor.
  ~DeviceArgs() {
    if (!unchecked_ || std::uncaught_exceptions() > 0) return;
    try {
      device_.synchronize();
      for (auto& [key, copy] : copies_) check(copy, nullptr);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "kernel sentinels: the check of " << copies_.size() << " buffers failed: " << error.what();
    }
  }

  template <typename T>
  const T* in(const std::vector<T>& host, std::source_location where = std::source_location::current()) {
    return static_cast<const T*>(copy_of(host, where, false));
  }
  template <typename T>
  T* out(std::vector<T>& host, std::source_location where = std::source_location::current()) {
    return static_cast<T*>(copy_of(host, where, true));
  }
  // in() for a const vector, out() for one the kernel may write.
  template <typename T>
  const T* arg(const std::vector<T>& host, std::source_location where = std::source_location::current()) {
    return in(host, where);
  }
  template <typename T>
  T* arg(std::vector<T>& host, std::source_location where = std::source_location::current()) {
    return out(host, where);
  }
  // Downloads every out() vector and checks every copy's sentinels (and that inputs
  // are unchanged).
  void finish() {
    device_.synchronize();
    for (auto& [key, copy] : copies_) check(copy, copy.output ? const_cast<void*>(key) : nullptr);
    unchecked_ = false;
  }

 private:
  struct Release {
    Device* device;
    void operator()(void* memory) const { device->release(memory); }
  };
  struct Copy {
    std::unique_ptr<void, Release> memory;  // guard, the copy, guard
    std::vector<unsigned char> image;       // what was uploaded: guards and the host's bytes
    std::size_t bytes;                      // of the copy alone
    std::size_t element_bytes;
    const char* type;
    std::source_location where;  // where the runner first named it: the call and column of the argument
    bool output;                 // named by out(): the kernel may write it
    bool reported = false;       // one failure per buffer, not one per finish()
  };

  template <typename T>
  void* copy_of(const std::vector<T>& host, const std::source_location& where, bool output) {
    unchecked_ = true;
    auto found = copies_.find(host.data());
    if (found != copies_.end()) {
      found->second.output = found->second.output || output;
      return static_cast<unsigned char*>(found->second.memory.get()) + kGuardBytes;
    }
    const std::size_t bytes = host.size() * sizeof(T);
    Copy copy{std::unique_ptr<void, Release>(device_.allocate(bytes + 2 * kGuardBytes), Release{&device_}),
              std::vector<unsigned char>(bytes + 2 * kGuardBytes),
              bytes,
              sizeof(T),
              element_type_name<T>(),
              where,
              output};
    const std::uint64_t sentinel = sentinel_bits<T>();
    for (std::size_t at = 0; at < kGuardBytes; at += sizeof(T)) {
      std::memcpy(copy.image.data() + at, &sentinel, sizeof(T));  // little-endian: the low bytes
      std::memcpy(copy.image.data() + kGuardBytes + bytes + at, &sentinel, sizeof(T));
    }
    if (bytes > 0) std::memcpy(copy.image.data() + kGuardBytes, host.data(), bytes);
    device_.upload(copy.memory.get(), copy.image.data(), copy.image.size());
    return static_cast<unsigned char*>(copies_.emplace(host.data(), std::move(copy)).first->second.memory.get()) +
           kGuardBytes;
  }

  // Downloads `copy` with its guards (into `host` too, for an output) and fails the
  // test at the first element written where the kernel may not write.
  void check(Copy& copy, void* host) {
    const std::size_t data_end = kGuardBytes + copy.bytes;
    const std::size_t size = copy.image.size();
    const std::unique_ptr<unsigned char[]> downloaded(new unsigned char[size]);  // not zeroed: all overwritten
    unsigned char* now = downloaded.get();
    device_.download(now, copy.memory.get(), size);
    if (host != nullptr && copy.bytes > 0) std::memcpy(host, now + kGuardBytes, copy.bytes);
    if (copy.reported) return;
    const unsigned char* was = copy.image.data();
    const bool clean = copy.output ? std::memcmp(now, was, kGuardBytes) == 0 &&
                                         std::memcmp(now + data_end, was + data_end, kGuardBytes) == 0
                                   : std::memcmp(now, was, size) == 0;
    if (clean) return;
    std::size_t changed = 0;
    std::size_t first = size;
    for (std::size_t at = 0; at < size; at += copy.element_bytes) {
      if (copy.output && at >= kGuardBytes && at < data_end) continue;
      if (std::memcmp(now + at, was + at, copy.element_bytes) != 0) {
        if (changed++ == 0) first = at;
      }
    }
    if (changed == 0) return;
    copy.reported = true;
    const std::size_t count = copy.bytes / copy.element_bytes;
    const long long index = (static_cast<long long>(first) - static_cast<long long>(kGuardBytes)) /
                            static_cast<long long>(copy.element_bytes);
    std::string where_written;
    if (first < kGuardBytes) {
      where_written = std::to_string(-index) + " element(s) before its start";
    } else if (first >= data_end) {
      where_written = std::to_string(index - static_cast<long long>(count) + 1) + " element(s) past its end";
    } else {
      where_written = "inside it, which an input the op does not write in place may not be";
    }
    std::uint64_t got_bits = 0, was_bits = 0;
    std::memcpy(&got_bits, now + first, copy.element_bytes);
    std::memcpy(&was_bits, was + first, copy.element_bytes);
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    char bits[64];
    std::snprintf(bits, sizeof(bits), "0x%0*llx, was 0x%0*llx", static_cast<int>(2 * copy.element_bytes),
                  static_cast<unsigned long long>(got_bits), static_cast<int>(2 * copy.element_bytes),
                  static_cast<unsigned long long>(was_bits));
    const char* file = copy.where.file_name();
    const char* slash = std::strrchr(file, '/');
    ADD_FAILURE() << "kernel sentinels: "
                  << (test != nullptr ? std::string(test->test_suite_name()) + "." + test->name() : "(no test)")
                  << ": the " << (copy.output ? "output" : "input") << " named at "
                  << (slash != nullptr ? slash + 1 : file) << ":" << copy.where.line() << ":" << copy.where.column()
                  << " (" << count << " x " << copy.type << ") was written " << where_written << ": element [" << index
                  << "] = " << bits << (first < kGuardBytes || first >= data_end ? " (the sentinel)" : "") << "; "
                  << changed << " element(s) changed where none may be";
  }

  Device& device_;
  std::map<const void*, Copy> copies_;
  bool unchecked_ = false;  // named since the last finish()
};

}  // namespace dufu::trainer::testing
