// Child processes for tests of what only another process can see (fcntl locks,
// shared segments, per-process limits and environment, processes racing on a cache):
// fork a child that runs a function and reports through its exit code, wait for it,
// and hand it one-byte signals through a pipe.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <vector>

namespace dufu::testing {

// The exit code of a child whose body threw (a std::exception's message goes to stderr).
inline constexpr int kChildThrew = 98;
// The exit code of a gated child (race_children) whose gate closed without a byte.
inline constexpr int kChildGateClosed = 97;

// A pipe for one-byte signals between a test and the children it forks; both ends are
// closed on destruction (in the child too, where nothing destroys it: _exit closes all).
class SignalPipe {
 public:
  SignalPipe() {
    if (::pipe(fds_) != 0) throw std::runtime_error("pipe failed");
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  ~SignalPipe() {
    close_read();
    close_write();
  }

  // Writes `count` copies of `byte`; false if they could not all be written.
  bool send(char byte = 'g', std::size_t count = 1) {
    const std::vector<char> bytes(count, byte);
    return fds_[1] >= 0 && ::write(fds_[1], bytes.data(), count) == static_cast<ssize_t>(count);
  }
  // Blocks for one byte; false at end of file (every write end closed) or on an error.
  bool receive(char& byte) { return fds_[0] >= 0 && ::read(fds_[0], &byte, 1) == 1; }
  bool receive() {
    char byte = 0;
    return receive(byte);
  }

  void close_read() { close_end(0); }
  void close_write() { close_end(1); }

 private:
  void close_end(int end) {
    if (fds_[end] >= 0) ::close(fds_[end]);
    fds_[end] = -1;
  }

  int fds_[2] = {-1, -1};
};

// Forks a child that runs `body` and exits with what it returns (kChildThrew if it
// throws). The child never returns into the test: it leaves by _exit, so no test
// framework code, destructor or atexit handler of the parent's runs twice. The
// child's pid, or -1 if fork failed. The body must not use gtest assertions.
inline pid_t start_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = kChildThrew;
  try {
    code = body();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "child process %d: %s\n", static_cast<int>(::getpid()), error.what());
  } catch (...) {
    std::fprintf(stderr, "child process %d: unknown exception\n", static_cast<int>(::getpid()));
  }
  ::_exit(code);
}

// Waits for the child `pid`: its exit code, 128 + the signal's number if a signal
// ended it (as a shell reports it), or -1 if it cannot be waited for (a failed fork).
inline int wait_child(pid_t pid) {
  int status = 0;
  if (pid <= 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Runs `body` in a child process and waits for it: the child's exit code, as
// wait_child gives it.
inline int run_in_child(const std::function<int()>& body) { return wait_child(start_child(body)); }

// Forks `count` children held at one gate and then opens it, so that what they do
// races; child k runs body(k). Their exit codes (as wait_child gives them), in order.
inline std::vector<int> race_children(int count, const std::function<int(int)>& body) {
  SignalPipe gate;
  std::vector<pid_t> children;
  for (int k = 0; k < count; ++k) {
    children.push_back(start_child([&] {
      gate.close_write();
      return gate.receive() ? body(k) : kChildGateClosed;
    }));
  }
  gate.close_read();
  gate.send('g', children.size());  // one byte each: all of them go at once
  gate.close_write();
  std::vector<int> codes;
  for (const pid_t pid : children) codes.push_back(wait_child(pid));
  return codes;
}

}  // namespace dufu::testing
