// Issue 44: a rank that stops answering must not keep the others waiting forever.
// The common layer's test (tests/common/mpi_collective_timeout_test.cc) stops a rank
// of a bare job; this one stops a rank of a real `train` run.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "support/fortunes_shard.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::CommandResult;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;

// Issue 44: rank 1 of a 2-rank job stops (SIGSTOP, as a hung device or file system
// leaves a process: alive, silent, no error anywhere) once step 2 is logged. The other
// rank must not wait forever: at dist.collective_timeout it names rank 1 and the job
// ends with status 1, and the stopped rank does not outlive it.
TEST(StoppedRank, EndsTheJobAtTheCollectiveTimeout) {
  TempDir dir;
  const std::string config = dir.file("config.toml");
  write_all(config, dufu::testing::fortunes_layout_config_toml());
  const std::string run_dir = dir.file("stopped");
  const std::string pid_file = dir.file("stopped.pid");
  const std::string stopper = dir.file("stop_rank_1.sh");
  write_all(stopper, "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then\n  echo $$ > " + shell_quote(pid_file) +
                         "\n  (while ! grep -q '\"step\":2,' " + shell_quote(run_dir + "/metrics.jsonl") +
                         " 2>/dev/null; do sleep 0.05; done; kill -STOP $$) &\nfi\nexec \"$@\"\n");
  const auto start = std::chrono::steady_clock::now();
  const CommandResult stopped =
      run_command(std::string("timeout -k 5 120 ") + DUFU_MPIRUN + " -np 2 sh " + shell_quote(stopper) + " " +
                  shell_quote(train_tool()) + " " + shell_quote(config) + " run.dir=" + run_dir +
                  " train.steps=100000 checkpoint.interval=0 eval.interval=0 dist.collective_timeout=3");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Whatever happened, the stopped rank must not stay behind (a leaked stopped process
  // would hold the test's directory); it is only killed here if the job left it.
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  // Running: /proc has it and it is not a zombie (ended, not yet reaped by init).
  const auto running = [pid] {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    const std::size_t name_end = line.rfind(')');
    return name_end != std::string::npos && name_end + 2 < line.size() && line[name_end + 2] != 'Z';
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (pid > 0 && running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool left_behind = pid > 0 && running();
  if (left_behind) {
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
  }
  EXPECT_FALSE(left_behind) << "the stopped rank outlived the job";
  EXPECT_EQ(stopped.exit_code, 1) << stopped.output;
  EXPECT_NE(stopped.output.find("timed out after 3 s: rank 1 did not answer (dist.collective_timeout)"),
            std::string::npos)
      << stopped.output;
  EXPECT_LT(seconds, 100.0);
  std::printf("a stopped rank ended the 2-rank job after %.1f s in all (collective timeout 3 s)\n", seconds);
}

}  // namespace
