// Strict checks for the numeric flags of `dataprep` and `train`: a whole number in a
// range, so that "-2" for an unsigned count is refused instead of wrapping around to
// 18446744073709551614, "1e300" is refused instead of being half-parsed, and the
// message names the range in a few characters (CLI11's own range checks print the
// largest double in full).
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>

namespace dufu::tools {

inline CLI::Validator whole_number_in(std::uint64_t min, std::uint64_t max) {
  const std::string range = std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [min, max, range](std::string& value) -> std::string {
        const std::string shown = value.size() > 32 ? value.substr(0, 29) + "..." : value;
        std::uint64_t parsed = 0;
        const char* end = value.data() + value.size();
        const auto [stop, error] = std::from_chars(value.data(), end, parsed);
        if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || stop != end) {
          return "'" + shown + "' is not a whole number from " + range;
        }
        if (error == std::errc::result_out_of_range || parsed < min || parsed > max) {
          return shown + " is out of range: use " + range;
        }
        return std::string();
      },
      "INT " + range, "whole number");
}

}  // namespace dufu::tools
