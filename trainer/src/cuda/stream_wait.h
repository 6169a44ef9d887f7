// Waiting for the device's stream while something else may fail: NCCL's kernels wait
// for their peers, so a peer that died leaves them, and a plain cudaStreamSynchronize
// behind them, waiting forever. While NCCL communicators exist the device instead
// polls the stream and, between polls, checks the communicators' asynchronous errors
// (ncclCommGetAsyncError), which turn a dead peer into an error; a peer that is alive
// but silent (stopped, its GPU hung) raises no error, so the wait is also bounded by
// the collective timeout (dist.collective_timeout). Host code with the polling, the
// check and the clock's verdict as parameters, so the CPU tests check the loop.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace dufu::trainer::cuda {

// Returns once done() says yes; check() runs before every pause and throws to give up.
// When `timeout_seconds` > 0 and that long has passed without done(), timed_out(the
// seconds waited) runs, and must throw. The pause starts at a microsecond, so a short
// wait costs little latency, and grows to a millisecond, so a long one costs little CPU.
template <typename Done, typename Check, typename TimedOut>
void wait_checking(Done&& done, Check&& check, double timeout_seconds, TimedOut&& timed_out) {
  using std::chrono::microseconds;
  const auto start = std::chrono::steady_clock::now();
  microseconds pause{1};
  while (!done()) {
    check();
    if (timeout_seconds > 0) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited >= timeout_seconds) timed_out(waited);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, microseconds{1000});
  }
}

template <typename Done, typename Check>
void wait_checking(Done&& done, Check&& check) {
  wait_checking(done, check, 0.0, [](double) {});
}

}  // namespace dufu::trainer::cuda
