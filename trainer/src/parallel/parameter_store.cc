// ParameterStore's parameters: whole, or ZeRO-3's shard with two layer windows that
// each layer's values are gathered into before their use. The shards cut the flat
// layout without regard to tensors or layers (zero_shard_range), exactly as the
// optimizer's gradient and moment shards do.
#include "dufu/trainer/parallel/parameter_store.h"

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/trainer/parallel/flat_shards.h"

namespace dufu::trainer {

ParameterStore::ParameterStore(const StorageShape& shape, const ParameterStoreOptions& options)
    : shape_(shape),
      parameter_device_(shape.parameter_device),
      parameter_group_(options.parameter_group != nullptr && options.parameter_group->size() > 1
                           ? options.parameter_group
                           : nullptr),
      parameter_bucket_elements_(options.bucket_elements),
      sink_(options.sink),
      gradient_windowed_(options.gradient_windowed),
      gradient_windows_(options.gradient_windowed ? std::min(options.gradient_windows, shape.num_layers) : 1) {
  DUFU_CHECK(shape.device != nullptr && shape.parameter_device != nullptr, "ParameterStore: no device");
  DUFU_CHECK(shape.num_layers >= 1 && shape.layer_size >= 1, "ParameterStore: a stage of ", shape.num_layers,
             " layers of ", shape.layer_size, " floats");
  DUFU_CHECK(sink_ != nullptr || !gradient_windowed_,
             "ParameterStore: a gradient window needs a sink to take each layer's gradient");
  DUFU_CHECK(options.gradient_windows == 1 || options.gradient_windows == 2, "ParameterStore: ",
             options.gradient_windows, " gradient windows; 1 or 2");
  if (parameter_group_ == nullptr) return;
  // The rule book refuses offload with ZeRO-3 before a store is made.
  DUFU_CHECK(parameter_device_ == shape.device, "ParameterStore: sharded parameters must be on the model's device");
  if (parameter_group_->memory_space() != shape.device->memory_space()) {
    DUFU_FAIL("ParameterStore: the data group ", parameter_group_->describe(), " moves ",
              memory_space_name(parameter_group_->memory_space()), " but the model's device ",
              shape.device->describe(), " holds ", memory_space_name(shape.device->memory_space()));
  }
  DUFU_CHECK(parameter_bucket_elements_ >= 1, "ParameterStore: a bucket of 0 elements");
}

ParameterStore::~ParameterStore() = default;

int ParameterStore::parameter_windows() const { return std::min(shape_.num_layers, 2); }

std::size_t ParameterStore::parameter_position(std::size_t offset) const {
  if (!parameters_sharded()) return offset;
  const std::size_t begin = shape_.layers_begin;
  const std::size_t size = shape_.layer_size;
  const std::size_t end = shape_.layers_end();
  if (offset < begin) return offset;
  const auto windows = static_cast<std::size_t>(parameter_windows());
  if (offset >= end) return begin + windows * size + (offset - end);
  const std::size_t layer = (offset - begin) / size;
  return begin + (layer % windows) * size + (offset - begin) % size;
}

void ParameterStore::drop_parameter_windows() {
  // A gather in flight writes into the window: it lands before the window is dropped.
  for (int window = 0; window < 2; ++window) {
    for (const auto& collective : pending_gathers_[window]) collective->wait();
    pending_gathers_[window].clear();
    window_layer_[window] = -1;
  }
}

std::span<float> ParameterStore::parameter_shard() {
  DUFU_CHECK(parameters_sharded(), "ParameterStore::parameter_shard: the parameters are whole");
  return parameter_shard_.span().first(parameter_shard_size_);
}

void ParameterStore::start_gathering_parameters(std::size_t offset, std::size_t count, float* destination,
                                                std::vector<std::unique_ptr<PendingCollective>>& pending) const {
  // Each bucket of the flat range crosses one or a few ranks' shards, in rank order:
  // one uneven all-gather brings every rank's piece of it.
  const auto me = static_cast<std::size_t>(parameter_group_->rank());
  for (const auto& [a, b] : gradient_buckets(count, parameter_bucket_elements_)) {
    const std::size_t low = offset + a;
    shard_pieces(shape_.num_parameters, parameter_group_->size(), low, offset + b, gather_counts_);
    const std::size_t own = gather_counts_[me];
    const float* mine = parameter_shard_.data() + (own > 0 ? std::max(low, parameter_shard_begin_) -
                                                                 parameter_shard_begin_
                                                           : 0);
    pending.push_back(parameter_group_->start_all_gather_v(
        std::span<const float>(mine, own), std::span<float>(destination + a, b - a), gather_counts_));
  }
}

void ParameterStore::gather_parameters(std::size_t offset, std::size_t count, float* destination) const {
  std::vector<std::unique_ptr<PendingCollective>> pending;
  start_gathering_parameters(offset, count, destination, pending);
  for (const auto& collective : pending) collective->wait();
}

void ParameterStore::expect_layer(int local_layer) {
  if (!parameters_sharded() || local_layer < 0 || local_layer >= shape_.num_layers) return;
  const int window = local_layer % parameter_windows();
  if (window_layer_[window] == local_layer) return;
  // A gather still in flight into this window was of a layer no longer wanted: it
  // lands first (the collectives complete in order on every rank anyway).
  for (const auto& collective : pending_gathers_[window]) collective->wait();
  pending_gathers_[window].clear();
  const auto [offset, size] = shape_.layer_range(local_layer);
  start_gathering_parameters(offset, size, params_.data() + parameter_position(offset), pending_gathers_[window]);
  window_layer_[window] = local_layer;
}

bool ParameterStore::acquire_layer(int local_layer) {
  if (!parameters_sharded()) return false;
  const int window = local_layer % parameter_windows();
  if (window_layer_[window] != local_layer) {
    expect_layer(local_layer);
  } else if (pending_gathers_[window].empty()) {
    return false;
  }
  for (const auto& collective : pending_gathers_[window]) collective->wait();
  pending_gathers_[window].clear();
  return true;
}

void ParameterStore::progress() const {
  for (const auto& window : pending_gathers_) {
    for (const auto& collective : window) collective->test();
  }
  if (taken_layer_[0] >= 0 || taken_layer_[1] >= 0) sink_->progress();
}

void ParameterStore::parameter_shard_updated() {
  DUFU_CHECK(parameters_sharded(), "ParameterStore::parameter_shard_updated: the parameters are whole");
  drop_parameter_windows();
  const std::size_t begin = shape_.layers_begin;
  const std::size_t end = shape_.layers_end();
  if (begin > 0) gather_parameters(0, begin, params_.data());
  if (end < shape_.num_parameters) {
    gather_parameters(end, shape_.num_parameters - end, params_.data() + parameter_position(end));
  }
  ++version_;
}

std::vector<float> ParameterStore::download_parameters() const {
  if (!parameters_sharded()) return params_.to_host();
  std::vector<float> host(shape_.num_parameters);
  // Through one bucket of device memory: the whole piece is never on the device.
  const std::size_t bucket = std::min(parameter_bucket_elements_, shape_.num_parameters);
  DeviceBuffer<float> staging(*shape_.device, bucket);
  for (const auto& [low, high] : gradient_buckets(shape_.num_parameters, bucket)) {
    gather_parameters(low, high - low, staging.data());
    shape_.device->download(host.data() + low, staging.data(), (high - low) * sizeof(float));
  }
  return host;
}

void ParameterStore::upload_parameters(std::span<const float> host) {
  if (host.size() != shape_.num_parameters) {
    DUFU_FAIL("GPT::upload_parameters: ", host.size(), " floats for a piece of ", shape_.num_parameters,
              " parameters");
  }
  ++version_;
  if (!parameters_sharded()) {
    params_.upload(host);
    return;
  }
  drop_parameter_windows();
  const std::size_t shard_end = std::min(parameter_shard_begin_ + parameter_shard_size_, shape_.num_parameters);
  Device& device = *shape_.device;
  if (shard_end > parameter_shard_begin_) {
    device.upload(parameter_shard_.data(), host.data() + parameter_shard_begin_,
                  (shard_end - parameter_shard_begin_) * sizeof(float));
  }
  const std::size_t begin = shape_.layers_begin;
  const std::size_t end = shape_.layers_end();
  if (begin > 0) device.upload(params_.data(), host.data(), begin * sizeof(float));
  if (end < shape_.num_parameters) {
    device.upload(params_.data() + parameter_position(end), host.data() + end,
                  (shape_.num_parameters - end) * sizeof(float));
  }
}

ParameterValues ParameterStore::release_parameters() {
  ParameterValues values;
  if (!parameters_sharded()) {
    values.whole = std::move(params_);
    values.whole_device = parameter_device_;
    return values;
  }
  values.host = download_parameters();
  drop_parameter_windows();
  params_.reset();
  parameter_shard_.reset();
  return values;
}

void ParameterStore::adopt_parameters(ParameterValues values) {
  ++version_;
  if (!parameters_sharded()) {
    params_ = whole_parameters_on(*parameter_device_, shape_.num_parameters, std::move(values));
    return;
  }
  // Through the host, once: the whole piece, then the new layout from it, the whole
  // piece's device memory freed before the shard takes its place.
  if (!values.whole.empty()) {
    values.host = values.whole.to_host();
    values.whole.reset();
  }
  const auto [shard_begin, shard_end] =
      zero_shard_range(shape_.num_parameters, parameter_group_->size(), parameter_group_->rank());
  parameter_shard_begin_ = shard_begin;
  parameter_shard_size_ = shard_end - shard_begin;
  parameter_shard_ = DeviceBuffer<float>(*shape_.device, std::max<std::size_t>(parameter_shard_size_, 1));
  const std::size_t layers = shape_.layer_size * static_cast<std::size_t>(shape_.num_layers);
  params_ = DeviceBuffer<float>(*shape_.device, shape_.num_parameters - layers +
                                                    static_cast<std::size_t>(parameter_windows()) * shape_.layer_size);
  upload_parameters(values.host);
}

void ParameterStore::move_parameters(Device& target) {
  if (&target == parameter_device_) return;
  DUFU_CHECK(!parameters_sharded(), "ParameterStore: sharded parameters cannot move to another device");
  DeviceBuffer<float> moved(target, params_.size());
  moved.upload(params_.to_host());
  params_ = std::move(moved);
  parameter_device_ = &target;
  ++version_;
}

}  // namespace dufu::trainer
