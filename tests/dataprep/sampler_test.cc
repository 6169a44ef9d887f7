// Tests of the samplers: orders equal numpy's RandomState and torch's
// DistributedSampler (tests/reference/sampler_reference.py), every sample is seen the
// documented number of times across data-parallel ranks, the Megatron global order
// does not depend on the data-parallel size, and epochs advance (and reshuffle).
#include "dufu/dataprep/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

std::vector<std::uint64_t> epoch_order(const Sampler& sampler) {
  std::vector<std::uint64_t> order(sampler.size());
  for (std::uint64_t p = 0; p < order.size(); ++p) order[p] = sampler.at(p);
  return order;
}

std::vector<std::uint64_t> epoch_order(Sampler& sampler, std::uint64_t epoch) {
  sampler.set_epoch(epoch);
  EXPECT_EQ(sampler.epoch(), epoch);
  return epoch_order(sampler);
}

std::vector<std::uint64_t> iota(std::uint64_t n) {
  std::vector<std::uint64_t> values(n);
  std::iota(values.begin(), values.end(), std::uint64_t{0});
  return values;
}

std::string run_reference_script() {
  const std::string command = std::string(DUFU_REFERENCE_PYTHON) + " " + DUFU_SOURCE_DIR +
                              "/tests/reference/sampler_reference.py";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return {};
  }
  std::string output;
  char buffer[65536];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return output;
}

// ---- reference orders -------------------------------------------------------------

TEST(SamplerReferenceTest, RandomAndDistributedOrdersEqualNumpyAndTorchSemantics) {
  std::istringstream lines(run_reference_script());
  std::string line;
  int shuffles = 0;
  int distributed = 0;
  while (std::getline(lines, line)) {
    const std::size_t colon = line.find(':');
    ASSERT_NE(colon, std::string::npos) << line;
    std::istringstream head(line.substr(0, colon));
    std::istringstream tail(line.substr(colon + 1));
    std::vector<std::uint64_t> expected;
    for (std::uint64_t v = 0; tail >> v;) expected.push_back(v);
    std::string kind;
    head >> kind;
    if (kind == "shuffle") {
      std::uint64_t n = 0, seed = 0, epoch = 0;
      head >> n >> seed >> epoch;
      auto sampler = make_random_sampler(n, static_cast<std::uint32_t>(seed));
      EXPECT_EQ(epoch_order(*sampler, epoch), expected) << line.substr(0, colon);
      ++shuffles;
    } else if (kind == "distributed") {
      std::uint64_t n = 0, seed = 0, epoch = 0, inner_seed = 0;
      int shuffle = 0, drop_last = 0;
      DistributedOptions options;
      std::string inner_kind;
      head >> n >> options.num_replicas >> options.rank >> shuffle >> drop_last >> seed >> epoch >>
          inner_kind >> inner_seed;
      options.shuffle = shuffle != 0;
      options.drop_last = drop_last != 0;
      options.seed = static_cast<std::uint32_t>(seed);
      auto inner = inner_kind == "random" ? make_random_sampler(n, static_cast<std::uint32_t>(inner_seed))
                                          : make_sequential_sampler(n);
      auto sampler = make_distributed_proxy_sampler(std::move(inner), options);
      EXPECT_EQ(epoch_order(*sampler, epoch), expected) << line.substr(0, colon);
      ++distributed;
    } else {
      ADD_FAILURE() << "unknown reference line: " << line;
    }
  }
  EXPECT_GE(shuffles, 15);
  EXPECT_GE(distributed, 80);
}

// ---- sequential and random -----------------------------------------------------------

TEST(SamplerTest, SequentialIsTheIdentityEveryEpoch) {
  auto sampler = make_sequential_sampler(7);
  EXPECT_EQ(sampler->size(), 7u);
  EXPECT_EQ(epoch_order(*sampler, 0), iota(7));
  EXPECT_EQ(epoch_order(*sampler, 5), iota(7));
}

