// Tests of the infinite loader over an in-test dataset whose sample i holds
// i * 1000 + t, so every batch is checked value by value: order independent of the
// worker count, epochs continuing (and reshuffling) across batches, exact resume from
// a saved state, clean shutdown with a full queue, and worker errors surfacing.
#include "dufu/dataprep/data_loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

using std::chrono::milliseconds;
using std::chrono::microseconds;

constexpr std::uint64_t kSampleLength = 5;

std::int32_t token_of(std::uint64_t index, std::uint64_t t) {
  return static_cast<std::int32_t>(index * 1000 + t);
}

// Sample i is i*1000 + t. Optionally slow (jittered, so workers finish out of order)
// and failing at one index.
class EncodedDataset final : public TokenDataset {
 public:
  explicit EncodedDataset(std::uint64_t size) : size_(size) {}
  std::uint64_t size() const override { return size_; }
  std::uint64_t sample_length() const override { return kSampleLength; }
  void get(std::uint64_t index, std::span<std::int32_t> out) const override {
    ++reads;
    if (delay.count() > 0) std::this_thread::sleep_for(delay * static_cast<int>(index % 3));
    if (fail_at && index == *fail_at) DUFU_FAIL("cannot read sample ", index);
    if (out.size() != kSampleLength) DUFU_FAIL("wrong output size ", out.size());
    for (std::uint64_t t = 0; t < out.size(); ++t) out[t] = token_of(index, t);
  }
  std::string describe() const override { return "encoded test dataset"; }

  std::uint64_t size_;
  microseconds delay{0};
  std::optional<std::uint64_t> fail_at;
  mutable std::atomic<std::uint64_t> reads{0};
};

// What a loader must return: rows drawn from a SamplerStream of the same sampler.
std::vector<Batch> expected_batches(std::unique_ptr<Sampler> sampler, std::uint64_t micro_batch,
                                    std::uint64_t count, SamplerPosition start = {}) {
  SamplerStream stream(std::move(sampler), start);
  std::vector<Batch> batches;
  for (std::uint64_t b = 0; b < count; ++b) {
    Batch batch;
    batch.rows = micro_batch;
    batch.columns = kSampleLength;
    batch.start = stream.position();
    for (std::uint64_t r = 0; r < micro_batch; ++r) {
      const std::uint64_t index = stream.next();
      batch.indices.push_back(index);
      for (std::uint64_t t = 0; t < kSampleLength; ++t) batch.tokens.push_back(token_of(index, t));
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

void expect_batch_eq(const Batch& actual, const Batch& expected, const std::string& where) {
  EXPECT_EQ(actual.rows, expected.rows) << where;
  EXPECT_EQ(actual.columns, expected.columns) << where;
  EXPECT_EQ(actual.indices, expected.indices) << where;
  EXPECT_EQ(actual.tokens, expected.tokens) << where;
  EXPECT_EQ(actual.start, expected.start) << where;
}

// A hang is fatal: fail loudly instead of waiting for the ctest timeout.
template <typename Function>
void expect_finishes_within(std::chrono::seconds limit, Function function, const char* what) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread runner([&] {
    function();
    done.set_value();
  });
  if (finished.wait_for(limit) != std::future_status::ready) {
    std::cerr << "FATAL: " << what << " did not finish within " << limit.count() << " s\n";
    std::abort();
  }
  runner.join();
}

std::shared_ptr<EncodedDataset> make_dataset(std::uint64_t size) {
  return std::make_shared<EncodedDataset>(size);
}

// ---- content and order ----------------------------------------------------------------

TEST(DataLoaderTest, BatchesHoldExactSamplesInSamplerOrderAcrossEpochs) {
  InfiniteDataLoader loader(make_dataset(10), make_sequential_sampler(10), {3, 2, 4});
  const std::vector<std::vector<std::uint64_t>> indices = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 0, 1}, {2, 3, 4}};
  const std::vector<SamplerPosition> starts = {{0, 0}, {0, 3}, {0, 6}, {0, 9}, {1, 2}};
  for (std::size_t b = 0; b < indices.size(); ++b) {
    EXPECT_EQ(loader.state().next, starts[b]);
    EXPECT_EQ(loader.state().batches_served, b);
    const Batch batch = loader.next();
    EXPECT_EQ(batch.rows, 3u);
    EXPECT_EQ(batch.columns, kSampleLength);
    EXPECT_EQ(batch.indices, indices[b]);
    EXPECT_EQ(batch.start, starts[b]);
    ASSERT_EQ(batch.tokens.size(), 3 * kSampleLength);
    for (std::uint64_t r = 0; r < 3; ++r) {
      for (std::uint64_t t = 0; t < kSampleLength; ++t) {
        EXPECT_EQ(batch.tokens[r * kSampleLength + t], token_of(indices[b][r], t));
      }
    }
  }
}

