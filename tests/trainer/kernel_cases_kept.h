// What the kernel test rows of kept outputs share (kernel_cases_kept.cc,
// kernel_cases_kept_rowwise.cc): an output the bf16 recipe keeps (TensorOut) is checked
// against the double reference rounded to bf16, plus a count of its values that are
// off the bf16 grid or differ from their stored bits, which must be none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_cases.h"

namespace dufu::trainer::testing {

// Bits a kernel never wrote stand out: 0xffff is a NaN. (DeviceArgs keys its copies by
// host address, so every vector a runner hands it is a named one, alive to the end.)
constexpr std::uint16_t kUnwritten = 0xffff;

// A kept output as a device wrote it: `name` with its values, and `name`_not_kept with
// how many are off the grid or (with bits) not what their bits say.
void add_kept(Outputs& outputs, const std::string& name, const std::vector<float>& values,
              const std::vector<std::uint16_t>* bits);

// The reference of a kept output: the exact values rounded to bf16, and none wrong.
void add_kept_reference(Outputs& outputs, const std::string& name, const Vec& exact);

// `count` random floats in [low, high] on the bf16 grid.
std::vector<float> on_bf16_grid(std::size_t count, std::uint32_t seed, float low = -1.0f, float high = 1.0f);

}  // namespace dufu::trainer::testing
