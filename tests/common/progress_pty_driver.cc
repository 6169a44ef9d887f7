// Draws a Progress on stderr the way `dataprep preprocess` does (a known total of MB,
// then documents and tokens), for tests/common/progress_pty_test.py, which runs it in
// pseudo-terminals of several widths and checks that no redraw wraps.
// usage: progress_pty_driver [STEPS]
#include <chrono>
#include <cstdlib>
#include <thread>

#include "dufu/common/progress.h"

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 40;
  dufu::ProgressOptions options;
  options.bar_interval = std::chrono::milliseconds(20);  // kAuto: a bar only on a terminal
  dufu::Progress progress("preprocess", {{"MB", 1e6}, {"docs", 1}, {"tokens", 1}}, options);
  progress.set_total(static_cast<std::uint64_t>(steps) * 7'500'000);
  for (int step = 0; step < steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    progress.add(0, 7'500'000);
    progress.add(1, 1234);
    progress.add(2, 2'500'000);
  }
  progress.finish();
  return 0;
}
