// For the drivers that run outside mpirun and start mpirun jobs of their own program
// (mpi_communicator_test's faults, mpi_collective_timeout_test): the job's exit
// status, wall time, CPU time and output.
#pragma once

#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace dufu::testing {

inline std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

struct JobResult {
  int exit_status = -1;  // of the command (128 + N for signal N)
  double seconds = 0;
  // Of every process of the job that was waited for: the launcher and its ranks.
  double cpu_seconds = 0;
  std::string output;  // stdout and stderr of every rank and of mpirun
};

inline double children_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_CHILDREN, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Runs `command` through /bin/sh, its stderr with its stdout.
inline JobResult run_job(const std::string& command) {
  JobResult result;
  const double cpu_before = children_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return result;
  }
  std::array<char, 4096> chunk;
  std::size_t got = 0;
  while ((got = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0) result.output.append(chunk.data(), got);
  const int status = ::pclose(pipe);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.cpu_seconds = children_cpu_seconds() - cpu_before;
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace dufu::testing
