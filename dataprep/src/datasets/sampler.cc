// Samplers (sequential, numpy-shuffled, Megatron's data-parallel split, torch's
// DistributedSampler over another sampler) and the stream that walks one forever.
// Every order is a pure function of (seed, epoch, sizes, rank), so a position
// (epoch, position) is all a resume needs. Permutations are stored as uint32 when the
// sampler has at most 2^32 entries (10^8 samples: 400 MB instead of 800 MB).
#include "dufu/dataprep/sampler.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/common/numpy_random.h"

namespace dufu::dataprep {
namespace {

// numpy.random.RandomState(seed + epoch), with the sum taken modulo 2^32.
NumpyRandomState epoch_random_state(std::uint32_t seed, std::uint64_t epoch) {
  return NumpyRandomState(static_cast<std::uint32_t>(seed + epoch));
}

// A vector of positions in [0, n), 32 bits wide when n allows it.
class PositionArray {
 public:
  // arange(n) shuffled by `random`, exactly as numpy's RandomState.shuffle would.
  void assign_shuffled_range(std::uint64_t n, NumpyRandomState random) {
    if (n <= std::uint64_t{std::numeric_limits<std::uint32_t>::max()} + 1) {
      fill<std::uint32_t>(n, random);
    } else {
      fill<std::uint64_t>(n, random);
    }
  }

  std::uint64_t operator[](std::uint64_t i) const {
    return std::visit([i](const auto& v) -> std::uint64_t { return v[i]; }, values_);
  }

  std::uint64_t size() const {
    return std::visit([](const auto& v) -> std::uint64_t { return v.size(); }, values_);
  }

  // Keeps entries first, first + stride, first + 2 stride... of the first `count`
  // (all < size()), then `tail` if it holds a value. In place: the k-th kept entry
  // comes from index >= k, which has not been overwritten yet.
  void keep_strided(std::uint64_t first, std::uint64_t stride, std::uint64_t count,
                    std::optional<std::uint64_t> tail) {
    std::visit(
        [&](auto& v) {
          using T = typename std::decay_t<decltype(v)>::value_type;
          for (std::uint64_t k = 0; k < count; ++k) v[k] = v[first + k * stride];
          v.resize(count);
          if (tail) v.push_back(static_cast<T>(*tail));
          v.shrink_to_fit();
        },
        values_);
  }

 private:
  template <typename T>
  void fill(std::uint64_t n, NumpyRandomState& random) {
    std::vector<T> values(n);
    std::iota(values.begin(), values.end(), T{0});
    random.shuffle(std::span<T>(values));
    values_ = std::move(values);
  }

  std::variant<std::vector<std::uint32_t>, std::vector<std::uint64_t>> values_;
};

class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(std::uint64_t n) : n_(n) {}
  std::uint64_t size() const override { return n_; }
  void set_epoch(std::uint64_t epoch) override { epoch_ = epoch; }
  std::uint64_t epoch() const override { return epoch_; }
  std::uint64_t at(std::uint64_t position) const override {
    DUFU_CHECK(position < n_, "position ", position, " of ", n_);
    return position;
  }

 private:
  std::uint64_t n_;
  std::uint64_t epoch_ = 0;
};

class RandomSampler final : public Sampler {
 public:
  RandomSampler(std::uint64_t n, std::uint32_t seed) : n_(n), seed_(seed) { shuffle(); }
  std::uint64_t size() const override { return n_; }
  void set_epoch(std::uint64_t epoch) override {
    if (epoch == epoch_) return;
    epoch_ = epoch;
    shuffle();
  }
  std::uint64_t epoch() const override { return epoch_; }
  std::uint64_t at(std::uint64_t position) const override {
    DUFU_CHECK(position < n_, "position ", position, " of ", n_);
    return order_[position];
  }

 private:
  void shuffle() { order_.assign_shuffled_range(n_, epoch_random_state(seed_, epoch_)); }

