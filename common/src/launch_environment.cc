// Reads rank, world size and local rank from the launcher's environment variables and
// refuses partial, malformed or inconsistent sets with a message naming the variable.
#include "dufu/common/launch_environment.h"

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "dufu/common/error.h"

namespace dufu {

namespace {

struct VariableNames {
  Launcher launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
};

// In order of precedence; see launch_environment_from.
constexpr VariableNames kLaunchers[] = {
    {Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

int parse_variable(const char* name, const char* value) {
  const std::string_view text(value);
  int result = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), result);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || result < 0) {
    DUFU_FAIL("environment variable ", name, "='", text,
              "' is not a non-negative decimal integer; check how the launcher was invoked");
  }
  return result;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone: return "none";
    case Launcher::kOpenMpi: return "mpirun";
    case Launcher::kSlurm: return "srun";
    case Launcher::kTorchrun: return "torchrun";
  }
  return "unknown";
}

std::string LaunchEnvironment::describe() const {
  if (launcher == Launcher::kNone) return "single process (no launcher variables)";
  return str_cat(launcher_name(launcher), " rank ", rank, " of ", world_size, " (local rank ", local_rank, ")");
}

LaunchEnvironment launch_environment_from(const std::function<const char*(const char*)>& getenv) {
  for (const VariableNames& names : kLaunchers) {
    const char* rank = getenv(names.rank);
    const char* world_size = getenv(names.world_size);
    const char* local_rank = getenv(names.local_rank);
    if (rank == nullptr && world_size == nullptr && local_rank == nullptr) continue;
    for (const auto& [name, value] : {std::pair{names.rank, rank}, std::pair{names.world_size, world_size},
                                      std::pair{names.local_rank, local_rank}}) {
      if (value == nullptr) {
        DUFU_FAIL("environment variable ", name, " is not set although ", names.rank, ", ", names.world_size,
                  " and ", names.local_rank, " are only meaningful together (", launcher_name(names.launcher),
                  "-style launch); set all three or none");
      }
    }
    LaunchEnvironment environment;
    environment.launcher = names.launcher;
    environment.rank = parse_variable(names.rank, rank);
    environment.world_size = parse_variable(names.world_size, world_size);
    environment.local_rank = parse_variable(names.local_rank, local_rank);
    if (environment.world_size < 1) {
      DUFU_FAIL("environment variable ", names.world_size, "=", environment.world_size, " must be at least 1");
    }
    if (environment.rank >= environment.world_size) {
      DUFU_FAIL("environment variable ", names.rank, "=", environment.rank, " is not below ", names.world_size,
                "=", environment.world_size);
    }
    if (environment.local_rank >= environment.world_size) {
      DUFU_FAIL("environment variable ", names.local_rank, "=", environment.local_rank, " is not below ",
                names.world_size, "=", environment.world_size);
    }
    return environment;
  }
  return LaunchEnvironment{};
}

LaunchEnvironment detect_launch_environment() {
  return launch_environment_from([](const char* name) { return std::getenv(name); });
}

}  // namespace dufu
