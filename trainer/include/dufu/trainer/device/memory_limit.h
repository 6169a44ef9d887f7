// The host memory a process may use: what the CPU device reports as its capacity, and
// what the memory plan of a training rank is checked against before anything is
// allocated (training_memory.h).
#pragma once

namespace dufu::trainer {

// The memory a process can have at most: physical memory plus swap, or less under an
// address-space or data-size limit (RLIMIT_AS, RLIMIT_DATA).
double memory_limit_bytes();

}  // namespace dufu::trainer
