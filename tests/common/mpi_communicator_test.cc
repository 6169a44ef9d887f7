// Tests for the MPI Communicator, run by ctest under mpirun -np 1, 2, 3 and 4. Every
// collective is checked against closed-form per-rank values on the world and on the
// groups of every Topology the world size allows, and sums are checked bitwise
// against the serial left fold.
//
// The same program also holds the fault tests. Started with --fault-driver (without
// mpirun) it launches itself under `timeout mpirun -np 3 ... --fault=KIND
// --fault-rank=1`, where rank 1 throws, exits, dies or returns early while the
// others wait in an all_reduce, and checks that the job ends non-zero, well before
// the timeout, with a message naming rank 1.
#include "dufu/common/communicator.h"

#include <array>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "dufu/common/launch_environment.h"
#include "dufu/common/topology.h"
#include "support/expect_error.h"
#include "common/mpi_job.h"
#include "common/mpi_uneven_collectives.h"
#include "support/mpi_world.h"

namespace dufu {
namespace {

using dufu::testing::check_all_gather_v;
using dufu::testing::check_reduce_scatter_v;
using dufu::testing::expect_error;
using dufu::testing::JobResult;
using dufu::testing::run_job;
using dufu::testing::self_path;

Communicator& world() { return dufu::testing::mpi_world(); }

// ---- closed-form checks, run on any group -----------------------------------------

// Each check is called by every rank of `c` and never returns early, so a failing
// expectation on one rank does not leave the others waiting in a collective.
void check_all_reduce(Communicator& c) {
  const int n = c.size();
  const int r = c.rank();
  const double triangle = n * (n + 1) / 2.0;  // 1 + 2 + ... + n
  // Counts below, equal to, and not divisible by the group size.
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(n + 1), std::size_t{1001}}) {
    SCOPED_TRACE(::testing::Message() << "count " << count);
    std::vector<float> sum(count);
    for (std::size_t i = 0; i < count; ++i) sum[i] = static_cast<float>((r + 1) * static_cast<int>(i % 97 + 1));
    c.all_reduce(sum);
    for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(sum[i], static_cast<float>(triangle * (i % 97 + 1))) << i;

    std::vector<double> max(count);
    for (std::size_t i = 0; i < count; ++i) max[i] = i % 2 == 0 ? r : -r - 0.5 * static_cast<double>(i);
    c.all_reduce(max, ReduceOp::kMax);
    for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(max[i], i % 2 == 0 ? n - 1 : -0.5 * static_cast<double>(i)) << i;
  }
  // int64 beyond double's 53 bits: exact.
  std::array<std::int64_t, 3> big;
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = (std::int64_t{1} << 55) * (r + 1) + static_cast<std::int64_t>(i);
  c.all_reduce(big);
  for (std::size_t i = 0; i < big.size(); ++i) {
    EXPECT_EQ(big[i], (std::int64_t{1} << 55) * (n * (n + 1) / 2) + n * static_cast<std::int64_t>(i));
  }
  std::vector<std::int32_t> ints{r, -r, 7};
  c.all_reduce(ints, ReduceOp::kMax);
  EXPECT_EQ(ints, (std::vector<std::int32_t>{n - 1, 0, 7}));
  std::vector<std::uint8_t> bytes{200, static_cast<std::uint8_t>(r)};
  c.all_reduce(bytes);
  EXPECT_EQ(bytes[0], static_cast<std::uint8_t>((200 * n) % 256));
  EXPECT_EQ(bytes[1], static_cast<std::uint8_t>(n * (n - 1) / 2));
  EXPECT_EQ(c.all_reduce_value(static_cast<float>(r + 1)), static_cast<float>(triangle));
  EXPECT_EQ(c.all_reduce_value<std::int64_t>(r, ReduceOp::kMax), n - 1);
}