  std::uint64_t n_;
  std::uint32_t seed_;
  std::uint64_t epoch_ = 0;
  PositionArray order_;
};

class MegatronPretrainingSampler final : public Sampler {
 public:
  MegatronPretrainingSampler(std::uint64_t n, std::uint64_t micro_batch, std::uint64_t rank,
                             std::uint64_t data_parallel_size)
      : micro_batch_(micro_batch),
        rank_(rank),
        global_batch_(micro_batch * data_parallel_size),
        size_((n / global_batch_) * micro_batch) {}
  std::uint64_t size() const override { return size_; }
  void set_epoch(std::uint64_t epoch) override { epoch_ = epoch; }
  std::uint64_t epoch() const override { return epoch_; }
  std::uint64_t at(std::uint64_t position) const override {
    DUFU_CHECK(position < size_, "position ", position, " of ", size_);
    return (position / micro_batch_) * global_batch_ + rank_ * micro_batch_ + position % micro_batch_;
  }

 private:
  std::uint64_t micro_batch_;
  std::uint64_t rank_;
  std::uint64_t global_batch_;
  std::uint64_t size_;
  std::uint64_t epoch_ = 0;
};

// torch.utils.data.DistributedSampler over the positions of `inner`: this rank's
// entries of the (optionally permuted, padded or truncated) position list.
class DistributedProxySampler final : public Sampler {
 public:
  DistributedProxySampler(std::unique_ptr<Sampler> inner, DistributedOptions options)
      : inner_(std::move(inner)), options_(options) {
    prepare(inner_->epoch());
  }
  std::uint64_t size() const override { return size_; }
  void set_epoch(std::uint64_t epoch) override {
    if (epoch == epoch_ && epoch == inner_->epoch()) return;
    prepare(epoch);
  }
  std::uint64_t epoch() const override { return epoch_; }
  std::uint64_t at(std::uint64_t position) const override {
    DUFU_CHECK(position < size_, "position ", position, " of ", size_);
    return inner_->at(inner_position(position));
  }

 private:
  void prepare(std::uint64_t epoch) {
    inner_->set_epoch(epoch);
    epoch_ = epoch;
    const std::uint64_t length = inner_->size();
    const std::uint64_t replicas = options_.num_replicas;
    if (length == 0) DUFU_FAIL("distributed sampler: the wrapped sampler is empty");
    if (options_.drop_last && length < replicas) {
      DUFU_FAIL("distributed sampler: ", length, " samples cannot give each of ", replicas,
                " replicas one with drop_last; use fewer replicas or drop_last=false");
    }
    length_ = length;
    const std::uint64_t total =
        options_.drop_last ? (length / replicas) * replicas : (length + replicas - 1) / replicas * replicas;
    size_ = total / replicas;
    if (!options_.shuffle) return;  // position k is (rank + k R) mod length: no table needed
    selected_.assign_shuffled_range(length, epoch_random_state(options_.seed, epoch));
    // The padded list repeats the leading entries: padded[j] = permuted[j mod length].
    // Padding is shorter than `replicas`, so a rank has at most one padded entry: its last.
    const std::uint64_t last = options_.rank + (size_ - 1) * replicas;
    std::optional<std::uint64_t> tail;
    std::uint64_t count = size_;
    if (last >= length) {
      tail = selected_[last % length];
      --count;
    }
    selected_.keep_strided(options_.rank, replicas, count, tail);
  }

  std::uint64_t inner_position(std::uint64_t position) const {
    if (options_.shuffle) return selected_[position];
    return (options_.rank + position * options_.num_replicas) % length_;
  }

  std::unique_ptr<Sampler> inner_;
  DistributedOptions options_;
  std::uint64_t epoch_ = 0;
  std::uint64_t length_ = 0;
  std::uint64_t size_ = 0;
  PositionArray selected_;
};

}  // namespace

std::unique_ptr<Sampler> make_sequential_sampler(std::uint64_t dataset_size) {
  if (dataset_size == 0) DUFU_FAIL("sequential sampler: the dataset is empty");
  return std::make_unique<SequentialSampler>(dataset_size);
}

