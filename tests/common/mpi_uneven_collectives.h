// The uneven collectives' checks of mpi_communicator_test (reduce_scatter_v and
// all_gather_v, in mpi_uneven_collectives_test.cc), run by check_collectives on the
// world and on every topology group. Every rank of `c` calls them; they never return
// early, so a failing expectation on one rank does not leave the others waiting.
#pragma once

#include "dufu/common/communicator.h"

namespace dufu::testing {

void check_reduce_scatter_v(Communicator& c);
void check_all_gather_v(Communicator& c);

}  // namespace dufu::testing
