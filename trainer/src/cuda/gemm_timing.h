// The timing loop of the GEMM rate (gemm_rate.cu), with the GPU's parts as parameters
// so the CPU tests check what the events bracket: only launches of a product made
// ready before (its algorithm chosen), kLaunchesPerTiming of them per timing, so the
// time between the events is the GEMMs' and not the gaps between one launch's return
// and the next.
#pragma once

#include <algorithm>

namespace dufu::trainer::cuda {

inline constexpr int kLaunchesPerTiming = 20;
inline constexpr int kMinTimings = 3;

// The best FLOP/s over timings of kLaunchesPerTiming launch() calls between start()
// and stop() (which waits and returns the seconds between the two), repeated while
// more_time() says yes and at least kMinTimings times.
template <typename Launch, typename Start, typename Stop, typename MoreTime>
double best_flops_per_second(double flops_per_launch, Launch&& launch, Start&& start, Stop&& stop,
                             MoreTime&& more_time) {
  double best = 0.0;
  int timings = 0;
  do {
    start();
    for (int i = 0; i < kLaunchesPerTiming; ++i) launch();
    const double seconds = stop();
    if (seconds > 0.0) best = std::max(best, flops_per_launch * kLaunchesPerTiming / seconds);
    ++timings;
  } while (more_time() || timings < kMinTimings);
  return best;
}

}  // namespace dufu::trainer::cuda