void check_all_gather(Communicator& c) {
  const int n = c.size();
  const int r = c.rank();
  constexpr int kPerRank = 3;
  std::vector<std::int32_t> input(kPerRank);
  for (int i = 0; i < kPerRank; ++i) input[static_cast<std::size_t>(i)] = r * 100 + i;
  std::vector<std::int32_t> output(static_cast<std::size_t>(n * kPerRank), -1);
  c.all_gather(input, output);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < kPerRank; ++i) EXPECT_EQ(output[static_cast<std::size_t>(j * kPerRank + i)], j * 100 + i);
  }
  // In place: the input is this rank's slice of the output.
  std::vector<double> in_place(static_cast<std::size_t>(n * 2), -1.0);
  in_place[static_cast<std::size_t>(2 * r)] = r + 0.25;
  in_place[static_cast<std::size_t>(2 * r + 1)] = -r;
  c.all_gather(std::span<const double>(in_place.data() + 2 * r, 2), in_place);
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(in_place[static_cast<std::size_t>(2 * j)], j + 0.25);
    EXPECT_EQ(in_place[static_cast<std::size_t>(2 * j + 1)], -j);
  }
}

void check_reduce_scatter(Communicator& c) {
  const int n = c.size();
  const int r = c.rank();
  for (const int per_rank : {0, 1, 5}) {
    std::vector<float> input(static_cast<std::size_t>(n * per_rank));
    for (std::size_t k = 0; k < input.size(); ++k) input[k] = static_cast<float>((r + 1) * static_cast<int>(k + 1));
    std::vector<float> output(static_cast<std::size_t>(per_rank), -1.0f);
    c.reduce_scatter(input, output);
    for (int i = 0; i < per_rank; ++i) {
      EXPECT_EQ(output[static_cast<std::size_t>(i)], static_cast<float>(n * (n + 1) / 2 * (r * per_rank + i + 1)));
    }
  }
}

void check_broadcast(Communicator& c) {
  const int r = c.rank();
  for (int root = 0; root < c.size(); ++root) {
    std::vector<std::int64_t> data(4, -1);
    if (r == root) std::iota(data.begin(), data.end(), root * 1000);
    c.broadcast(data, root);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(data[static_cast<std::size_t>(i)], root * 1000 + i) << "root " << root;
  }
}

void check_point_to_point(Communicator& c) {
  const int n = c.size();
  const int r = c.rank();
  const int next = (r + 1) % n;
  const int previous = (r + n - 1) % n;
  // Ring with send and recv: even ranks send first, odd ranks receive first.
  if (n > 1) {
    const std::vector<float> outgoing{r * 10.0f, r * 10.0f + 1.0f};
    std::vector<float> incoming(2, -1.0f);
    if (r % 2 == 0) {
      c.send(outgoing, next, 5);
      c.recv(incoming, previous, 5);
    } else {
      c.recv(incoming, previous, 5);
      c.send(outgoing, next, 5);
    }
    EXPECT_EQ(incoming, (std::vector<float>{previous * 10.0f, previous * 10.0f + 1.0f}));
  }
  // The same ring in one step with send_recv (for n == 1 a copy to itself).
  const std::vector<std::int32_t> outgoing(3, r);
  std::vector<std::int32_t> incoming(3, -1);
  c.send_recv(outgoing, next, incoming, previous);
  EXPECT_EQ(incoming, std::vector<std::int32_t>(3, previous));
  c.barrier();
}

void check_collectives(Communicator& c) {
  SCOPED_TRACE(c.describe());
  check_all_reduce(c);
  check_all_gather(c);
  check_reduce_scatter(c);
  check_reduce_scatter_v(c);
  check_all_gather_v(c);
  check_broadcast(c);
  check_point_to_point(c);
}

// The world ranks of c's members in group-rank order.
std::vector<std::int32_t> members_of(Communicator& c) {
  std::vector<std::int32_t> members(static_cast<std::size_t>(c.size()));
  const std::int32_t own = world().rank();
  c.all_gather(std::span<const std::int32_t>(&own, 1), members);
  return members;
}

// ---- tests under mpirun ------------------------------------------------------------

