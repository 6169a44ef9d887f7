// Samplers decide which dataset indices this rank reads, epoch by epoch. Each one is
// random access within an epoch (at(position)), so a loader's position is just
// (epoch, position) and resuming is exact. Shuffles use numpy's RandomState so they
// can be checked against numpy.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace dufu::dataprep {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Indices this sampler yields per epoch.
  virtual std::uint64_t size() const = 0;
  // Prepares the order of `epoch` (a reshuffle for random samplers).
  virtual void set_epoch(std::uint64_t epoch) = 0;
  virtual std::uint64_t epoch() const = 0;
  // The dataset index at `position` (< size()) of the current epoch.
  virtual std::uint64_t at(std::uint64_t position) const = 0;
};

// 0, 1, ..., n-1 every epoch.
std::unique_ptr<Sampler> make_sequential_sampler(std::uint64_t dataset_size);

// A permutation of [0, n) per epoch: numpy.random.RandomState(seed + epoch) shuffling arange(n).
std::unique_ptr<Sampler> make_random_sampler(std::uint64_t dataset_size, std::uint32_t seed);

// Megatron's pretraining sampler: the global order is 0..n-1 (the dataset is already
// shuffled) and does not depend on the data-parallel size; each global batch of
// micro_batch × data_parallel_size consecutive indices is split so that rank r takes
// the r-th micro_batch slice. Incomplete last global batches are dropped.
std::unique_ptr<Sampler> make_megatron_pretraining_sampler(std::uint64_t dataset_size,
                                                           std::uint64_t micro_batch,
                                                           std::uint64_t data_parallel_rank,
                                                           std::uint64_t data_parallel_size);

// OSLO's DistributedProxySampler (torch's DistributedSampler over the positions of
// any sampler): per epoch, the wrapped sampler's order, optionally permuted with
// RandomState(seed + epoch); padded by repeating leading entries up to a multiple of
// num_replicas (or truncated with drop_last); rank r takes entries r, r + R, r + 2R...
struct DistributedOptions {
  std::uint64_t num_replicas = 1;
  std::uint64_t rank = 0;
  bool shuffle = true;
  std::uint32_t seed = 0;
  bool drop_last = false;
};
std::unique_ptr<Sampler> make_distributed_proxy_sampler(std::unique_ptr<Sampler> inner,
                                                        DistributedOptions options);

// Where a stream of indices stands: the next index is at(position) of `epoch`.
struct SamplerPosition {
  std::uint64_t epoch = 0;
  std::uint64_t position = 0;
  bool operator==(const SamplerPosition&) const = default;
};

// Walks a sampler forever, moving to the next epoch (and its new order) by itself.
class SamplerStream {
 public:
  explicit SamplerStream(std::unique_ptr<Sampler> sampler, SamplerPosition start = {});
  std::uint64_t next();
  SamplerPosition position() const { return position_; }
  void restore(SamplerPosition position);
  const Sampler& sampler() const { return *sampler_; }

 private:
  std::unique_ptr<Sampler> sampler_;
  SamplerPosition position_;
};

}  // namespace dufu::dataprep
