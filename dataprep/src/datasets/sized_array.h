// Arrays whose size comes from the user (samples, epochs x documents): allocated so
// that a size that cannot fit ends in "not enough memory for X (needs N)" naming the
// array, instead of std::bad_alloc or the OOM killer.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/common/human_units.h"

namespace dufu::dataprep {

// `count` value-initialized elements. Refused at once if they need more than the
// machine's physical memory (allocating them would only summon the OOM killer).
template <typename T>
std::vector<T> sized_array(std::uint64_t count, std::string_view what) {
  const auto bytes = static_cast<double>(count) * static_cast<double>(sizeof(T));
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
  const double physical = pages > 0 && page_size > 0 ? static_cast<double>(pages) * static_cast<double>(page_size) : 0.0;
  auto refuse = [&]() -> std::vector<T> {
    DUFU_FAIL("not enough memory for ", what, " (needs ", human_bytes(bytes), ": ", count, " entries of ",
              sizeof(T), " bytes", physical > 0 ? str_cat("; this machine has ", human_bytes(physical)) : std::string(),
              ")");
  };
  if (count > std::vector<T>().max_size() || (physical > 0 && bytes > physical)) return refuse();
  try {
    return std::vector<T>(static_cast<std::size_t>(count));
  } catch (const std::bad_alloc&) {
    return refuse();
  } catch (const std::length_error&) {
    return refuse();
  }
}

}  // namespace dufu::dataprep
