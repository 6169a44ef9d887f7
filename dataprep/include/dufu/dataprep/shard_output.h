// How a shard's two files are replaced as a pair. `P.bin` and `P.idx` are written to
// temporaries, and every write (the ones a full disk can fail) is done and fsynced
// before either final name changes. Then a marker `.NAME.replacing` beside them
// records the identity (device, inode) of the two new files and is made durable, the
// two files are renamed into place (exchanged with the old ones where the file system
// can, so a failed second rename puts the old .bin back), and the marker is removed.
// Two renames cannot be one atomic step: a process killed between them leaves the
// marker, so opening the prefix refuses the mix (check_shard_pair), and the next
// writer of the prefix completes the replacement before doing anything else. The
// .bin and .idx bytes are exactly Megatron's; the marker exists only during the
// commit. Writers hold the prefix's lock `.NAME.lock` (ShardOutputLock) from start
// to end, so a second writer is refused instead of mixing its files with the first's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dufu/common/atomic_file.h"

namespace dufu::dataprep {

// For the prefix DIR/NAME: DIR/.NAME.lock and DIR/.NAME.replacing.
std::string shard_lock_path(const std::string& prefix);
std::string shard_replacing_path(const std::string& prefix);

// Throws unless `prefix` ends in a file name (not "dir/", ".", "..").
void check_output_prefix(const std::string& prefix);

// Held while `prefix` is written. Refuses, naming the prefix (and the holder's pid),
// when another process or another writer in this process holds it. Once held, it
// completes (or undoes) a replacement that a killed writer of the prefix left
// halfway, and removes the temporaries that dead writers of the prefix left behind
// (their pid is in the name). The lock file is removed on release.
class ShardOutputLock {
 public:
  explicit ShardOutputLock(const std::string& prefix);
  ShardOutputLock(const ShardOutputLock&) = delete;
  ShardOutputLock& operator=(const ShardOutputLock&) = delete;
  ~ShardOutputLock();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Puts the .bin and .idx being written (not yet prepared) in place as a pair, as
// described above. On an error the old pair (or no pair, if there was none) is left
// and the temporaries are removed; only a second rename failing on a file system
// that cannot exchange names leaves a mix, and then the marker stays to refuse it.
void commit_shard_pair(AtomicFile& bin, AtomicFile& idx, const std::string& prefix);

// Throws, naming both, if the .bin or .idx of `output_prefix` (where it exists) is the
// same file (device and inode, so links count) as one of `inputs`: writing would
// overwrite what is being read. "-" stands for standard input.
void refuse_output_that_is_an_input(const std::string& output_prefix, const std::vector<std::string>& inputs);

// Reader side: throws, naming the prefix, if `.NAME.replacing` shows that one of the
// two files was replaced and the other not yet (a writer is between its renames, or
// was killed there). Costs one stat when there is no marker.
void check_shard_pair(const std::string& prefix);

}  // namespace dufu::dataprep
