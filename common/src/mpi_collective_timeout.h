// The bound on every wait of the MPI backend (issue 44). A rank that stops answering
// (SIGSTOP, a stuck device, a hung file system) would otherwise leave the others in a
// blocking MPI call forever, each spinning at 100% CPU. So the backend starts every
// operation non-blocking and completes it here: MPI_Test, backing off to 1 ms sleeps
// between polls, until the collective timeout (set_collective_timeout in
// communicator.h); a rank still waiting then finds out which ranks did not answer,
// says so in one line and ends the job through abort_all.
//
// Naming the silent ranks: a request that does not complete cannot say who is
// missing, so every rank that is waiting in any operation also answers "pings" on a
// private duplicate of MPI_COMM_WORLD (the probe channel). At the deadline the rank
// pings the ranks it waits for and gives them a grace period to reply; a stopped or
// stuck rank cannot, while one that is itself waiting (in this operation or in
// another group's, held up by the same silent rank) replies within a few
// milliseconds. So the line blames the rank that is not waiting, not its victims.
#pragma once

// The C API only (see mpi_communicator.cc).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <span>
#include <string_view>

namespace dufu::mpi_wait {

// The pause between two polls of a wait: none for the first 50 microseconds (where
// ranks that arrive together finish), a yield until 1 ms, then a sleep of an eighth
// of the time waited, at most 1 ms: an operation ends at most an eighth late, and a
// rank left waiting polls a thousand times a second instead of spinning.
class Backoff {
 public:
  double elapsed_seconds() const;
  void pause() const;

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Collective over MPI_COMM_WORLD, at the same point on every rank: the first call
// duplicates it as the probe channel, later calls do nothing. Closed before
// MPI_Finalize.
void open_probe_channel();
void close_probe_channel();

// The collective timeout, read from DUFU_COLLECTIVE_TIMEOUT unless
// set_collective_timeout chose it first (at MPI's start, so a bad value fails there).
void default_collective_timeout_from_environment();

// What a wait is for, for the line a timeout prints.
struct WaitSubject {
  MPI_Comm comm;                // the group's
  std::string_view group;       // its name
  const char* operation;        // "all_reduce", "recv", ...
  bool collective;              // every other rank of the group takes part
  std::span<const int> peers;   // otherwise: the group ranks it waits for
};

// Completes every request (MPI_REQUEST_NULL ones count as complete), writing
// statuses[i] for request i when statuses is not null; returns MPI_SUCCESS, or the
// code of the MPI_Test that failed. At the collective timeout it aborts the job
// instead, naming the ranks that did not answer, and does not return.
int complete_or_abort(std::span<MPI_Request> requests, MPI_Status* statuses, const WaitSubject& subject);

}  // namespace dufu::mpi_wait
