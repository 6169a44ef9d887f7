// Causal-LM samples over one indexed shard (Megatron's GPTDataset, OSLO's
// DatasetForCausalLM): a split of the shard's documents, repeated for as many epochs
// as the requested samples need, shuffled with numpy's RandomState exactly as
// Megatron does, and cut into seq_length + 1 token windows that overlap by one token.
// Algorithms: docs/index-algorithms.md. Works on every impl (mmap, lazy, cached).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dufu/common/npy.h"
#include "dufu/dataprep/index_cache.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/token_dataset.h"

namespace dufu::dataprep {

// A part of a shard, either as OSLO's fractions of documents in stored order or as
// Megatron's split string ("969,30,1") and the part's position in it (0 = train,
// 1 = validation, 2 = test).
struct SplitSpec {
  std::optional<std::string> megatron_split;  // e.g. "969,30,1"
  int megatron_part = 0;
  double start_weight = 0.0;                  // OSLO style, used when megatron_split is empty
  double end_weight = 1.0;
  // Canonical text for cache keys and logs.
  std::string describe() const;
};

// Megatron's get_split_indices: cumulative round-half-to-even bookends over
// `num_elements`, corrected so the last bookend is num_elements.
std::vector<std::uint64_t> megatron_split_bookends(const std::string& split, std::uint64_t num_elements);
// The [begin, end) range of document numbers a split selects. Throws dufu::Error
// naming the split when that range is empty or the split is malformed.
std::pair<std::uint64_t, std::uint64_t> split_document_range(const SplitSpec& split,
                                                             std::uint64_t num_documents);

// The order of the samples (issue 45). kMegatron: Megatron-core's indices bit for bit;
// every epoch count shuffles all epochs' documents together and the shuffle depends
// on the number of samples, so a run planned longer sees other samples from the
// start. kStable: each epoch is shuffled on its own with a generator of (seed, epoch)
// alone, and the samples that start in an epoch are shuffled among themselves, so the
// first N samples are the same whatever the number of samples asked for: a run can be
// made longer and go on exactly (docs/index-algorithms.md, "The stable order").
enum class DataOrder { kMegatron, kStable };
const char* data_order_name(DataOrder order);

// The defaults of a dataset, blend or not, whichever front end builds it.
inline constexpr std::uint64_t kDefaultSeqLength = 2048;
inline constexpr std::uint32_t kDefaultSeed = 1234;

struct CausalLMOptions {
  std::uint64_t seq_length = kDefaultSeqLength;
  std::optional<std::uint64_t> num_samples;  // none = one epoch
  std::uint32_t seed = kDefaultSeed;
  SplitSpec split;
  DataOrder order = DataOrder::kMegatron;
  std::string cache_dir;                     // empty = default_index_cache_dir()
  bool use_cache = true;                     // false = build in memory, never touch disk
  // Set from another thread to stop building the indices (the Python package's
  // Ctrl-C): the constructor then throws dufu::Error and caches nothing.
  const std::atomic<bool>* stop = nullptr;
};

// The three index arrays (docs/index-algorithms.md, section 4); sample and shuffle are held as int64
// in memory. The cache writes Megatron's dtypes: document <i4; sample <i4 unless
// max(len(document_index), longest sequence of the split) > INT32_MAX, then <i8
// (Megatron's helpers.build_sample_idx rule); shuffle <u4 unless n >= 2^32 - 2, then <i8.
struct CausalLMIndices {
  std::vector<std::int32_t> document_index;
  std::vector<std::int64_t> sample_index;  // flattened [n+1, 2]
  std::vector<std::int64_t> shuffle_index;
  std::uint64_t num_epochs = 0;
  bool separate_final_epoch = false;
};

// Builds the indices in memory. `sequence_ids` are the shard's sequence numbers in the
// split (Megatron's `documents`); `sequence_length(id)` is called once per entry, before
// the linear sample walk. Throws dufu::Error when seq_length is 0 or longer than the
// split's tokens minus one, or when `stop` is set (looked at every million entries
// and between the phases; a shuffle runs to its end).
CausalLMIndices build_causal_lm_indices(const std::vector<std::int32_t>& sequence_ids,
                                        const std::function<std::uint64_t(std::uint64_t)>& sequence_length,
                                        std::uint64_t seq_length, std::optional<std::uint64_t> num_samples,
                                        std::uint32_t seed, const std::atomic<bool>* stop = nullptr,
                                        DataOrder order = DataOrder::kMegatron);

class CausalLMDataset : public TokenDataset {
 public:
  // Builds or loads the cached indices. Throws dufu::Error for a split that leaves
  // the part empty, a seq_length longer than the split's tokens, and cache problems.
  CausalLMDataset(std::shared_ptr<const IndexedDataset> shard, CausalLMOptions options);
  ~CausalLMDataset() override;

  std::uint64_t size() const override;
  std::uint64_t sample_length() const override { return options_.seq_length + 1; }
  void get(std::uint64_t index, std::span<std::int32_t> out) const override;
  std::string describe() const override;

  std::uint64_t num_epochs() const;
  // The cache key directory ("" when not cached).
  const std::string& cache_path() const { return cache_path_; }
  // The canonical description the cache key hashes.
  const std::string& description() const { return description_; }

  // Raw index access, for tests and tools.
  std::uint64_t document_index_size() const;  // entries: epochs x sequences of the split
  std::int64_t document_index_at(std::uint64_t i) const;
  std::pair<std::int64_t, std::int64_t> sample_index_at(std::uint64_t i) const;
  std::int64_t shuffle_index_at(std::uint64_t i) const;

 private:
  struct Arrays;
  std::shared_ptr<const IndexedDataset> shard_;
  CausalLMOptions options_;
  std::string description_;
  std::string cache_path_;
  std::unique_ptr<Arrays> arrays_;
};

}  // namespace dufu::dataprep