TEST(DataLoaderTest, RowsContinueIntoTheNextEpochWithItsNewOrder) {
  const std::uint64_t n = 11;
  InfiniteDataLoader loader(make_dataset(n), make_random_sampler(n, 42), {4, 2, 3});
  std::vector<std::uint64_t> rows;
  for (int b = 0; b < 6; ++b) {
    const Batch batch = loader.next();
    rows.insert(rows.end(), batch.indices.begin(), batch.indices.end());
  }
  auto epoch0 = make_random_sampler(n, 42);
  auto epoch1 = make_random_sampler(n, 43);  // epoch 1 is RandomState(seed + 1)
  auto epoch2 = make_random_sampler(n, 44);
  std::vector<std::uint64_t> expected;
  for (const auto* sampler : {epoch0.get(), epoch1.get(), epoch2.get()}) {
    for (std::uint64_t p = 0; p < n; ++p) expected.push_back(sampler->at(p));
  }
  expected.resize(rows.size());
  EXPECT_EQ(rows, expected);
  EXPECT_NE(std::vector<std::uint64_t>(rows.begin(), rows.begin() + n),
            std::vector<std::uint64_t>(rows.begin() + n, rows.begin() + 2 * n));
}

TEST(DataLoaderTest, SameBatchesWhateverTheWorkersAndPrefetch) {
  const std::uint64_t n = 23;
  const std::uint64_t micro_batch = 4;
  const std::uint64_t count = 16;  // almost three epochs
  const auto expected = expected_batches(make_random_sampler(n, 7), micro_batch, count);
  auto dataset = make_dataset(n);
  dataset->delay = microseconds(40);  // samples finish out of order
  for (const int workers : {1, 2, 4}) {
    for (int prefetch = 1; prefetch <= 8; ++prefetch) {
      InfiniteDataLoader loader(dataset, make_random_sampler(n, 7), {micro_batch, workers, prefetch});
      for (std::uint64_t b = 0; b < count; ++b) {
        expect_batch_eq(loader.next(), expected[b],
                        "workers=" + std::to_string(workers) + " prefetch=" + std::to_string(prefetch) +
                            " batch=" + std::to_string(b));
      }
      EXPECT_EQ(loader.state().batches_served, count);
    }
  }
}

TEST(DataLoaderTest, DataParallelRanksThroughTheLoaderCoverTheGlobalOrder) {
  // Two Megatron ranks with micro-batch 2: step s gives rank 0 rows 4s, 4s+1 and rank 1
  // rows 4s+2, 4s+3; the last incomplete global batch (index 12) is dropped.
  const std::uint64_t n = 13;
  InfiniteDataLoader rank0(make_dataset(n), make_megatron_pretraining_sampler(n, 2, 0, 2), {2, 2, 2});
  InfiniteDataLoader rank1(make_dataset(n), make_megatron_pretraining_sampler(n, 2, 1, 2), {2, 2, 2});
  std::vector<std::uint64_t> global;
  for (int step = 0; step < 6; ++step) {
    for (InfiniteDataLoader* loader : {&rank0, &rank1}) {
      const Batch batch = loader->next();
      global.insert(global.end(), batch.indices.begin(), batch.indices.end());
    }
  }
  std::vector<std::uint64_t> expected;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (std::uint64_t i = 0; i < 12; ++i) expected.push_back(i);
  }
  EXPECT_EQ(global, expected);
}

// ---- resume -----------------------------------------------------------------------------

struct ResumeCase {
  std::uint64_t n;
  std::uint64_t micro_batch;
};

std::unique_ptr<Sampler> resume_sampler(std::uint64_t n) {
  return make_distributed_proxy_sampler(make_random_sampler(n, 3), {2, 1, true, 9, false});
}

