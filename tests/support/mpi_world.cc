// The world communicator of the test programs that run under mpirun.
#include "support/mpi_world.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "dufu/common/error.h"
#include "dufu/common/launch_environment.h"

namespace dufu::testing {
namespace {
Communicator* g_world = nullptr;  // set by run_tests_on_mpi_world
}  // namespace

Communicator& mpi_world() { return *g_world; }

void report_only_on_rank_zero() {
  if (detect_launch_environment().rank != 0) GTEST_FLAG_SET(brief, true);
}

int run_tests_on_mpi_world() {
  std::unique_ptr<Communicator> world;
  try {
    world = make_communicator();
  } catch (const Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  g_world = world.get();
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  const int failed = world->all_reduce_value(local_failed, ReduceOp::kMax);
  g_world = nullptr;
  return failed;
}

}  // namespace dufu::testing
