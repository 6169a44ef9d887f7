// main() of the GoogleTest programs run under mpirun: every rank runs every test on
// the world communicator, and every rank exits with the same status, so mpirun
// reports any rank's failure (see support/mpi_world.h).
#include <gtest/gtest.h>

#include "support/mpi_world.h"

int main(int argc, char** argv) {
  dufu::testing::report_only_on_rank_zero();
  ::testing::InitGoogleTest(&argc, argv);
  return dufu::testing::run_tests_on_mpi_world();
}
