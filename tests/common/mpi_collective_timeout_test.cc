// Issue 44: a rank that stops answering (here SIGSTOP, as a stuck device or a hung
// file system would leave it) must not keep the other ranks waiting forever, each
// spinning at 100% CPU. Run without mpirun, this program launches itself under
// `timeout mpirun` with --scenario=NAME, where world rank 1 stops itself while the
// others wait for it, and checks that the job ends with exit status 1 soon after the
// collective timeout (DUFU_COLLECTIVE_TIMEOUT=2), with the line that names rank 1 and
// no other rank, without burning CPU while it waits; afterwards no rank of the job is
// left running (a stopped one would outlive a launcher that only sends SIGTERM).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/mpi_job.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using testing::JobResult;
using testing::run_job;
using testing::self_path;
using testing::TempDir;

constexpr double kCollectiveTimeoutSeconds = 2;
// `timeout` stops a job that hangs, as every job did before the collective timeout.
constexpr int kJobBoundSeconds = 30;

// Runs `scenario` on `ranks` ranks, every rank writing its process id into pid_dir.
JobResult run_scenario_job(const std::string& scenario, int ranks, const TempDir& pid_dir) {
  return run_job(str_cat("timeout -k 5 ", kJobBoundSeconds, " ", DUFU_MPIEXEC, " ", DUFU_MPIEXEC_PREFLAGS,
                         " -x DUFU_COLLECTIVE_TIMEOUT=", kCollectiveTimeoutSeconds, " ", DUFU_MPIEXEC_NUMPROC_FLAG, " ",
                         ranks, " ", self_path(), " --scenario=", scenario, " --pid-dir=", pid_dir.path()));
}

bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // The state follows the parenthesised command name; a zombie has ended.
  const std::size_t name_end = line.rfind(')');
  return name_end != std::string::npos && name_end + 2 < line.size() && line[name_end + 2] != 'Z';
}

// Fails for, and kills, every rank of the job still running a few seconds after it
// ended (SIGCONT first, so a stopped one also sees the SIGKILL at once).
void expect_no_rank_left(const TempDir& pid_dir) {
  for (const auto& entry : std::filesystem::directory_iterator(pid_dir.path())) {
    std::ifstream file(entry.path());
    pid_t pid = 0;
    if (!(file >> pid) || pid <= 0) continue;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (running(pid) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!running(pid)) continue;
    ADD_FAILURE() << entry.path().filename() << " (pid " << pid << ") outlived the job; killing it";
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
  }
}

std::vector<std::string> lines_with(const std::string& text, const std::string& part) {
  std::vector<std::string> found;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(part) != std::string::npos) found.push_back(line);
  }
  return found;
}

// Exit status 1, within a few seconds of the timeout, and every line that says which
// rank did not answer says `expected` (one per rank that got to print it first).
void expect_ended_naming(const JobResult& job, const std::string& expected) {
  const std::string& output = job.output;
  EXPECT_NE(job.exit_status, 124) << "the job hung until timeout stopped it:\n" << output;
  EXPECT_EQ(job.exit_status, 1) << output;
  EXPECT_LT(job.seconds, kCollectiveTimeoutSeconds + 10) << output;
  const std::vector<std::string> lines = lines_with(output, "did not answer");
  EXPECT_FALSE(lines.empty()) << output;
  for (const std::string& line : lines) {
    EXPECT_NE(line.find(expected), std::string::npos) << "expected \"" << expected << "\" in:\n" << output;
  }
}

TEST(CollectiveTimeout, StoppedRankIsNamedAndTheOthersEndWithoutSpinning) {
  TempDir pids;
  const JobResult job = run_scenario_job("world", 3, pids);
  expect_ended_naming(job, "collective all_reduce on 'world' timed out after 2 s: rank 1 did not answer "
                           "(DUFU_COLLECTIVE_TIMEOUT)");
  // Two ranks spinning through the timeout and the probe's grace period would spend
  // 6 CPU seconds; MPI's start and end cost the whole job about 1.
  EXPECT_LT(job.cpu_seconds, 3.0) << job.output;
  std::printf("the stopped rank was named %.1f s after the job started (timeout %.0f s), %.2f CPU seconds in all\n",
              job.seconds, kCollectiveTimeoutSeconds, job.cpu_seconds);
  expect_no_rank_left(pids);
}

TEST(CollectiveTimeout, RanksHeldUpInOtherGroupsAreNotBlamed) {
  TempDir pids;
  const JobResult job = run_scenario_job("groups", 4, pids);
  // World rank 3 waits for rank 2 in their pair, which waits for rank 1: both answer
  // rank 0's probe, so only rank 1 is named, by its rank in 'trio'.
  expect_ended_naming(job, "collective all_reduce on 'trio' timed out after 2 s: rank 0 (world rank 1) did not "
                           "answer (DUFU_COLLECTIVE_TIMEOUT)");
  expect_no_rank_left(pids);
}

// ---- the scenarios, under mpirun ----------------------------------------------------

void write_pid(const std::string& pid_dir, int rank) {
  std::ofstream(pid_dir + "/rank-" + std::to_string(rank) + ".pid") << ::getpid() << "\n";
}

// Rank 1 stops; ranks 0 and 2 wait for it in an all_reduce on the world.
void stop_in_world(Communicator& world) {
  if (world.rank() == 1) ::raise(SIGSTOP);
  std::vector<float> data(1000, 1.0f);
  world.all_reduce(data);
}

// Rank 1 stops. Rank 0 waits for it (and rank 3) in 'trio' = world ranks 1, 0, 3,
// where it is rank 0; rank 2 waits in a receive from it, and rank 3 for rank 2 in
// 'pair'. Only rank 0 has the short timeout, so its line is the one printed.
void stop_in_groups(Communicator& world) {
  const int rank = world.rank();
  const std::unique_ptr<Communicator> trio =
      world.subgroup(rank == 2 ? std::vector<int>{} : std::vector<int>{1, 0, 3}, "trio");
  const std::unique_ptr<Communicator> pair =
      world.subgroup(rank == 2 || rank == 3 ? std::vector<int>{2, 3} : std::vector<int>{}, "pair");
  if (rank != 0) set_collective_timeout(kCollectiveTimeoutSeconds * 5, "the scenario's longer timeout");
  std::vector<float> data(1000, 1.0f);
  if (rank == 1) ::raise(SIGSTOP);
  if (rank == 0) trio->all_reduce(data);
  if (rank == 2) world.recv(data, 1);
  if (rank == 3) pair->all_reduce(data);
}

int run_scenario(const std::string& scenario, const std::string& pid_dir) {
  try {
    std::unique_ptr<Communicator> world = make_communicator();
    write_pid(pid_dir, world->rank());
    world->barrier();  // every pid written before anyone stops
    if (scenario == "world") stop_in_world(*world);
    if (scenario == "groups") stop_in_groups(*world);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    abort_all(error.what());
    return 1;
  }
}

}  // namespace
}  // namespace dufu

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string scenario;
  std::string pid_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument.rfind("--scenario=", 0) == 0) {
      scenario = argument.substr(11);
    } else if (argument.rfind("--pid-dir=", 0) == 0) {
      pid_dir = argument.substr(10);
    } else {
      std::fprintf(stderr, "usage: %s [gtest flags] [--scenario=world|groups --pid-dir=DIR]\n", argv[0]);
      return 2;
    }
  }
  if (!scenario.empty()) return dufu::run_scenario(scenario, pid_dir);
  return RUN_ALL_TESTS();
}