TEST(Mpi, WorldMatchesTheLauncher) {
  const LaunchEnvironment environment = detect_launch_environment();
  EXPECT_EQ(environment.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(world().size(), environment.world_size);
  EXPECT_EQ(world().rank(), environment.rank);
  EXPECT_EQ(world().describe(), str_cat("MPI communicator 'world' (rank ", world().rank(), " of ", world().size(),
                                        ", world rank ", world().rank(), ")"));
}

TEST(Mpi, CollectivesOnTheWorld) { check_collectives(world()); }

TEST(Mpi, CollectivesOnEveryTopologyGroup) {
  const int n = world().size();
  for (int tp = 1; tp <= n; ++tp) {
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp) != 0) continue;
      const Topology topology(n, tp, pp, world().rank());
      SCOPED_TRACE(topology.describe());
      for (ParallelGroup kind :
           {ParallelGroup::kTensor, ParallelGroup::kData, ParallelGroup::kPipeline, ParallelGroup::kEmbedding}) {
        const std::vector<int> ranks = topology.group(kind);
        std::unique_ptr<Communicator> group = world().subgroup(ranks, parallel_group_name(kind));
        if (ranks.empty()) {
          EXPECT_EQ(group, nullptr);
          continue;
        }
        if (group == nullptr) {
          ADD_FAILURE() << "no communicator for " << parallel_group_name(kind) << " group";
          continue;  // the other members will fail too: each got nullptr or a mismatch
        }
        EXPECT_EQ(group->name(), parallel_group_name(kind));
        EXPECT_EQ(group->size(), static_cast<int>(ranks.size()));
        const std::vector<std::int32_t> members = members_of(*group);
        EXPECT_TRUE(std::equal(members.begin(), members.end(), ranks.begin(), ranks.end()));
        EXPECT_EQ(ranks[static_cast<std::size_t>(group->rank())], world().rank());
        check_collectives(*group);
      }
    }
  }
}

TEST(Mpi, SplitOrdersByKeyThenRankAndLeavesNegativeColorsOut) {
  const int r = world().rank();
  const int n = world().size();
  // Parity groups, in descending world rank order; rank 0 stays out when n > 1.
  const bool out = n > 1 && r == 0;
  std::unique_ptr<Communicator> group = world().split(out ? -1 : r % 2, -r, "parity");
  if (out) {
    EXPECT_EQ(group, nullptr);
  } else if (group != nullptr) {
    std::vector<std::int32_t> expected;
    for (int member = n - 1; member >= 0; --member) {
      if (member % 2 == r % 2 && !(n > 1 && member == 0)) expected.push_back(member);
    }
    EXPECT_EQ(members_of(*group), expected);
    check_collectives(*group);
  } else {
    ADD_FAILURE() << "split returned nullptr for color " << r % 2;
  }
  // All equal keys: the order falls back to rank order.
  std::unique_ptr<Communicator> everyone = world().split(0, 0, "everyone");
  std::vector<std::int32_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(members_of(*everyone), all);
}

TEST(Mpi, SubgroupRefusesDisagreeingLists) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  // Ranks 0 and 1 both name the group {0, 1} but in opposite orders.
  std::vector<int> ranks;
  if (world().rank() == 0) ranks = {0, 1};
  if (world().rank() == 1) ranks = {1, 0};
  if (world().rank() < 2) {
    expect_error([&] { world().subgroup(ranks, "pair"); }, {"subgroup 'pair'", "the members disagree"});
  } else {
    EXPECT_EQ(world().subgroup(ranks, "pair"), nullptr);
  }
}

TEST(Mpi, DeterministicSumsEqualTheSerialLeftFold) {
  const int n = world().size();
  const int r = world().rank();
  auto contribution = [](int rank, std::size_t i) {
    return static_cast<float>(std::sin(1.0 + rank * 7.3 + static_cast<double>(i) * 0.37) *
                              std::pow(10.0, static_cast<double>(i % 7) - 3.0));
  };
  for (const std::size_t count : {std::size_t{1}, static_cast<std::size_t>(n + 3), std::size_t{4099}}) {
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = contribution(r, i);
    world().all_reduce(data);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float expected = contribution(0, i);
      for (int k = 1; k < n; ++k) expected += contribution(k, i);
      if (std::memcmp(&expected, &data[i], sizeof(float)) != 0) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0u) << "count " << count;

    // reduce_scatter folds the same way: chunk r of the all_reduce.
    const std::size_t per_rank = count;
    std::vector<float> input(per_rank * static_cast<std::size_t>(n));
    for (std::size_t k = 0; k < input.size(); ++k) input[k] = contribution(r, k);
    std::vector<float> output(per_rank);
    world().reduce_scatter(input, output);
    mismatches = 0;
    for (std::size_t i = 0; i < per_rank; ++i) {
      const std::size_t k = static_cast<std::size_t>(r) * per_rank + i;
      float expected = contribution(0, k);
      for (int s = 1; s < n; ++s) expected += contribution(s, k);
      if (std::memcmp(&expected, &output[i], sizeof(float)) != 0) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0u) << "reduce_scatter count " << count;
  }
}

