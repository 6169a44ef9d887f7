// A shard truncated while `train` maps it makes the next read of a page past its new
// end raise SIGBUS, which by default ends the process with a bare "Bus error". This
// handler turns it into the tool's one-line error naming the mapped file and the
// offset read, and exit status 1.
#pragma once

namespace dufu::tools {

// Installs the SIGBUS handler for the life of the process. The handler does only
// async-signal-safe work: it reads /proc/self/maps to find the mapping that holds the
// faulting address, writes the line to stderr and calls _exit(1).
void report_bus_errors();

}  // namespace dufu::tools
