// Which launcher started this process, and this process's rank, world size and local
// rank as the launcher wrote them into the environment. make_communicator() uses it to
// pick a backend; the values are checked here so a malformed or inconsistent launch
// fails at start with a message naming the variable instead of hanging later.
#pragma once

#include <functional>
#include <string>

namespace dufu {

enum class Launcher {
  kNone,      // no launcher variables: one process
  kOpenMpi,   // mpirun/mpiexec: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
  kSlurm,     // srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
  kTorchrun,  // torchrun and friends: RANK, WORLD_SIZE, LOCAL_RANK
};

const char* launcher_name(Launcher launcher);  // "none", "mpirun", "srun", "torchrun"

struct LaunchEnvironment {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes on this machine

  // "mpirun rank 2 of 4 (local rank 2)" or "single process (no launcher variables)".
  std::string describe() const;
};

// Looks the variables up through `getenv` (returns nullptr when a variable is unset),
// so tests can pass a map. Precedence when several launchers' variables are present:
// Open MPI, then Slurm, then torchrun. Open MPI's come first because mpirun inside a
// Slurm allocation inherits the allocation's SLURM_* values, which describe the batch
// step rather than the ranks mpirun started.
//
// Throws dufu::Error naming the variable when one of a launcher's three variables is
// set without the others, when a value is not a decimal integer in range, when the
// world size is below 1, or when rank or local rank is not below the world size.
LaunchEnvironment launch_environment_from(const std::function<const char*(const char*)>& getenv);

// launch_environment_from(std::getenv).
LaunchEnvironment detect_launch_environment();

}  // namespace dufu