TEST(DataLoaderTest, ResumesExactlyBeforeAtAndAcrossEpochBoundaries) {
  // n = 48 over 2 ranks: 24 per rank; micro-batch 4 puts an epoch boundary exactly
  // before batch 6, micro-batch 5 puts one inside batch 4 (rows 20..24).
  for (const ResumeCase c : {ResumeCase{48, 4}, ResumeCase{48, 5}}) {
    const std::uint64_t total = 16;
    auto dataset = make_dataset(c.n);
    std::vector<Batch> uninterrupted;
    std::vector<LoaderState> states;
    {
      InfiniteDataLoader loader(dataset, resume_sampler(c.n), {c.micro_batch, 3, 4});
      for (std::uint64_t b = 0; b < total; ++b) {
        states.push_back(loader.state());
        uninterrupted.push_back(loader.next());
        EXPECT_EQ(uninterrupted.back().start, states.back().next);
      }
    }
    for (const std::uint64_t k : {0, 1, 4, 5, 6, 7, 11}) {
      const std::string where = "n=" + std::to_string(c.n) + " mb=" + std::to_string(c.micro_batch) +
                                " k=" + std::to_string(k);
      LoaderState saved;
      {
        InfiniteDataLoader first(dataset, resume_sampler(c.n), {c.micro_batch, 2, 3});
        for (std::uint64_t b = 0; b < k; ++b) expect_batch_eq(first.next(), uninterrupted[b], where);
        saved = first.state();
      }  // destroyed with batches prefetched past k
      EXPECT_EQ(saved, states[k]) << where;
      EXPECT_EQ(saved.batches_served, k) << where;

      // A fresh loader from the state, after a trip through text.
      const LoaderState parsed = parse_loader_state(saved.to_string());
      EXPECT_EQ(parsed, saved) << where;
      InfiniteDataLoader fresh(dataset, resume_sampler(c.n), {c.micro_batch, 2, 5}, parsed);
      EXPECT_EQ(fresh.state(), saved) << where;
      for (std::uint64_t b = k; b < total; ++b) expect_batch_eq(fresh.next(), uninterrupted[b], where);
      EXPECT_EQ(fresh.state().batches_served, total) << where;

      // restore() on a loader that has run (and prefetched) past the state.
      fresh.restore(saved);
      EXPECT_EQ(fresh.state(), saved) << where;
      for (std::uint64_t b = k; b < total; ++b) expect_batch_eq(fresh.next(), uninterrupted[b], where);
    }
  }
}

TEST(DataLoaderTest, RestoreRefusesAPositionPastTheEpochAndKeepsGoing) {
  InfiniteDataLoader loader(make_dataset(10), make_sequential_sampler(10), {2, 2, 2});
  loader.next();
  EXPECT_THROW(loader.restore({{0, 11}, 7}), Error);
  EXPECT_EQ(loader.state(), (LoaderState{{0, 2}, 1}));
  EXPECT_EQ(loader.next().indices, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_THROW(InfiniteDataLoader(make_dataset(10), make_sequential_sampler(10), {2, 2, 2}, {{0, 12}, 0}),
               Error);
}

TEST(LoaderStateTest, RoundTripsThroughText) {
  const LoaderState state{{3, 17}, 1234};
  EXPECT_EQ(state.to_string(), "epoch=3 position=17 batches=1234");
  EXPECT_EQ(parse_loader_state(state.to_string()), state);
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  const LoaderState large{{max, max - 1}, max};
  EXPECT_EQ(parse_loader_state(large.to_string()), large);
}

TEST(LoaderStateTest, MalformedTextIsAnError) {
  for (const char* text :
       {"", "epoch=1 position=2", "epoch=1 position=2 batches=3 ", " epoch=1 position=2 batches=3",
        "epoch=1  position=2 batches=3", "position=2 epoch=1 batches=3", "epoch=-1 position=2 batches=3",
        "epoch=x position=2 batches=3", "epoch= position=2 batches=3", "epoch=1 position=2 batches=3x",
        "epoch=99999999999999999999 position=2 batches=3", "epoch 1 position 2 batches 3",
        "epoch=1 position=2 batches=3 extra=4"}) {
    EXPECT_THROW(parse_loader_state(text), Error) << "'" << text << "'";
  }
}

// ---- shutdown and errors ------------------------------------------------------------------

TEST(DataLoaderTest, DestructorReturnsWithAFullQueueOrWithoutAnyNext) {
  expect_finishes_within(std::chrono::seconds(20), [&] {
    {
      InfiniteDataLoader never_read(make_dataset(50), make_random_sampler(50, 1), {4, 4, 2});
    }  // destroyed at once: workers may be mid-batch
    {
      auto dataset = make_dataset(50);
      InfiniteDataLoader full(dataset, make_random_sampler(50, 1), {4, 4, 2});
      // Wait until both prefetch slots are read; the four workers then wait for room.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (dataset->reads.load() < 2 * 4 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(1));
      }
      std::this_thread::sleep_for(milliseconds(20));
      EXPECT_EQ(dataset->reads.load(), 8u) << "exactly prefetch_batches batches are read ahead";
    }
    {
      InfiniteDataLoader partly(make_dataset(50), make_random_sampler(50, 1), {4, 2, 8});
      partly.next();
    }
  }, "destroying loaders");
}

