// Whether the training data is still what a run was trained on. A checkpoint records
// the identity of every shard of the training blend (ShardIdentity in
// checkpoint_state.h: the sizes of PREFIX.bin and PREFIX.idx, the SHA-256 of the
// .idx, which holds every document's length and place, and of blocks sampled over the
// .bin), and a resume compares it with the shards as they are: a shard rewritten
// since (another tokenizer, more, fewer or other documents) would otherwise give
// other samples without a word. Digests, not modification times, so that a copy of
// the data set to another disk still resumes.
//
// While a run trains, ShardWatch notices a shard file changed in place under it
// (truncated, appended to, rewritten) by its size and modification time, so that no
// checkpoint is written over data that is no longer the recorded one. A file renamed
// over a shard (how dataprep replaces one) does not disturb the run, which goes on
// reading the file it opened; a resume then compares the new one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dufu/common/rank_agreement.h"
#include "dufu/trainer/checkpoint/checkpoint_state.h"

namespace dufu::trainer {

// The identity of the shard PREFIX (reads PREFIX.idx whole and 64 KiB of
// PREFIX.bin); throws dufu::Error naming the file when it cannot be read.
ShardIdentity shard_identity(const std::string& prefix);

// The identity as a setting every rank of a run must share (rank_agreement.h): a
// path that names another copy of the data on another node is found at the start.
AgreedSetting agreed_setting(const ShardIdentity& identity);

// What changed, naming the shard and the file, when a shard that `recorded` (a
// checkpoint's, `checkpoint` naming it) lists under the same prefix as `current`
// differs from it; nullopt when none does. Shards in only one of the two lists are
// not compared: a data.blend changed on purpose changes the data, and the
// configuration says so.
std::optional<std::string> shard_change(const std::vector<ShardIdentity>& recorded,
                                        const std::vector<ShardIdentity>& current, const std::string& checkpoint);

// The size and modification time of the shards' .bin and .idx files when the watch
// was made.
class ShardWatch {
 public:
  ShardWatch() = default;
  explicit ShardWatch(const std::vector<std::string>& prefixes);
  // Throws dufu::Error naming the first file whose size or modification time is no
  // longer what it was while it is still the same file (or that is gone).
  void check() const;

 private:
  struct FileState {
    std::string path;
    std::uint64_t bytes = 0;
    std::int64_t mtime_ns = 0;
    std::uint64_t device = 0;
    std::uint64_t inode = 0;
  };
  std::vector<FileState> files_;
};

}  // namespace dufu::trainer