TEST(SamplerTest, RandomEpochsArePermutationsAndAdvance) {
  auto sampler = make_random_sampler(37, 1234);
  const auto epoch0 = epoch_order(*sampler, 0);
  const auto epoch1 = epoch_order(*sampler, 1);
  EXPECT_NE(epoch0, epoch1);
  auto sorted = epoch1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(37));
  // Epoch e is numpy's RandomState(seed + e): epoch 1 of seed 1234 is epoch 0 of 1235.
  EXPECT_EQ(epoch1, epoch_order(*make_random_sampler(37, 1235), 0));
  // Going back gives the same order again: the order is a function of (seed, epoch).
  EXPECT_EQ(epoch_order(*sampler, 0), epoch0);
}

TEST(SamplerTest, SeedPlusEpochWrapsModulo2To32) {
  auto wrapped = make_random_sampler(50, 0xffffffffu);
  EXPECT_EQ(epoch_order(*wrapped, 1), epoch_order(*make_random_sampler(50, 0), 0));
  EXPECT_EQ(epoch_order(*wrapped, 3), epoch_order(*make_random_sampler(50, 2), 0));
}

TEST(SamplerTest, EmptyDatasetsAreErrors) {
  EXPECT_THROW(make_sequential_sampler(0), Error);
  EXPECT_THROW(make_random_sampler(0, 1), Error);
  EXPECT_THROW(make_megatron_pretraining_sampler(0, 1, 0, 1), Error);
}

// ---- torch DistributedSampler semantics across ranks ---------------------------------

struct Coverage {
  std::map<std::uint64_t, int> counts;
  std::uint64_t total = 0;
};

Coverage distributed_coverage(std::uint64_t n, std::uint64_t replicas, bool shuffle, bool drop_last,
                              bool random_inner, std::uint64_t epoch) {
  Coverage coverage;
  std::uint64_t rank_size = 0;
  for (std::uint64_t rank = 0; rank < replicas; ++rank) {
    auto inner = random_inner ? make_random_sampler(n, 5) : make_sequential_sampler(n);
    auto sampler =
        make_distributed_proxy_sampler(std::move(inner), {replicas, rank, shuffle, 11, drop_last});
    const auto order = epoch_order(*sampler, epoch);
    if (rank == 0) rank_size = order.size();
    EXPECT_EQ(order.size(), rank_size) << "every rank has the same number of samples";
    for (const std::uint64_t index : order) {
      EXPECT_LT(index, n);
      ++coverage.counts[index];
    }
    coverage.total += order.size();
  }
  return coverage;
}

TEST(DistributedSamplerTest, EveryIndexIsSeenOnceExceptTheDocumentedPaddingOrDrop) {
  for (std::uint64_t replicas = 1; replicas <= 8; ++replicas) {
    for (const std::uint64_t n : {std::uint64_t{37}, std::uint64_t{40}, replicas * 5 + 1}) {
      for (const bool shuffle : {false, true}) {
        for (const bool random_inner : {false, true}) {
          for (const std::uint64_t epoch : {0, 1}) {
            SCOPED_TRACE(::testing::Message() << "n=" << n << " R=" << replicas << " shuffle=" << shuffle
                                              << " random_inner=" << random_inner << " epoch=" << epoch);
            const std::uint64_t padded = (n + replicas - 1) / replicas * replicas;
            const Coverage keep = distributed_coverage(n, replicas, shuffle, false, random_inner, epoch);
            EXPECT_EQ(keep.total, padded);
            EXPECT_EQ(keep.counts.size(), n) << "every index appears";
            std::uint64_t repeats = 0;
            for (const auto& [index, count] : keep.counts) repeats += static_cast<std::uint64_t>(count - 1);
            EXPECT_EQ(repeats, padded - n) << "the only repeats are the padding";

            const std::uint64_t truncated = n / replicas * replicas;
            const Coverage drop = distributed_coverage(n, replicas, shuffle, true, random_inner, epoch);
            EXPECT_EQ(drop.total, truncated);
            for (const auto& [index, count] : drop.counts) EXPECT_EQ(count, 1) << index;
            EXPECT_EQ(n - drop.counts.size(), n - truncated) << "exactly n - total_size missing";
          }
        }
      }
    }
  }
}

