// What every fuzz target shares: the input as a named file (most parsers take a path,
// and some choose the format by the name), and the line between a parser refusing an
// input and a bug. A parser may refuse anything with dufu::Error, which is what the
// tools print as one line; everything else is a finding and ends the run:
//   - a DUFU_CHECK failure (dufu::InternalError): an invariant the input broke;
//   - any other exception (std::bad_alloc, std::out_of_range, simdjson's, ...): the
//     tools would print "unexpected error" instead of naming the file;
//   - a broken promise checked by the target itself (fuzz_require);
//   - whatever ASan, UBSan and libFuzzer catch (bad reads, overflows, leaks, inputs
//     that take more than -rss_limit_mb of memory or -timeout seconds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dufu/common/error.h"

namespace dufu::fuzz {

// A directory of this process's own under $TMPDIR (else /tmp), made on first use and
// removed at exit; scripts/fuzz.sh points TMPDIR into the build directory so that a
// crashed run leaves nothing elsewhere.
const std::string& scratch_dir();

// Writes `size` bytes to scratch_dir()/name (a relative path whose directories are
// made as needed), replacing an earlier file, and returns its path.
std::string write_input(std::string_view name, const std::uint8_t* data, std::size_t size);

// Prints `what` and aborts, which libFuzzer reports as a crash with the input.
[[noreturn]] void finding(std::string_view what);

inline void fuzz_require(bool condition, std::string_view what) {
  if (!condition) finding(what);
}

// Runs `parse`; a dufu::Error is an accepted refusal, a DUFU_CHECK failure
// (dufu::InternalError) a finding. Returns true when `parse` returned normally.
template <typename Parse>
bool refused_cleanly_or_parsed(Parse&& parse) {
  try {
    parse();
    return true;
  } catch (const dufu::InternalError& e) {
    finding(e.what());
  } catch (const dufu::Error&) {
    return false;
  }
}

}  // namespace dufu::fuzz
