// The pieces of the causal-LM index build that Megatron's order (causal_lm_dataset.cc)
// and the stable order (stable_order.cc) share.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "dufu/dataprep/causal_lm_dataset.h"

namespace dufu::dataprep {

// The split's sequence lengths by position, and their sum.
struct SplitTokens {
  std::vector<std::int64_t> sizes;
  std::uint64_t tokens = 0;
};

// Fetches the lengths and checks what both orders need (seq_length in range, at
// least seq_length + 1 tokens, no overflow). Throws dufu::Error.
SplitTokens measure_split(const std::vector<std::int32_t>& sequence_ids,
                          const std::function<std::uint64_t(std::uint64_t)>& sequence_length, std::uint64_t seq_length,
                          const std::atomic<bool>* stop);

// `epochs` copies of 0 .. sequences-1: the document index in split positions, unshuffled.
std::vector<std::int32_t> document_positions(std::uint64_t epochs, std::uint64_t sequences);

// Megatron's sample walk over the documents in `order` (split positions): rows
// [samples + 1, 2] of (position in order, offset), flattened.
std::vector<std::int64_t> walk_samples(const std::vector<std::int64_t>& sizes, const std::vector<std::int32_t>& order,
                                       std::uint64_t seq_length, std::uint64_t samples, const std::atomic<bool>* stop);

// The indices as published: `order`'s split positions turned into sequence ids.
CausalLMIndices indices_of(std::vector<std::int32_t> order, std::vector<std::int64_t> sample_index,
                           std::vector<std::int64_t> shuffle_index, const std::vector<std::int32_t>& sequence_ids,
                           std::uint64_t epochs, bool separate_final_epoch, const std::atomic<bool>* stop);

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const char* what);

// The stable order (DataOrder::kStable, stable_order.cc).
CausalLMIndices build_stable_causal_lm_indices(const std::vector<std::int32_t>& sequence_ids, const SplitTokens& split,
                                               std::uint64_t seq_length, std::optional<std::uint64_t> num_samples,
                                               std::uint32_t seed, const std::atomic<bool>* stop);

}  // namespace dufu::dataprep
