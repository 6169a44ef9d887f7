// The limit on open files, for code that keeps a descriptor per input for as long as
// it reads it (a dataset keeps one per shard, to read it or to notice it shrinking).
#pragma once

namespace dufu {

// Raises this process's soft limit on open files (RLIMIT_NOFILE) to its hard limit,
// as Go's runtime does at start: a blend of more shards than the usual soft limit of
// 1024 then opens, while the hard limit, which is what the administrator allows, still
// holds. Never lowers it; a limit that cannot be raised is left as it is (the open that
// runs out then reports EMFILE with its file's name).
void raise_open_file_limit() noexcept;

}  // namespace dufu
