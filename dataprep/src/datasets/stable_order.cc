// The stable order of a causal-LM dataset (DataOrder::kStable, issue 45): the first N
// samples do not depend on how many are asked for, so a run made longer continues
// exactly. Megatron's order cannot: it shuffles the documents of all epochs together
// (and the last one apart or not, by how much of it is used) and the samples of all
// epochs together, so the epoch count, which follows the run's length, changes every
// sample's place.
//
// Epoch e's generator is numpy's RandomState(seed + e * 0x9E3779B1 mod 2^32). It
// shuffles the split's documents for epoch e, then the samples that start in epoch e
// (sample k starts at token k * seq_length of the document stream: epoch e holds the k
// with e*T <= k*S < (e+1)*T, T tokens an epoch). Enough epochs G are taken for the
// samples asked for, all of each (ceil(G*T/S) samples), and the documents of one epoch
// more, which the last sample of epoch G-1 may reach into. Sample walk and dtypes are
// Megatron's. tests/reference/gpt_indices_reference.py --order stable is the numpy
// reference.
#include <limits>
#include <numeric>
#include <span>

#include "causal_lm_indices.h"
#include "dufu/common/error.h"
#include "dufu/common/numpy_random.h"
#include "index_build_stop.h"
#include "sized_array.h"

namespace dufu::dataprep {
namespace {

// Far apart for neighbouring epochs and seeds (the golden ratio's 32-bit constant).
std::uint32_t epoch_seed(std::uint32_t seed, std::uint64_t epoch) {
  return static_cast<std::uint32_t>(seed + static_cast<std::uint32_t>(epoch) * 0x9E3779B1u);
}

// ceil(a / b) for a product that may pass 64 bits.
std::uint64_t ceil_div(unsigned __int128 a, std::uint64_t b) { return static_cast<std::uint64_t>((a + b - 1) / b); }

}  // namespace

CausalLMIndices build_stable_causal_lm_indices(const std::vector<std::int32_t>& sequence_ids, const SplitTokens& split,
                                               std::uint64_t seq_length, std::optional<std::uint64_t> num_samples,
                                               std::uint32_t seed, const std::atomic<bool>* stop) {
  const std::uint64_t m = sequence_ids.size();
  const std::uint64_t S = seq_length;
  const std::uint64_t T = split.tokens;
  // G = the fewest epochs whose samples, ceil(G*T/S), are at least N: G*T > (N-1)*S.
  std::uint64_t groups = 1;
  if (num_samples && *num_samples > 1) {
    const unsigned __int128 g = static_cast<unsigned __int128>(*num_samples - 1) * S / T + 1;
    if (g >= std::numeric_limits<std::uint32_t>::max()) {
      DUFU_FAIL(*num_samples, " samples of ", S, " tokens need ", static_cast<std::uint64_t>(g),
                " epochs of the split (", T, " tokens), too many");
    }
    groups = static_cast<std::uint64_t>(g);
  }
  const std::uint64_t epochs = groups + 1;
  if (checked_mul(epochs, T, "epochs x tokens") > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    DUFU_FAIL("epochs x tokens exceeds int64");
  }

  std::vector<NumpyRandomState> generators;
  generators.reserve(epochs);
  std::vector<std::int32_t> order = document_positions(epochs, m);
  for (std::uint64_t e = 0; e < epochs; ++e) {
    throw_if_stopped(stop);
    generators.emplace_back(epoch_seed(seed, e));
    generators.back().shuffle(std::span<std::int32_t>(order.data() + e * m, m));
  }

  const std::uint64_t n = ceil_div(static_cast<unsigned __int128>(groups) * T, S);
  std::vector<std::int64_t> sample_index = walk_samples(split.sizes, order, S, n, stop);

  throw_if_stopped(stop);
  std::vector<std::int64_t> shuffle_index = sized_array<std::int64_t>(n, str_cat("the shuffle index of ", n, " samples"));
  std::iota(shuffle_index.begin(), shuffle_index.end(), std::int64_t{0});
  for (std::uint64_t e = 0; e < groups; ++e) {
    const std::uint64_t first = ceil_div(static_cast<unsigned __int128>(e) * T, S);
    const std::uint64_t end = ceil_div(static_cast<unsigned __int128>(e + 1) * T, S);
    generators[e].shuffle(std::span<std::int64_t>(shuffle_index.data() + first, end - first));
  }

  return indices_of(std::move(order), std::move(sample_index), std::move(shuffle_index), sequence_ids, epochs, false,
                    stop);
}

}  // namespace dufu::dataprep
