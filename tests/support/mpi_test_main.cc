// main() of the GoogleTest programs run under mpirun: every rank runs every test on
// the world communicator, and every rank exits with the same status, so mpirun
// reports any rank's failure.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/launch_environment.h"
#include "support/mpi_world.h"

namespace dufu::testing {
namespace {
Communicator* g_world = nullptr;  // set by main
}  // namespace

Communicator& mpi_world() { return *g_world; }

}  // namespace dufu::testing

int main(int argc, char** argv) {
  // Only rank 0 reports every test; the others report failures. The flag must be set
  // before InitGoogleTest, which picks the printer.
  if (dufu::detect_launch_environment().rank != 0) GTEST_FLAG_SET(brief, true);
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<dufu::Communicator> world;
  try {
    world = dufu::make_communicator();
  } catch (const dufu::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  dufu::testing::g_world = world.get();
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  const int failed = world->all_reduce_value(local_failed, dufu::ReduceOp::kMax);
  dufu::testing::g_world = nullptr;
  return failed;
}
