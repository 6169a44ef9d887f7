// Waiting for the device's stream while something else may fail: NCCL's kernels wait
// for their peers, so a peer that died leaves them, and a plain cudaStreamSynchronize
// behind them, waiting forever. While NCCL communicators exist the device instead
// polls the stream and, between polls, checks the communicators' asynchronous errors
// (ncclCommGetAsyncError), which turn a dead peer into an error. Host code with the
// polling and the check as parameters, so the CPU tests check the loop.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace dufu::trainer::cuda {

// Returns once done() says yes; check() runs before every pause and throws to give up.
// The pause starts at a microsecond, so a short wait costs little latency, and grows
// to a millisecond, so a long one costs little CPU.
template <typename Done, typename Check>
void wait_checking(Done&& done, Check&& check) {
  using std::chrono::microseconds;
  microseconds pause{1};
  while (!done()) {
    check();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, microseconds{1000});
  }
}

}  // namespace dufu::trainer::cuda
