// Rows read and written kWidth floats at a time: 16-byte float4 accesses when kWidth
// is 4, single floats when it is 1. A kernel takes kWidth as a template parameter and
// its launcher picks 4 when every row it touches starts on a 16-byte boundary
// (rows_take_float4), so the same loop serves both.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "device/bf16.h"
#include "dufu/trainer/device/kernel_table.h"

namespace dufu::trainer::cuda {

template <int kWidth>
__device__ inline void load_group(float (&group)[kWidth], const float* values, int i) {
  static_assert(kWidth == 1 || kWidth == 4);
  if constexpr (kWidth == 4) {
    const float4 v = reinterpret_cast<const float4*>(values)[i];
    group[0] = v.x;
    group[1] = v.y;
    group[2] = v.z;
    group[3] = v.w;
  } else {
    group[0] = values[i];
  }
}

template <int kWidth>
__device__ inline void store_group(float* values, int i, const float (&group)[kWidth]) {
  static_assert(kWidth == 1 || kWidth == 4);
  if constexpr (kWidth == 4) {
    reinterpret_cast<float4*>(values)[i] = make_float4(group[0], group[1], group[2], group[3]);
  } else {
    values[i] = group[0];
  }
}

// Whether rows of `width` floats from each of `pointers` (null ones ignored) all start
// on 16-byte boundaries: width a multiple of 4 and every base 16-byte aligned.
template <typename... Pointers>
inline bool rows_take_float4(int width, const Pointers*... pointers) {
  return width % 4 == 0 && ((reinterpret_cast<std::uintptr_t>(pointers) % 16 == 0) && ...);
}

// Group i of the row at `offset` as `kept` keeps it: under bf16 each value rounded and
// its bits written (unless kept.bits is null), as the CPU's keep_row; fp32 untouched.
template <int kWidth>
__device__ inline void keep_group(float (&group)[kWidth], const TensorOut& kept, std::size_t offset, int i) {
  if (kept.type != ElementType::kBf16) return;
#pragma unroll
  for (int k = 0; k < kWidth; ++k) {
    std::uint16_t* bits = kept.bits == nullptr ? nullptr : kept.bits + offset + static_cast<std::size_t>(i) * kWidth + k;
    group[k] = store_as_bf16(group[k], bits);
  }
}

// One value of `kept` at `at`, as keep_group keeps a group: under bf16 rounded (and
// its bits written unless kept.bits is null) as it is stored.
__device__ inline void keep_store(const TensorOut& kept, std::size_t at, float value) {
  if (kept.type == ElementType::kBf16) value = store_as_bf16(value, kept.bits == nullptr ? nullptr : kept.bits + at);
  kept.values[at] = value;
}

}  // namespace dufu::trainer::cuda