TEST(Mpi, BadArgumentsThrowOnEveryRankAndLeaveTheGroupUsable) {
  const int n = world().size();
  std::vector<float> data(4);
  expect_error([&] { world().broadcast(data, n); }, {"broadcast on MPI communicator 'world'", "root rank"});
  std::vector<float> wrong(static_cast<std::size_t>(n * 4 + 1));
  expect_error([&] { world().all_gather(data, wrong); }, {"all_gather", "output has"});
  expect_error([&] { world().reduce_scatter(wrong, data); }, {"reduce_scatter", "input has"});
  expect_error([&] { world().send(data, n); }, {"send", "destination rank"});
  EXPECT_EQ(world().all_reduce_value(1), n);
}

TEST(Mpi, MpiFailuresBecomeErrorsNamingTheOperationAndRank) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const int r = world().rank();
  // Too long a message for the receive buffer: MPI reports truncation.
  if (r == 0) world().send(std::vector<float>(10, 1.0f), 1, 3);
  if (r == 1) {
    std::vector<float> small(5);
    expect_error([&] { world().recv(small, 0, 3); },
                 {"MPI_Test failed in recv on MPI communicator 'world' (rank 1 of", "truncat"});
  }
  // Shorter than announced: caught by the count check.
  if (r == 0) world().send(std::vector<float>(3, 1.0f), 1, 4);
  if (r == 1) {
    std::vector<float> larger(5);
    expect_error([&] { world().recv(larger, 0, 4); }, {"recv on MPI communicator 'world'",
                                                       "expected 5 elements from rank 0 but got 3"});
  }
  world().barrier();
}

TEST(Mpi, MakeCommunicatorChecksTheLauncherAgainstMpi) {
  const int n = world().size();
  LaunchEnvironment claimed{Launcher::kOpenMpi, world().rank(), n + 1, 0};
  expect_error([&] { make_communicator(claimed); },
               {str_cat("the launcher announced mpirun rank ", world().rank(), " of ", n + 1),
                str_cat("MPI sees rank ", world().rank(), " of ", n)});
  auto second = make_communicator();  // a second world communicator is fine
  EXPECT_EQ(second->size(), n);
  EXPECT_EQ(second->all_reduce_value(1), n);
}

// ---- fault scenarios ---------------------------------------------------------------

constexpr int kFaultTimeoutSeconds = 60;

JobResult run_fault_job(const std::string& fault, const std::string& extra_mpirun_flags = "") {
  // timeout exits 124 when it had to stop the job (after SIGTERM, or SIGKILL 5 s later).
  return run_job(str_cat("timeout -k 5 ", kFaultTimeoutSeconds, " ", DUFU_MPIEXEC, " ", DUFU_MPIEXEC_PREFLAGS, " ",
                         extra_mpirun_flags, " ", DUFU_MPIEXEC_NUMPROC_FLAG, " 3 ", self_path(), " --fault=", fault,
                         " --fault-rank=1"));
}

// Non-zero, not stopped by `timeout`, and in well under the timeout.
void expect_stopped_with_failure(const JobResult& job) {
  EXPECT_NE(job.exit_status, 0) << job.output;
  EXPECT_NE(job.exit_status, 124) << "the job hung until timeout stopped it:\n" << job.output;
  EXPECT_LT(job.seconds, kFaultTimeoutSeconds / 2.0) << job.output;
}

void expect_output_contains(const JobResult& job, const std::string& needle) {
  EXPECT_NE(job.output.find(needle), std::string::npos) << "output lacks \"" << needle << "\":\n" << job.output;
}