std::unique_ptr<Sampler> make_random_sampler(std::uint64_t dataset_size, std::uint32_t seed) {
  if (dataset_size == 0) DUFU_FAIL("random sampler: the dataset is empty");
  return std::make_unique<RandomSampler>(dataset_size, seed);
}

std::unique_ptr<Sampler> make_megatron_pretraining_sampler(std::uint64_t dataset_size,
                                                           std::uint64_t micro_batch,
                                                           std::uint64_t data_parallel_rank,
                                                           std::uint64_t data_parallel_size) {
  if (dataset_size == 0) DUFU_FAIL("megatron sampler: the dataset is empty");
  if (micro_batch == 0) DUFU_FAIL("megatron sampler: micro_batch must be at least 1");
  if (data_parallel_size == 0) DUFU_FAIL("megatron sampler: data_parallel_size must be at least 1");
  if (data_parallel_rank >= data_parallel_size) {
    DUFU_FAIL("megatron sampler: data_parallel_rank ", data_parallel_rank,
              " is not below data_parallel_size ", data_parallel_size);
  }
  if (micro_batch > std::numeric_limits<std::uint64_t>::max() / data_parallel_size) {
    DUFU_FAIL("megatron sampler: micro_batch ", micro_batch, " x data_parallel_size ",
              data_parallel_size, " overflows");
  }
  const std::uint64_t global_batch = micro_batch * data_parallel_size;
  if (dataset_size < global_batch) {
    DUFU_FAIL("megatron sampler: the dataset has ", dataset_size,
              " samples, fewer than one global batch of micro_batch ", micro_batch,
              " x data_parallel_size ", data_parallel_size, " = ", global_batch,
              "; use a smaller data-parallel size or micro batch, or more data");
  }
  return std::make_unique<MegatronPretrainingSampler>(dataset_size, micro_batch, data_parallel_rank,
                                                      data_parallel_size);
}

std::unique_ptr<Sampler> make_distributed_proxy_sampler(std::unique_ptr<Sampler> inner,
                                                        DistributedOptions options) {
  if (!inner) DUFU_FAIL("distributed sampler: no sampler to wrap");
  if (options.num_replicas == 0) DUFU_FAIL("distributed sampler: num_replicas must be at least 1");
  if (options.rank >= options.num_replicas) {
    DUFU_FAIL("distributed sampler: rank ", options.rank, " is not below num_replicas ",
              options.num_replicas);
  }
  return std::make_unique<DistributedProxySampler>(std::move(inner), options);
}

SamplerStream::SamplerStream(std::unique_ptr<Sampler> sampler, SamplerPosition start)
    : sampler_(std::move(sampler)) {
  if (!sampler_) DUFU_FAIL("sampler stream: no sampler");
  restore(start);
}

std::uint64_t SamplerStream::next() {
  const std::uint64_t index = sampler_->at(position_.position);
  if (++position_.position == sampler_->size()) {
    // Move on eagerly, so a position never points past the end of its epoch.
    sampler_->set_epoch(position_.epoch + 1);
    ++position_.epoch;
    position_.position = 0;
    if (sampler_->size() == 0) DUFU_FAIL("sampler stream: epoch ", position_.epoch, " is empty");
  }
  return index;
}

void SamplerStream::restore(SamplerPosition position) {
  sampler_->set_epoch(position.epoch);
  const std::uint64_t size = sampler_->size();
  if (size == 0) DUFU_FAIL("sampler stream: epoch ", position.epoch, " is empty");
  if (position.position > size) {
    DUFU_FAIL("sampler stream: position ", position.position, " is past the end of epoch ",
              position.epoch, " (", size, " indices)");
  }
  if (position.position == size) {
    sampler_->set_epoch(position.epoch + 1);
    position = {position.epoch + 1, 0};
  }
  position_ = position;
}

}  // namespace dufu::dataprep