TEST(DistributedSamplerTest, PaddingLongerThanTheDatasetRepeatsItWholeTimes) {
  // torch: indices += (indices * ceil(padding / len))[:padding]; 3 samples over 8 ranks.
  std::vector<std::uint64_t> all;
  for (std::uint64_t rank = 0; rank < 8; ++rank) {
    auto sampler = make_distributed_proxy_sampler(make_sequential_sampler(3), {8, rank, false, 0, false});
    const auto order = epoch_order(*sampler, 0);
    ASSERT_EQ(order.size(), 1u);
    all.push_back(order[0]);
  }
  EXPECT_EQ(all, (std::vector<std::uint64_t>{0, 1, 2, 0, 1, 2, 0, 1}));
}

TEST(DistributedSamplerTest, ProxySetsTheInnerEpochSoTheInnerSamplerReshuffles) {
  auto sampler = make_distributed_proxy_sampler(make_random_sampler(20, 9), {1, 0, false, 0, false});
  EXPECT_EQ(epoch_order(*sampler, 0), epoch_order(*make_random_sampler(20, 9), 0));
  EXPECT_EQ(epoch_order(*sampler, 1), epoch_order(*make_random_sampler(20, 10), 0));
}

TEST(DistributedSamplerTest, InvalidOptionsAreErrors) {
  EXPECT_THROW(make_distributed_proxy_sampler(nullptr, {}), Error);
  EXPECT_THROW(make_distributed_proxy_sampler(make_sequential_sampler(4), {0, 0, true, 0, false}), Error);
  EXPECT_THROW(make_distributed_proxy_sampler(make_sequential_sampler(4), {2, 2, true, 0, false}), Error);
  EXPECT_THROW(make_distributed_proxy_sampler(make_sequential_sampler(3), {4, 0, true, 0, true}), Error);
  EXPECT_NO_THROW(make_distributed_proxy_sampler(make_sequential_sampler(3), {4, 3, true, 0, false}));
}

// ---- Megatron pretraining sampler ------------------------------------------------------

TEST(MegatronSamplerTest, RanksSplitEachGlobalBatchAndTheGlobalOrderIgnoresDp) {
  for (std::uint64_t dp = 1; dp <= 8; ++dp) {
    for (const std::uint64_t micro_batch : {1, 3}) {
      for (const std::uint64_t n : {std::uint64_t{37}, std::uint64_t{100}}) {
        if (n < dp * micro_batch) continue;
        SCOPED_TRACE(::testing::Message() << "n=" << n << " dp=" << dp << " mb=" << micro_batch);
        const std::uint64_t global_batch = dp * micro_batch;
        const std::uint64_t steps = n / global_batch;
        std::vector<std::vector<std::uint64_t>> ranks;
        for (std::uint64_t rank = 0; rank < dp; ++rank) {
          auto sampler = make_megatron_pretraining_sampler(n, micro_batch, rank, dp);
          EXPECT_EQ(sampler->size(), steps * micro_batch);
          ranks.push_back(epoch_order(*sampler, 0));
          EXPECT_EQ(epoch_order(*sampler, 1), ranks.back()) << "same order every epoch";
        }
        // Step by step, rank after rank: the global order 0, 1, ..., steps * global_batch - 1.
        std::vector<std::uint64_t> global;
        for (std::uint64_t step = 0; step < steps; ++step) {
          for (std::uint64_t rank = 0; rank < dp; ++rank) {
            for (std::uint64_t i = 0; i < micro_batch; ++i) global.push_back(ranks[rank][step * micro_batch + i]);
          }
        }
        EXPECT_EQ(global, iota(steps * global_batch));
      }
    }
  }
}

