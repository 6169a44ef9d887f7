// Standard input from a pipe, so that tests of "-" (read stdin) run in-process without
// depending on how the test runner set up stdin.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <utility>

namespace dufu::testing {

// Points fd 0 at a pipe that a thread feeds `bytes` for the lifetime of the object,
// then puts the old stdin back. The first `trickled` bytes arrive one at a time with
// 30 ms pauses, so that a reader's first reads most likely see a single byte (for
// code that sniffs a magic number and must wait for all of it); the rest as fast as
// the pipe takes them.
class StdinFromPipe {
 public:
  explicit StdinFromPipe(std::string bytes, std::size_t trickled = 0) {
    saved_ = ::dup(STDIN_FILENO);
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    EXPECT_EQ(::dup2(fds[0], STDIN_FILENO), STDIN_FILENO);
    ::close(fds[0]);
    writer_ = std::thread([fd = fds[1], bytes = std::move(bytes), trickled] {
      for (std::size_t at = 0; at < bytes.size();) {
        const std::size_t piece = at < trickled ? 1 : bytes.size() - at;
        const ssize_t n = ::write(fd, bytes.data() + at, std::min(piece, bytes.size() - at));
        if (n <= 0) break;
        at += static_cast<std::size_t>(n);
        if (at < trickled) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      }
      ::close(fd);
    });
  }
  StdinFromPipe(const StdinFromPipe&) = delete;
  StdinFromPipe& operator=(const StdinFromPipe&) = delete;
  ~StdinFromPipe() {
    writer_.join();
    ::dup2(saved_, STDIN_FILENO);
    ::close(saved_);
  }

 private:
  int saved_;
  std::thread writer_;
};

}  // namespace dufu::testing