TEST(DataLoaderTest, DestructorWaitsForSlowReadsWithoutHanging) {
  auto dataset = make_dataset(30);
  dataset->delay = milliseconds(5);
  expect_finishes_within(std::chrono::seconds(20), [&] {
    InfiniteDataLoader loader(dataset, make_sequential_sampler(30), {3, 4, 8});
    loader.next();
  }, "destroying a loader mid-read");
}

// try_next waits at most its timeout and consumes nothing when the batch is not
// ready: the Python loader waits in such slices to answer Ctrl-C.
TEST(DataLoaderTest, TryNextTimesOutWithoutConsumingABatch) {
  auto dataset = make_dataset(30);
  dataset->delay = milliseconds(100);  // 0.6 s per batch: the first try comes long before
  InfiniteDataLoader loader(dataset, make_sequential_sampler(30), {6, 1, 1});
  EXPECT_FALSE(loader.try_next(milliseconds(0)).has_value());
  EXPECT_EQ(loader.state().batches_served, 0U);
  std::optional<Batch> batch;
  while (!batch) batch = loader.try_next(milliseconds(1));
  const std::vector<Batch> expected = expected_batches(make_sequential_sampler(30), 6, 2);
  expect_batch_eq(*batch, expected[0], "first batch");
  expect_batch_eq(loader.next(), expected[1], "second batch");
  EXPECT_EQ(loader.state().batches_served, 2U);
}

TEST(DataLoaderTest, WorkerErrorsSurfaceFromNextInOrder) {
  auto dataset = make_dataset(20);
  dataset->fail_at = 7;
  InfiniteDataLoader loader(dataset, make_sequential_sampler(20), {2, 3, 4});
  for (std::uint64_t b = 0; b < 3; ++b) EXPECT_EQ(loader.next().indices[0], 2 * b);
  try {
    loader.next();
    ADD_FAILURE() << "the failed read of sample 7 must surface";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot read sample 7"), std::string::npos) << error.what();
  }
  EXPECT_THROW(loader.next(), Error) << "a failed batch stays failed";
  EXPECT_EQ(loader.state(), (LoaderState{{0, 6}, 3}));
  loader.restore({{0, 8}, 3});  // skip the bad sample
  EXPECT_EQ(loader.next().indices, (std::vector<std::uint64_t>{8, 9}));
}

TEST(DataLoaderTest, SamplerIndicesOutsideTheDatasetAreErrors) {
  InfiniteDataLoader loader(make_dataset(5), make_sequential_sampler(8), {4, 1, 2});
  EXPECT_EQ(loader.next().indices, (std::vector<std::uint64_t>{0, 1, 2, 3}));
  EXPECT_THROW(loader.next(), Error);
}

TEST(DataLoaderTest, InvalidOptionsAreErrors) {
  auto dataset = make_dataset(5);
  EXPECT_THROW(InfiniteDataLoader(nullptr, make_sequential_sampler(5), {}), Error);
  EXPECT_THROW(InfiniteDataLoader(dataset, nullptr, {}), Error);
  EXPECT_THROW(InfiniteDataLoader(dataset, make_sequential_sampler(5), {0, 1, 1}), Error);
  EXPECT_THROW(InfiniteDataLoader(dataset, make_sequential_sampler(5), {1, 0, 1}), Error);
  EXPECT_THROW(InfiniteDataLoader(dataset, make_sequential_sampler(5), {1, 1, 0}), Error);
  EXPECT_THROW(InfiniteDataLoader(make_dataset(0), make_sequential_sampler(5), {}), Error);
}

}  // namespace
}  // namespace dufu::dataprep
