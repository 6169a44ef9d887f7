// For test programs that run under mpirun (tests/support/mpi_test_main.cc is their
// main): the world communicator, valid while the tests run.
#pragma once

#include "dufu/common/communicator.h"

namespace dufu::testing {

Communicator& mpi_world();

}  // namespace dufu::testing
