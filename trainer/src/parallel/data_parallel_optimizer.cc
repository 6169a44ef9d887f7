#include "dufu/trainer/parallel/data_parallel_optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/trainer/model/recipe_rules.h"

namespace dufu::trainer {

namespace {

AdamW make_optimizer(const GPT& model, AdamWOptions options, const Communicator& group, bool sharded) {
  if (!sharded) return AdamW(model, options);
  const auto [begin, end] = zero_shard_range(model.num_parameters(), group.size(), group.rank());
  return AdamW(model.parameter_tensors(), model.num_parameters(), options, begin, end, &model.parameter_device());
}

}  // namespace

std::size_t bucket_elements_for(double megabytes) {
  DUFU_CHECK(std::isfinite(megabytes) && megabytes > 0.0, "bucket_elements_for: ", megabytes, " MB");
  const double elements = std::floor(megabytes * 1024.0 * 1024.0 / sizeof(float));
  return elements < 1.0 ? 1 : static_cast<std::size_t>(elements);
}

DataParallelOptimizer::DataParallelOptimizer(GPT& model, AdamWOptions options, Communicator& data_group,
                                             int zero_stage, Communicator* pipeline_group, Communicator* tensor_group,
                                             std::size_t bucket_elements, bool reduce_each_micro_batch,
                                             bool overlap_reduction)
    : model_(model),
      options_(options),
      group_(data_group),
      pipeline_group_(pipeline_group != nullptr && pipeline_group->size() > 1 ? pipeline_group : nullptr),
      tensor_group_(tensor_group != nullptr && tensor_group->size() > 1 ? tensor_group : nullptr),
      zero_(zero_stage, data_group.size()),
      sharded_(zero_.shards_optimizer_state()),
      layers_each_micro_batch_(data_group.size() > 1 && (zero_.shards_gradients() || reduce_each_micro_batch)),
      bucket_elements_(bucket_elements),
      optimizer_(make_optimizer(model, options, data_group, sharded_)),
      overlap_(overlap_reduction && zero_.shards_gradients()) {
  DUFU_CHECK(!reduce_each_micro_batch || zero_stage == 0,
             "DataParallelOptimizer: reducing each micro-batch is stage 0's option (stages 2 and 3 always do)");
  DUFU_CHECK(bucket_elements_ >= 1, "DataParallelOptimizer: a bucket of 0 elements");
  Device& device = model.device();
  if (layers_each_micro_batch_) {
    if (zero_.shards_parameters()) {
      RecipeChoices sharded = model.recipe_choices(model.precision(), model.optimizer_offloaded());
      sharded.zero_stage = 3;
      check_recipe(sharded);
    }
    // Before the model's gradient is allocated (its first use, below): under ZeRO-2
    // the whole gradient is never held. ZeRO-3: the store keeps only this rank's shard
    // of the parameters, the masters step() updates (the same range as the moments'
    // and the gradient's shard).
    auto store = std::make_unique<ParameterStore>(
        model.storage_shape(),
        ParameterStoreOptions{.sink = this,
                              .gradient_windowed = zero_.shards_gradients(),
                              .gradient_windows = overlap_ ? 2 : 1,
                              .parameter_group = zero_.shards_parameters() ? &data_group : nullptr,
                              .bucket_elements = bucket_elements_});
    store_ = store.get();
    model.replace_parameter_storage(std::move(store));
  }
  if (sharded_) {
    shard_size_ = zero_shard_range(model.num_parameters(), group_.size(), 0).second;  // the first, longest
    grad_shard_ = DeviceBuffer<float>(device, shard_size_);
    // Under offload the parameters are host memory, which the communicator does not
    // move: each bucket meets in a device buffer first.
    if (model.optimizer_offloaded()) {
      staging_ = DeviceBuffer<float>(device, std::min(bucket_elements_, model.num_parameters()));
    }
  }
  if (layers_each_micro_batch_) {
    if (zero_.shards_gradients()) {
      reduced_piece_ = DeviceBuffer<float>(device, std::min(bucket_elements_, shard_size_));
      const std::size_t layer_size = model.layer_range(0).second;
      for (int window = 0; window < (overlap_ ? 2 : 0); ++window) {
        reduced_windows_[window] = DeviceBuffer<float>(device, std::min(layer_size, shard_size_));
      }
    } else {
      const auto [first, layer_size] = model.layer_range(0);
      const auto layers = static_cast<std::size_t>(model.pipeline_stage().num_layers);
      layer_sums_ = DeviceBuffer<float>(device, layer_size * layers);
    }
  }
  model.zero_grad();  // the gradient's memory now, with the rest of the model's
}

DataParallelOptimizer::~DataParallelOptimizer() {
  if (store_ == nullptr) return;
  try {
    store_->detach_sink();
  } catch (...) {
    // A failed fill on a device in error: the model is left without a sink, and its
    // next backward refuses to run (GPT::backward_stage).
  }
}

void DataParallelOptimizer::all_reduce_in_buckets(std::span<float> gradient) {
  for (const auto& [begin, end] : gradient_buckets(gradient.size(), bucket_elements_)) {
    group_.all_reduce(gradient.subspan(begin, end - begin), ReduceOp::kSum);
  }
}

void DataParallelOptimizer::start_accumulation() {
  Device& device = model_.device();
  if (zero_.shards_gradients()) {
    device.fill(grad_shard_.data(), 0.0f, grad_shard_.size());
  } else {
    device.fill(layer_sums_.data(), 0.0f, layer_sums_.size());
  }
  accumulation_fresh_ = false;
}

void DataParallelOptimizer::take(int local_layer, std::span<float> gradient) {
  if (accumulation_fresh_) start_accumulation();
  const auto [offset, size] = model_.layer_range(local_layer);
  DUFU_CHECK(gradient.size() == size);
  if (overlap_) {
    start_layer_reduction(local_layer, gradient);
    return;
  }
  if (zero_.shards_gradients()) {
    reduce_scatter_into_shard(offset, gradient, true);
    return;
  }
  all_reduce_in_buckets(gradient);
  float* sums = layer_sums_.data() + (offset - model_.layer_range(0).first);
  model_.device().kernels().add(sums, sums, gradient.data(), size);
}

void DataParallelOptimizer::release(int local_layer) {
  if (overlap_ && pending_layer_[local_layer % 2] == local_layer) finish_layer_reduction(local_layer % 2);
}

void DataParallelOptimizer::progress() {
  for (const std::vector<PendingBucket>& window : pending_) {
    for (const PendingBucket& bucket : window) bucket.collective->test();
  }
}

void DataParallelOptimizer::start_layer_reduction(int local_layer, std::span<const float> gradient) {
  // The blocking path's buckets and pieces (reduce_scatter_into_shard), started now and
  // added into the shard when finished: the same sums, added in the same order, since
  // the model releases a window before the layer it next takes in it.
  const int window = local_layer % 2;
  DUFU_CHECK(pending_layer_[window] < 0, "DataParallelOptimizer: layer ", local_layer, " taken while layer ",
             pending_layer_[window], " still reduces in its window");
  const std::size_t offset = model_.layer_range(local_layer).first;
  const std::size_t shard_begin = optimizer_.shard_begin();
  std::size_t used = 0;
  for (const auto& [a, b] : gradient_buckets(gradient.size(), bucket_elements_)) {
    const std::size_t low = offset + a;
    const std::span<const std::size_t> counts = shard_pieces(low, offset + b);
    const std::size_t own = counts[static_cast<std::size_t>(group_.rank())];
    float* reduced = reduced_windows_[window].data() + used;
    float* destination = own > 0 ? grad_shard_.data() + (std::max(low, shard_begin) - shard_begin) : nullptr;
    pending_[window].push_back(
        {group_.start_reduce_scatter_v(gradient.subspan(a, b - a), std::span<float>(reduced, own), counts), reduced,
         destination, own});
    used += own;
  }
  pending_layer_[window] = local_layer;
}

void DataParallelOptimizer::finish_layer_reduction(int window) {
  const KernelTable& kernels = model_.device().kernels();
  for (PendingBucket& bucket : pending_[window]) {
    bucket.collective->wait();
    if (bucket.count > 0) kernels.add(bucket.destination, bucket.destination, bucket.reduced, bucket.count);
  }
  pending_[window].clear();
  pending_layer_[window] = -1;
}

std::span<const std::size_t> DataParallelOptimizer::shard_pieces(std::size_t low, std::size_t high) {
  dufu::trainer::shard_pieces(model_.num_parameters(), group_.size(), low, high, piece_counts_);
  return piece_counts_;
}

void DataParallelOptimizer::reduce_scatter_into_shard(std::size_t offset, std::span<const float> gradient,
                                                      bool accumulate) {
  // One uneven reduce-scatter per bucket of the flat range gives each rank the sum of
  // its piece: written into the shard, or added to what it holds.
  const std::size_t shard_begin = optimizer_.shard_begin();
  const KernelTable& kernels = model_.device().kernels();
  for (const auto& [a, b] : gradient_buckets(gradient.size(), bucket_elements_)) {
    const std::size_t low = offset + a;
    const std::span<const std::size_t> counts = shard_pieces(low, offset + b);
    const std::size_t own = counts[static_cast<std::size_t>(group_.rank())];
    if (own == 0) {
      group_.reduce_scatter_v(gradient.subspan(a, b - a), std::span<float>(), counts);
      continue;
    }
    float* destination = grad_shard_.data() + (std::max(low, shard_begin) - shard_begin);
    float* reduced = accumulate ? reduced_piece_.data() : destination;
    group_.reduce_scatter_v(gradient.subspan(a, b - a), std::span<float>(reduced, own), counts);
    if (accumulate) kernels.add(destination, destination, reduced, own);
  }
}

void DataParallelOptimizer::reduce_edges_and_layers() {
  // After the last micro-batch: the layers are reduced already; the edges, whole on
  // every rank (and the tied wte's two stages summed by the pipeline schedule), now.
  if (accumulation_fresh_) start_accumulation();
  accumulation_fresh_ = true;
  // The layers' reductions still in flight land first (the model zeroes their windows
  // when it next needs them).
  for (int window = 0; window < 2; ++window) {
    if (pending_layer_[window] >= 0) finish_layer_reduction(window);
  }
  if (zero_.shards_gradients()) {
    for (const ParameterStore::EdgeGradient& edge : store_->edge_gradients()) {
      reduce_scatter_into_shard(edge.offset, edge.gradient, true);
    }
    return;
  }
  for (const ParameterStore::EdgeGradient& edge : store_->edge_gradients()) all_reduce_in_buckets(edge.gradient);
  const std::size_t first = model_.layer_range(0).first;
  model_.device().copy(model_.grads().data() + first, layer_sums_.data(), layer_sums_.size() * sizeof(float));
}

double DataParallelOptimizer::reduce_gradients_and_clip(double max_norm) {
  if (layers_each_micro_batch_) {
    reduce_edges_and_layers();
  } else if (sharded_) {
    reduce_scatter_into_shard(0, model_.grads(), false);
  }
  if (!sharded_) {
    if (group_.size() > 1 && !layers_each_micro_batch_) all_reduce_in_buckets(model_.grads());
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
  // Host values: all_reduce_value, which a device communicator runs on its host plane.
  sums[0] = group_.all_reduce_value(sums[0]);
  sums[1] = group_.all_reduce_value(sums[1]);
  double total = sums[0] + (tensor_group_ != nullptr ? tensor_group_->all_reduce_value(sums[1]) : sums[1]);
  if (pipeline_group_ != nullptr) total = pipeline_group_->all_reduce_value(total);
  return total;
}

void DataParallelOptimizer::step(float lr) {
  if (!sharded_ && model_.optimizer_offloaded()) {
    // The reduced gradients come to the host, where the masters and moments are.
    host_grads_.resize(model_.num_parameters());
    model_.device().download(host_grads_.data(), model_.grads().data(), host_grads_.size() * sizeof(float));
    optimizer_.step(model_.params(), host_grads_, lr, grad_scale_);
    return;
  }
  if (!sharded_) {
    optimizer_.step(model_.params(), model_.grads(), lr, grad_scale_);
    return;
  }
  const std::size_t begin = optimizer_.shard_begin();
  const std::size_t count = optimizer_.num_parameters();
  const std::span<const float> gradient_shard(grad_shard_.data(), count);
  if (store_ != nullptr && store_->parameters_sharded()) {
    // ZeRO-3: the model's shard is the masters; the layers are gathered at their use.
    optimizer_.step(store_->parameter_shard().first(count), gradient_shard, lr, grad_scale_);
    store_->parameter_shard_updated();
    return;
  }
  const auto params = model_.params();
  if (model_.optimizer_offloaded()) {
    // The host updates its shard of the masters from the reduced gradient shard.
    host_grads_.resize(count);
    model_.device().download(host_grads_.data(), grad_shard_.data(), count * sizeof(float));
    optimizer_.step(params.subspan(begin, count), host_grads_, lr, grad_scale_);
  } else {
    optimizer_.step(params.subspan(begin, count), gradient_shard, lr, grad_scale_);
  }
  all_gather_parameters_in_buckets();
}

void DataParallelOptimizer::all_gather_parameters_in_buckets() {
  // The reduce-scatter's buckets backwards: each bucket of the flat parameters is
  // gathered in place from the ranks whose shards it crosses. Under offload the
  // parameters are host memory and the bucket meets in the device's staging buffer.
  Device& device = model_.device();
  const bool offloaded = model_.optimizer_offloaded();
  const auto params = model_.params();
  for (const auto& [low, high] : gradient_buckets(params.size(), bucket_elements_)) {
    const std::span<const std::size_t> counts = shard_pieces(low, high);
    const auto me = static_cast<std::size_t>(group_.rank());
    const std::size_t own = counts[me];
    std::size_t own_offset = 0;  // this rank's chunk in the bucket: the pieces before it
    for (std::size_t r = 0; r < me; ++r) own_offset += counts[r];
    if (!offloaded) {
      const std::span<float> bucket = params.subspan(low, high - low);
      group_.all_gather_v(std::span<const float>(bucket.data() + own_offset, own), bucket, counts);
      continue;
    }
    const std::span<float> staged(staging_.data(), high - low);
    if (own > 0) device.upload(staged.data() + own_offset, params.data() + low + own_offset, own * sizeof(float));
    group_.all_gather_v(std::span<const float>(staged.data() + own_offset, own), staged, counts);
    // Back to the host around this rank's own piece, which is there already.
    if (own_offset > 0) device.download(params.data() + low, staged.data(), own_offset * sizeof(float));
    const std::size_t after = own_offset + own;
    if (after < staged.size()) {
      device.download(params.data() + low + after, staged.data() + after, (staged.size() - after) * sizeof(float));
    }
  }
}

AdamW DataParallelOptimizer::make_full_state() const { return AdamW(model_, options_); }

void DataParallelOptimizer::load_full_state(const AdamW& full) {
  DUFU_CHECK(full.num_parameters() == model_.num_parameters(), "load_full_state: a state of ", full.num_parameters(),
             " parameters for a model of ", model_.num_parameters());
  const std::size_t begin = optimizer_.shard_begin();
  const std::size_t count = optimizer_.num_parameters();
  Device& device = optimizer_.device();
  device.copy(optimizer_.m().data(), full.m().data() + begin, count * sizeof(float));
  device.copy(optimizer_.v().data(), full.v().data() + begin, count * sizeof(float));
  optimizer_.set_step_count(full.step_count());
}

}  // namespace dufu::trainer
