// The rounding of the bf16 mixed-precision recipe (train.precision = bf16), written once
// for both devices: a GPU stores bf16 (the top 16 bits of a float) where the recipe
// says so, and the CPU device keeps float arrays but rounds their values at the same
// points (docs/architecture.md, "Mixed precision"), so the recipe is trained with and
// tested on machines without a GPU. Rounding is to nearest, ties to even, as torch's
// float -> bfloat16 conversion and CUDA's __float2bfloat16_rn do.
#pragma once

#include <cstdint>
#include <cstring>

#include "device/kernel_math.h"

namespace dufu::trainer {

// The bf16 bits of `value`, rounded to nearest with ties to even. Overflow rounds to
// infinity (as IEEE rounding does: values from the midpoint between bf16's largest
// finite number and 2^128 up); NaN stays NaN, made quiet with its sign and the top
// of its payload kept (a payload that lives only in the low 16 bits would otherwise
// truncate to infinity).
DUFU_HOST_DEVICE inline std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  // Adding 0x7fff rounds the upper half up when the lower half is above one half, and
  // the upper half's lowest bit breaks an exact tie towards even. A carry out of the
  // fraction correctly bumps the exponent (and up to infinity).
  const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  // A select rather than an early return, so loops over arrays vectorize.
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(is_nan ? quiet_nan : rounded);
}

DUFU_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// The float a bf16 store and load of `value` gives back: what the CPU device writes
// where a GPU would store bf16.
DUFU_HOST_DEVICE inline float round_to_bf16(float value) { return bf16_bits_to_float(float_to_bf16_bits(value)); }

// store_bf16's step for one value, for a kernel that writes a tensor the recipe keeps in
// bf16 as it computes it: the rounded value, with its bits written to *bits unless
// bits is null.
DUFU_HOST_DEVICE inline float store_as_bf16(float value, std::uint16_t* bits) {
  const std::uint16_t rounded = float_to_bf16_bits(value);
  if (bits != nullptr) *bits = rounded;
  return bf16_bits_to_float(rounded);
}

}  // namespace dufu::trainer