TEST(FaultDriver, CleanRunExitsZero) {
  const JobResult job = run_fault_job("none");
  EXPECT_EQ(job.exit_status, 0) << job.output;
}

TEST(FaultDriver, ExceptionOnOneRankAbortsAllThroughAbortAll) {
  const JobResult job = run_fault_job("throw");
  expect_stopped_with_failure(job);
  // mpirun's own "MPI_ABORT was invoked on rank 1" is usually there too, but Open MPI
  // 4.1 sometimes loses that help text ("Data unpack would read past end of buffer").
  expect_output_contains(job, "[rank 1] [dufu ERROR COMM] rank 1 is aborting all ranks: injected failure on rank 1");
}

TEST(FaultDriver, NonZeroExitWithoutFinalizeStopsTheJob) {
  const JobResult job = run_fault_job("exit");
  expect_stopped_with_failure(job);
  expect_output_contains(job, "Exit code:    3");
  expect_output_contains(job, ",1],1]");  // Open MPI's process name of rank 1: [[job,1],1]
}

TEST(FaultDriver, RankKilledBySignalStopsTheJob) {
  const JobResult job = run_fault_job("kill");
  expect_stopped_with_failure(job);
  expect_output_contains(job, "process rank 1 with PID");
  expect_output_contains(job, "signal 9");
}

TEST(FaultDriver, UncaughtExceptionStopsTheJob) {
  const JobResult job = run_fault_job("uncaught");
  expect_stopped_with_failure(job);
  expect_output_contains(job, "process rank 1 with PID");
}

TEST(FaultDriver, RankReturningEarlyAbortsAfterTheExitTimeout) {
  const JobResult job = run_fault_job("return", "-x DUFU_MPI_EXIT_TIMEOUT=2");
  expect_stopped_with_failure(job);
  expect_output_contains(job, "[rank 1] [dufu ERROR COMM] rank 1 is exiting but the other ranks did not reach exit "
                              "within 2 s");
}

// Runs under mpirun: rank `fault_rank` fails in the given way while the other ranks
// wait in an all_reduce; returns main's exit code.
int run_fault(const std::string& fault, int fault_rank) {
  try {
    std::unique_ptr<Communicator> comm = make_communicator();
    if (comm->rank() == fault_rank) {
      if (fault == "throw") throw Error(str_cat("injected failure on rank ", fault_rank));
      if (fault == "exit") std::_Exit(3);
      if (fault == "kill") std::raise(SIGKILL);
      if (fault == "uncaught") std::terminate();  // what an exception escaping main does
      if (fault == "return") return 3;
    }
    std::vector<float> data(1000, 1.0f);
    comm->all_reduce(data);
    comm->barrier();
    return 0;
  } catch (const std::exception& error) {
    // What a tool's top-level handler does.
    std::fprintf(stderr, "error: %s\n", error.what());
    abort_all(error.what());
    return 1;
  }
}

}  // namespace
}  // namespace dufu

int main(int argc, char** argv) {
  dufu::testing::report_only_on_rank_zero();
  ::testing::InitGoogleTest(&argc, argv);
  bool fault_driver = false;
  std::string fault;
  int fault_rank = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--fault-driver") {
      fault_driver = true;
    } else if (argument.rfind("--fault=", 0) == 0) {
      fault = argument.substr(8);
    } else if (argument.rfind("--fault-rank=", 0) == 0) {
      fault_rank = std::atoi(argument.c_str() + 13);
    } else {
      std::fprintf(stderr, "usage: %s [gtest flags] [--fault-driver | --fault=KIND --fault-rank=R]\n", argv[0]);
      return 2;
    }
  }
  const bool default_filter = GTEST_FLAG_GET(filter) == "*";
  if (fault_driver) {
    if (default_filter) GTEST_FLAG_SET(filter, "FaultDriver.*");
    return RUN_ALL_TESTS();
  }
  if (!fault.empty()) return dufu::run_fault(fault, fault_rank);
  if (default_filter) GTEST_FLAG_SET(filter, "Mpi.*");
  return dufu::testing::run_tests_on_mpi_world();
}
