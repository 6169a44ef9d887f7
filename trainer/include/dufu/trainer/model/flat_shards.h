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

// The buckets [begin, end) that cut n elements into pieces of bucket_elements (>= 1),
// the last one shorter; none for n = 0.
std::vector<std::pair<std::size_t, std::size_t>> gradient_buckets(std::size_t n, std::size_t bucket_elements);

}  // namespace dufu::trainer
