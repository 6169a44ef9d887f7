// How ZeRO cuts a rank's flat buffer of parameters (or gradients, or moments): into
// one shard per data-parallel rank, and into buckets of one collective each. Plain
// arithmetic, shared by the model (ZeRO-3's parameter shard, gpt.h) and the optimizer
// that shards the gradients and moments the same way (data_parallel_optimizer.h).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace dufu::trainer {

// The shard of data-parallel rank `rank` of `ranks` in a buffer of n floats:
// [begin, end), ceil(n / ranks) floats each, the last shards shorter or empty.
std::pair<std::size_t, std::size_t> zero_shard_range(std::size_t n, int ranks, int rank);

// counts[r] = how many floats of the flat range [low, high) of a buffer of n floats lie
// in rank r's shard (zero_shard_range), for r < ranks (counts resized). The pieces follow
// each other in rank order, so these are the counts of one uneven collective over the
// range.
void shard_pieces(std::size_t n, int ranks, std::size_t low, std::size_t high, std::vector<std::size_t>& counts);

// The buckets [begin, end) that cut n elements into pieces of bucket_elements (>= 1),
// the last one shorter; none for n = 0.
std::vector<std::pair<std::size_t, std::size_t>> gradient_buckets(std::size_t n, std::size_t bucket_elements);

}  // namespace dufu::trainer
