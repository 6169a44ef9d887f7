// For test programs that run under mpirun: the world communicator, valid while the
// tests run, and the running of the tests on it (tests/support/mpi_test_main.cc is the
// main of programs that need nothing else).
#pragma once

#include "dufu/common/communicator.h"

namespace dufu::testing {

Communicator& mpi_world();

// Before InitGoogleTest (which picks the printer): only rank 0 reports every test, the
// other ranks report failures only.
void report_only_on_rank_zero();

// After InitGoogleTest: makes the world communicator, runs the tests the gtest flags
// select with every rank running every test on it, and returns the same status on
// every rank (non-zero when a test failed on any rank), so mpirun reports any rank's
// failure. 1 when the communicator cannot be made.
int run_tests_on_mpi_world();

}  // namespace dufu::testing
