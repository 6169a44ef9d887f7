// Numbers for people: three significant digits with k/M/G/T suffixes, shared by the
// progress reporter and the tools' summaries so both read the same way.
#pragma once

#include <string>

namespace dufu {

// 1234567 -> "1.23M"; below 1000, `whole` prints an integer ("999") and otherwise
// keeps decimals ("2.50") so slow rates do not read as zero.
std::string human_count(double value, bool whole = true);
// 1234567 -> "1.23 MB" (decimal units, as disk and network rates are quoted).
std::string human_bytes(double bytes);

}  // namespace dufu