TEST(MegatronSamplerTest, InvalidArgumentsAreErrorsThatSaySo) {
  EXPECT_THROW(make_megatron_pretraining_sampler(10, 0, 0, 1), Error);
  EXPECT_THROW(make_megatron_pretraining_sampler(10, 1, 0, 0), Error);
  EXPECT_THROW(make_megatron_pretraining_sampler(10, 1, 2, 2), Error);
  try {
    make_megatron_pretraining_sampler(10, 3, 0, 4);
    ADD_FAILURE() << "a dataset smaller than one global batch must be refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("global batch"), std::string::npos) << error.what();
  }
}

// ---- SamplerStream ---------------------------------------------------------------------

TEST(SamplerStreamTest, WalksEpochAfterEpochAndReshuffles) {
  SamplerStream stream(make_random_sampler(10, 3));
  std::vector<std::uint64_t> seen;
  for (int i = 0; i < 25; ++i) seen.push_back(stream.next());
  auto reference = make_random_sampler(10, 3);
  std::vector<std::uint64_t> expected;
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    const auto order = epoch_order(*reference, epoch);
    expected.insert(expected.end(), order.begin(), order.end());
  }
  expected.resize(25);
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(stream.position(), (SamplerPosition{2, 5}));
  EXPECT_EQ(stream.sampler().epoch(), 2u);
}

TEST(SamplerStreamTest, EndOfAnEpochIsTheStartOfTheNext) {
  SamplerStream stream(make_sequential_sampler(4));
  for (int i = 0; i < 4; ++i) stream.next();
  EXPECT_EQ(stream.position(), (SamplerPosition{1, 0}));
  stream.restore({3, 4});
  EXPECT_EQ(stream.position(), (SamplerPosition{4, 0}));
  EXPECT_THROW(stream.restore({0, 5}), Error);
}

TEST(SamplerStreamTest, RestoreAndStartPositionsContinueExactly) {
  SamplerStream reference(make_random_sampler(13, 77));
  std::vector<std::uint64_t> expected;
  std::vector<SamplerPosition> positions;
  for (int i = 0; i < 60; ++i) {
    positions.push_back(reference.position());
    expected.push_back(reference.next());
  }
  for (const int k : {0, 12, 13, 14, 40}) {
    SamplerStream started(make_random_sampler(13, 77), positions[k]);
    SamplerStream restored(make_random_sampler(13, 77));
    for (int i = 0; i < 7; ++i) restored.next();
    restored.restore(positions[k]);
    for (int i = k; i < 60; ++i) {
      ASSERT_EQ(started.next(), expected[i]) << "k=" << k << " i=" << i;
      ASSERT_EQ(restored.next(), expected[i]) << "k=" << k << " i=" << i;
    }
  }
}

TEST(SamplerStreamTest, DistributedStreamAdvancesTheEpochOfTheWholeChain) {
  // OSLO never called set_epoch, so every pass repeated; the stream must reshuffle both
  // the proxy's permutation and the wrapped sampler's.
  SamplerStream stream(make_distributed_proxy_sampler(make_random_sampler(12, 1), {3, 1, true, 2, false}));
  std::vector<std::uint64_t> epoch0, epoch1;
  for (int i = 0; i < 4; ++i) epoch0.push_back(stream.next());
  for (int i = 0; i < 4; ++i) epoch1.push_back(stream.next());
  auto reference = make_distributed_proxy_sampler(make_random_sampler(12, 1), {3, 1, true, 2, false});
  EXPECT_EQ(epoch0, epoch_order(*reference, 0));
  EXPECT_EQ(epoch1, epoch_order(*reference, 1));
  EXPECT_NE(epoch0, epoch1);
}

}  // namespace
}  // namespace dufu::dataprep
