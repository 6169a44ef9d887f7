// Human-readable numbers for the tools' summaries.
#pragma once

#include <cstdint>
#include <string>

namespace dufu::tools {

std::string human_count(double value);   // 1234567 -> "1.23M"
std::string human_bytes(double bytes);   // 1234567 -> "1.23 MB"
std::string rate(double amount, double seconds);  // amount/s with human units

}  // namespace dufu::tools
