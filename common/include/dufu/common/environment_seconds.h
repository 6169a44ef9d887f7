// A duration a user sets through an environment variable (DUFU_MPI_EXIT_TIMEOUT,
// DUFU_PROGRESS_INTERVAL): one parser, so every such knob accepts and refuses the same.
#pragma once

namespace dufu {

// Seconds in environment variable `name` (a decimal number > 0), or `fallback` when it
// is unset or empty; throws dufu::Error naming the variable for anything else.
double positive_seconds_from_environment(const char* name, double fallback);

}  // namespace dufu
