#include "dufu/trainer/data_parallel_optimizer.h"

#include <algorithm>
#include <cmath>

#include "dufu/common/error.h"

namespace dufu::trainer {

namespace {

std::size_t shard_size_for(std::size_t n, int ranks) {
  return (n + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
}

AdamW make_optimizer(const GPT& model, AdamWOptions options, const Communicator& group, bool sharded) {
  if (!sharded) return AdamW(model, options);
  const auto [begin, end] = zero_shard_range(model.num_parameters(), group.size(), group.rank());
  return AdamW(model.parameter_tensors(), model.num_parameters(), options, begin, end, &model.device());
}

}  // namespace

std::pair<std::size_t, std::size_t> zero_shard_range(std::size_t n, int ranks, int rank) {
  DUFU_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "zero_shard_range: rank ", rank, " of ", ranks);
  const std::size_t shard = shard_size_for(n, ranks);
  const std::size_t begin = std::min(n, shard * static_cast<std::size_t>(rank));
  return {begin, std::min(n, begin + shard)};
}

DataParallelOptimizer::DataParallelOptimizer(GPT& model, AdamWOptions options, Communicator& data_group,
                                             bool shard_optimizer_state, Communicator* pipeline_group,
                                             Communicator* tensor_group)
    : model_(model),
      options_(options),
      group_(data_group),
      pipeline_group_(pipeline_group != nullptr && pipeline_group->size() > 1 ? pipeline_group : nullptr),
      tensor_group_(tensor_group != nullptr && tensor_group->size() > 1 ? tensor_group : nullptr),
      sharded_(shard_optimizer_state && data_group.size() > 1),
      optimizer_(make_optimizer(model, options, data_group, sharded_)) {
  if (sharded_) {
    shard_size_ = shard_size_for(model.num_parameters(), group_.size());
    Device& device = model.device();
    padded_ = DeviceBuffer<float>(device, shard_size_ * static_cast<std::size_t>(group_.size()));
    grad_shard_ = DeviceBuffer<float>(device, shard_size_);
    param_shard_ = DeviceBuffer<float>(device, shard_size_);
  }
}

double DataParallelOptimizer::reduce_gradients_and_clip(double max_norm) {
  if (!sharded_) {
    if (group_.size() > 1) group_.all_reduce(model_.grads(), ReduceOp::kSum);
    double norm = 0.0;
    if (model_.tensor_parallel_size() == 1 && pipeline_group_ == nullptr) {
      norm = gradient_norm(model_.grads(), model_.device());
    } else {
      // Under tensor or pipeline parallelism each rank holds a piece of the gradient:
      // the norm is the whole model's, replicated tensors (and wte's copy on the last
      // stage) counted once.
      double sum_of_squares_total = model_.full_sum_of_squares(model_.grads());
      if (pipeline_group_ != nullptr) sum_of_squares_total = pipeline_group_->all_reduce_value(sum_of_squares_total);
      norm = std::sqrt(sum_of_squares_total);
    }
    grad_scale_ = gradient_clip_scale(norm, max_norm);
    return norm;
  }
  const auto grads = model_.grads();
  model_.device().copy(padded_.data(), grads.data(), grads.size_bytes());  // the tail past the parameters stays 0
  group_.reduce_scatter(padded_.span(), grad_shard_.span());
  const double norm = std::sqrt(sharded_sum_of_squares());
  grad_scale_ = gradient_clip_scale(norm, max_norm);
  return norm;
}

double DataParallelOptimizer::sharded_sum_of_squares() {
  // The norm from every data-parallel rank's shard: partial sums, summed in rank order.
  const KernelTable& kernels = model_.device().kernels();
  if (tensor_group_ == nullptr && pipeline_group_ == nullptr) {
    return group_.all_reduce_value(kernels.sum_of_squares(grad_shard_.data(), grad_shard_.size()));
  }
  // With tensor or pipeline parallelism the shard is of this rank's piece of the
  // model: tensors replicated over the tensor group are counted on one rank's worth
  // (every tensor rank holds the same), split ones summed over it, and the last
  // stage's copy of wte left out (the first stage counts it), as GPT::full_sum_of_squares.
  const std::size_t begin = optimizer_.shard_begin();
  const std::size_t end = begin + optimizer_.num_parameters();
  double sums[2] = {0.0, 0.0};  // replicated, split
  for (const ParamTensor& tensor : model_.parameter_tensors()) {
    if (model_.pipeline_stage().holds_wte_copy() && tensor.name == "wte.weight") continue;
    const std::size_t low = std::max(tensor.offset, begin);
    const std::size_t high = std::min(tensor.offset + tensor.size(), end);
    if (low >= high) continue;
    sums[tensor.split == TensorSplit::kReplicated ? 0 : 1] +=
        kernels.sum_of_squares(grad_shard_.data() + (low - begin), high - low);
  }
  group_.all_reduce(std::span<double>(sums, 2));
  double total = sums[0] + (tensor_group_ != nullptr ? tensor_group_->all_reduce_value(sums[1]) : sums[1]);
  if (pipeline_group_ != nullptr) total = pipeline_group_->all_reduce_value(total);
  return total;
}

void DataParallelOptimizer::step(float lr) {
  if (!sharded_) {
    optimizer_.step(model_.params(), model_.grads(), lr, grad_scale_);
    return;
  }
  Device& device = model_.device();
  const auto params = model_.params();
  const std::size_t begin = optimizer_.shard_begin();
  const std::size_t count = optimizer_.num_parameters();
  device.copy(param_shard_.data(), params.data() + begin, count * sizeof(float));
  optimizer_.step(std::span<float>(param_shard_.data(), count), std::span<const float>(grad_shard_.data(), count), lr,
                  grad_scale_);
  group_.all_gather(param_shard_.span(), padded_.span());
  device.copy(params.data(), padded_.data(), params.size_bytes());
}

AdamW DataParallelOptimizer::make_full_state() const { return AdamW(model_, options_); }

void DataParallelOptimizer::load_full_state(const AdamW& full) {
  DUFU_CHECK(full.num_parameters() == model_.num_parameters(), "load_full_state: a state of ", full.num_parameters(),
             " parameters for a model of ", model_.num_parameters());
  const std::size_t begin = optimizer_.shard_begin();
  const std::size_t count = optimizer_.num_parameters();
  Device& device = model_.device();
  device.copy(optimizer_.m().data(), full.m().data() + begin, count * sizeof(float));
  device.copy(optimizer_.v().data(), full.v().data() + begin, count * sizeof(float));
  optimizer_.set_step_count(full.step_count());
}

}  // namespace dufu::trainer
