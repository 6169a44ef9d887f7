// The count patterns the uneven collectives (reduce_scatter_v, all_gather_v) are checked
// on, for every backend that has them: zeros between chunks (ZeRO-2's layer ranges), one
// rank owning everything in turn, growing chunks of about `scale` elements, all equal,
// and nothing at all.
#pragma once

#include <cstddef>
#include <vector>

namespace dufu::testing {

inline std::vector<std::vector<std::size_t>> uneven_count_patterns(std::size_t ranks, std::size_t scale) {
  std::vector<std::vector<std::size_t>> patterns;
  std::vector<std::size_t> zeros_between{0, 5, 0, 3};
  zeros_between.resize(ranks, 2);
  patterns.push_back(zeros_between);
  for (std::size_t owner = 0; owner < ranks; ++owner) {
    std::vector<std::size_t> one_owner(ranks, 0);
    one_owner[owner] = scale + 7;
    patterns.push_back(one_owner);
  }
  std::vector<std::size_t> growing(ranks);
  for (std::size_t k = 0; k < ranks; ++k) growing[k] = scale + 37 * k;
  patterns.push_back(growing);
  patterns.push_back(std::vector<std::size_t>(ranks, scale / 2));
  patterns.push_back(std::vector<std::size_t>(ranks, 0));
  return patterns;
}

}  // namespace dufu::testing
