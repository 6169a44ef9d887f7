// Kernel test rows of the bf16 recipe's conversions: rounding to bf16 in place, and
// storing, loading and converting bf16 bits (kernel_cases.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "device/kernel_math.h"
#include "device/kernel_partition.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_cases.h"
#include "kernel_reference.h"
#include "kernel_test_support.h"

namespace dufu::trainer::testing {

namespace ref = reference;

namespace {

// ---- mixed precision -----------------------------------------------------------------

// The bf16 value nearest to x, ties to the even bf16, found by comparing the two bf16
// neighbours in double (no bit tricks, unlike bf16.h): the independent reference.
double nearest_bf16(float x) {
  if (std::isnan(x)) return std::numeric_limits<double>::quiet_NaN();
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const auto as_double = [](std::uint32_t upper) {
    const std::uint32_t wide = upper << 16;
    float value;
    std::memcpy(&value, &wide, sizeof(value));
    return static_cast<double>(value);
  };
  const std::uint32_t down = bits >> 16;  // towards zero
  const std::uint32_t up = down + 1;      // away from zero (may reach infinity)
  const double low = as_double(down);
  const double high = as_double(up);
  const double gap_low = std::abs(static_cast<double>(x) - low);
  const double gap_high = std::isinf(high) && !std::isinf(x)
                              ? std::abs(std::ldexp(static_cast<double>(std::signbit(x) ? -1.0 : 1.0), 128) - x)
                              : std::abs(high - static_cast<double>(x));
  if (gap_low < gap_high) return low;
  if (gap_high < gap_low) return high;
  return (down & 1u) == 0 ? low : high;
}

Outputs run_round_to_bf16(const Shape& s, Device* device, int) {
  auto values = random_floats(static_cast<std::size_t>(s.N()) * s.C, 59, -50.0f, 50.0f);
  // Exact ties (odd and even upper halves), large, subnormal and signed-zero values
  // and NaN. (Overflow to infinity is bf16_test's, against torch: the harness's
  // tolerances cannot compare infinities.)
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3e38f, -3.3e38f, 1e-40f, 0.0f, -0.0f, kNaN};
  for (std::size_t i = 0; i < std::size(specials) && i < values.size(); ++i) values[i] = specials[i];
  if (device != nullptr) {
    DeviceArgs d(*device);
    auto rounded = values;
    device->kernels().round_to_bf16(d.out(rounded), rounded.size());
    d.finish();
    return {{"values", widen(rounded)}};
  }
  Vec rounded(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) rounded[i] = nearest_bf16(values[i]);
  return {{"values", rounded}};
}

// The float a bf16 of these bits stands for: its bits are the float's upper half.
double float_of_bf16_bits(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return static_cast<double>(value);
}

// store_bf16 both rounds in place and stores: the stored bits must stand for the
// rounded value, which must be the nearest bf16.
Outputs run_store_bf16(const Shape& s, Device* device, int) {
  auto values = random_floats(static_cast<std::size_t>(s.N()) * s.C, 62, -50.0f, 50.0f);
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3e38f, 1e-40f, -0.0f};
  for (std::size_t i = 0; i < std::size(specials) && i < values.size(); ++i) values[i] = specials[i];
  Vec rounded(values.size());
  Vec stored(values.size());
  if (device != nullptr) {
    DeviceArgs d(*device);
    auto in_place = values;
    std::vector<std::uint16_t> bits(values.size(), 0xffff);
    device->kernels().store_bf16(d.out(bits), d.out(in_place), values.size());
    d.finish();
    for (std::size_t i = 0; i < values.size(); ++i) {
      rounded[i] = in_place[i];
      stored[i] = float_of_bf16_bits(bits[i]);
    }
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) rounded[i] = stored[i] = nearest_bf16(values[i]);
  }
  return {{"values", rounded}, {"stored", stored}};
}

// to_bf16 leaves its input alone and writes the bits of the nearest bf16.
Outputs run_to_bf16(const Shape& s, Device* device, int) {
  const auto values = random_floats(static_cast<std::size_t>(s.N()) * s.C, 64, -50.0f, 50.0f);
  Vec bits_as_values(values.size());
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<std::uint16_t> bits(values.size(), 0xffff);
    device->kernels().to_bf16(d.out(bits), d.in(values), values.size());
    d.finish();
    for (std::size_t i = 0; i < values.size(); ++i) bits_as_values[i] = float_of_bf16_bits(bits[i]);
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) bits_as_values[i] = nearest_bf16(values[i]);
  }
  return {{"bits", bits_as_values}};
}

// Random bf16 bit patterns of every kind but NaN and infinity, which the harness's
// tolerances cannot compare.
Outputs run_load_bf16(const Shape& s, Device* device, int) {
  const auto draws = random_tokens(static_cast<std::size_t>(s.N()) * s.C, 0xffff, 63);
  std::vector<std::uint16_t> bits(draws.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    bits[i] = static_cast<std::uint16_t>(draws[i]);
    if (!std::isfinite(float_of_bf16_bits(bits[i]))) bits[i] = 0x3f80;  // 1.0
  }
  Vec loaded(bits.size());
  if (device != nullptr) {
    DeviceArgs d(*device);
    std::vector<float> values(bits.size(), kNaN);
    device->kernels().load_bf16(d.out(values), d.in(bits), bits.size());
    d.finish();
    loaded = widen(values);
  } else {
    for (std::size_t i = 0; i < bits.size(); ++i) loaded[i] = float_of_bf16_bits(bits[i]);
  }
  return {{"values", loaded}};
}

}  // namespace

std::vector<OpCase> bf16_op_cases() {
  return {
      {"round_to_bf16", run_round_to_bf16, {0.0, 0.0}, true, true},
      {"store_bf16", run_store_bf16, {0.0, 0.0}, true, true},
      {"load_bf16", run_load_bf16, {0.0, 0.0}, true, true},
      {"to_bf16", run_to_bf16, {0.0, 0.0}, true, true},
  };
}

}  // namespace dufu::trainer::testing
