// ZeRO's flat shards and buckets (see flat_shards.h).
#include "dufu/trainer/parallel/flat_shards.h"

#include <algorithm>

#include "dufu/common/error.h"

namespace dufu::trainer {

std::pair<std::size_t, std::size_t> zero_shard_range(std::size_t n, int ranks, int rank) {
  DUFU_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "zero_shard_range: rank ", rank, " of ", ranks);
  const std::size_t shard = (n + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
  const std::size_t begin = std::min(n, shard * static_cast<std::size_t>(rank));
  return {begin, std::min(n, begin + shard)};
}

void shard_pieces(std::size_t n, int ranks, std::size_t low, std::size_t high, std::vector<std::size_t>& counts) {
  counts.resize(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const auto [begin, end] = zero_shard_range(n, ranks, r);
    counts[static_cast<std::size_t>(r)] =
        std::min(high, end) > std::max(low, begin) ? std::min(high, end) - std::max(low, begin) : 0;
  }
}

std::vector<std::pair<std::size_t, std::size_t>> gradient_buckets(std::size_t n, std::size_t bucket_elements) {
  DUFU_CHECK(bucket_elements >= 1, "gradient_buckets: a bucket of 0 elements");
  std::vector<std::pair<std::size_t, std::size_t>> buckets;
  for (std::size_t begin = 0; begin < n; begin += std::min(bucket_elements, n - begin)) {
    buckets.emplace_back(begin, begin + std::min(bucket_elements, n - begin));
  }
  return buckets;
}

}  // namespace dufu::trainer
