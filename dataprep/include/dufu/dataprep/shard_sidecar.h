// A shard's sidecar: PREFIX.dufu.json beside PREFIX.bin and PREFIX.idx, which says
// what made the ids in the pair: the tokenizer (tokenizer_record.h: kind, file names,
// absolute paths, SHA-256, pattern), the dtype, the end-of-document id, whether it was
// appended, the JSON key(s), and the sizes of the two files it describes.
//
// The name: Megatron-LM and fairseq open PREFIX.bin and PREFIX.idx and nothing else,
// so another file beside them is invisible to them. ".dufu.json" rather than ".json":
// `preprocess -i corpus.json -o corpus` must not overwrite its own input, and no
// prefix's .bin or .idx can end in ".json". Not hidden, so that `cp PREFIX.* dest/`
// carries it with the pair.
//
// Publication: every commit of a pair (commit_shard_pair) removes the old sidecar
// before renaming the new pair into place, and the writers that know the tokenizer
// (preprocess, its --shard parts, its MPI ranks' rank 0, merge) write the new one
// (atomically) after. A crash in between leaves a pair without a
// sidecar, which readers treat as a shard that records nothing, never a sidecar that
// describes another pair; and a sidecar whose sizes are not its pair's is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dufu/dataprep/dtype.h"
#include "dufu/dataprep/index.h"  // sidecar_path
#include "dufu/dataprep/tokenizer_record.h"

namespace dufu::dataprep {

struct ShardSidecar {
  TokenizerRecord tokenizer;
  DType dtype = DType::kUInt16;
  // nullopt where merged inputs disagreed (or, for eod_id, the tokenizer has none).
  std::optional<std::int64_t> eod_id;
  std::optional<bool> append_eod;
  std::optional<std::string> json_key;   // the key this shard holds
  std::vector<std::string> json_keys;    // every key of the job that wrote it
  std::uint64_t bin_bytes = 0, idx_bytes = 0;  // of the pair it describes
};

// nullopt when PREFIX has no sidecar (a shard written before dufu wrote them, or by
// another tool). Throws naming the file when it is not a sidecar, or when its sizes
// are not those of PREFIX.bin and PREFIX.idx (it describes another pair).
std::optional<ShardSidecar> read_shard_sidecar(const std::string& prefix);

// The recorded tokenizer of a shard's sidecar, its files where the sidecar says.
RecordedTokenizer sidecar_tokenizer(const std::string& prefix, const ShardSidecar& sidecar);

// The tokenizer of a set of shards (a blend): the one their sidecars record (nullopt
// when none has a sidecar) and the shards without one. Throws one line naming two
// shards and their tokenizer files when the sidecars record different tokenizers:
// their ids cannot be read, or trained on, together.
struct ShardsTokenizer {
  std::optional<RecordedTokenizer> recorded;
  std::vector<std::string> unrecorded;  // prefixes without a sidecar
};
ShardsTokenizer shards_tokenizer(const std::vector<std::string>& prefixes);

// The sidecar of a merge of `input_prefixes`: the inputs' tokenizer, with the fields
// they disagree on left unknown; nullopt when an input has none (the output then
// records nothing; a warning says which). Throws naming two inputs and their
// tokenizer files when their tokenizers differ, or when their dtypes do.
std::optional<ShardSidecar> merged_sidecar(const std::vector<std::string>& input_prefixes);

// Writes PREFIX's sidecar (atomically) with the sizes of the pair now in place; called
// right after the pair's commit, which removed the old sidecar (commit_shard_pair).
// Nothing for nullopt. Throws dufu::Error.
void publish_shard_sidecar(const std::string& prefix, std::optional<ShardSidecar> sidecar);

}  // namespace dufu::dataprep
