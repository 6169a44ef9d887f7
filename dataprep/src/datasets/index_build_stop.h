// The stop point of index building: the Python package sets the flag from another
// thread on Ctrl-C, and the builders look at it every kStopCheckInterval entries (a few
// milliseconds of work), so a stop lands promptly and a look costs nothing measurable.
#pragma once

#include <atomic>
#include <cstdint>

#include "dufu/common/error.h"

namespace dufu::dataprep {

inline constexpr std::uint64_t kStopCheckMask = (std::uint64_t{1} << 20) - 1;

inline void throw_if_stopped(const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load(std::memory_order_relaxed)) DUFU_FAIL("building the indices was stopped");
}

}  // namespace dufu::dataprep
