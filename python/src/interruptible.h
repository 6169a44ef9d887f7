// Long calls of the package (preprocess, index building) run on a thread of their own,
// while the calling thread, holding the GIL only between looks, checks every 50 ms for
// Python's signal handlers (Ctrl-C's KeyboardInterrupt) and calls `on_wait` (a progress
// callback). When either raises, `stop` is set; the work reads it at its next safe
// point (a batch, a phase), ends there without publishing anything, and the Python
// error is raised once it has: no thread outlives the call, and the work's own error
// (the stop) is dropped for the cause.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <utility>

namespace dufu::python {

namespace py = pybind11;

inline constexpr std::chrono::milliseconds kSignalPoll{50};

template <typename Work>
auto run_interruptibly(std::atomic<bool>& stop, Work&& work, const std::function<void()>& on_wait = {}) {
  auto job = std::async(std::launch::async, std::forward<Work>(work));
  while (true) {
    bool done = false;
    {
      py::gil_scoped_release release;
      done = job.wait_for(kSignalPoll) == std::future_status::ready;
    }
    if (done) break;
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (on_wait) on_wait();
    } catch (...) {
      stop.store(true);
      {
        py::gil_scoped_release release;
        job.wait();
      }
      throw;
    }
  }
  py::gil_scoped_release release;
  return job.get();
}

}  // namespace dufu::python
