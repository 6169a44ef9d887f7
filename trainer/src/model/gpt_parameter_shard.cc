// ZeRO-3's side of the model: the parameters sharded over the data-parallel ranks,
// each layer's gathered into one of two windows just before it is used.
//
// The layout puts the stage's layers side by side between the edge tensors (wte and
// wpe before them, ln_f and lm_head after), every layer the same size. Sharded, params_
// (and the bf16 working copy) holds the edges before, two layer windows and the edges
// after; local layer l lives in window l % 2, so the layer being computed and the next
// one (forward) or the previous one (backward) are held at once. The shards themselves
// cut the flat layout without regard to tensors or layers (zero_shard_range), exactly
// as the optimizer's gradient and moment shards do.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/trainer/model/flat_shards.h"
#include "dufu/trainer/model/gpt.h"
#include "gpt_tensor_views.h"

namespace dufu::trainer {

void GPT::require_whole_parameters(const char* operation) const {
  if (parameters_sharded()) {
    DUFU_FAIL(operation, ": the parameters are sharded over the data-parallel ranks (dist.zero_stage = 3); read ",
              "parameter_shard() or download_parameters()");
  }
}

void GPT::drop_parameter_windows() {
  // A gather in flight writes into the window: it lands before the window is dropped.
  for (int window = 0; window < 2; ++window) {
    for (const auto& collective : pending_gathers_[window]) collective->wait();
    pending_gathers_[window].clear();
    window_layer_[window] = -1;
  }
}

int GPT::parameter_windows() const { return std::min(stage_.num_layers, 2); }

std::size_t GPT::parameter_position(std::size_t offset) const {
  if (!parameters_sharded()) return offset;
  const auto [begin, size] = layers_extent();
  const std::size_t end = begin + size * static_cast<std::size_t>(stage_.num_layers);
  if (offset < begin) return offset;
  const auto windows = static_cast<std::size_t>(parameter_windows());
  if (offset >= end) return begin + windows * size + (offset - end);
  const std::size_t layer = (offset - begin) / size;
  return begin + (layer % windows) * size + (offset - begin) % size;
}

int GPT::layout_part(std::size_t offset) const {
  const auto [begin, size] = layers_extent();
  if (offset < begin) return -1;
  return static_cast<int>(std::min((offset - begin) / size, static_cast<std::size_t>(stage_.num_layers)));
}

std::span<float> GPT::parameter_shard() {
  DUFU_CHECK(parameters_sharded(), "GPT::parameter_shard: the parameters are whole (shard_parameters shards them)");
  return parameter_shard_.span().first(parameter_shard_size_);
}

void GPT::start_gathering_parameters(std::size_t offset, std::size_t count, float* destination,
                                     std::vector<std::unique_ptr<PendingCollective>>& pending) const {
  // Each bucket of the flat range crosses one or a few ranks' shards, in rank order:
  // one uneven all-gather brings every rank's piece of it.
  const auto me = static_cast<std::size_t>(parameter_group_->rank());
  for (const auto& [a, b] : gradient_buckets(count, parameter_bucket_elements_)) {
    const std::size_t low = offset + a;
    shard_pieces(num_parameters_, parameter_group_->size(), low, offset + b, gather_counts_);
    const std::size_t own = gather_counts_[me];
    const float* mine = parameter_shard_.data() + (own > 0 ? std::max(low, parameter_shard_begin_) -
                                                                 parameter_shard_begin_
                                                           : 0);
    pending.push_back(parameter_group_->start_all_gather_v(
        std::span<const float>(mine, own), std::span<float>(destination + a, b - a), gather_counts_));
  }
}

void GPT::gather_parameters(std::size_t offset, std::size_t count, float* destination) const {
  std::vector<std::unique_ptr<PendingCollective>> pending;
  start_gathering_parameters(offset, count, destination, pending);
  for (const auto& collective : pending) collective->wait();
}

void GPT::prefetch_layer_parameters(int local_layer) {
  if (!parameters_sharded() || local_layer < 0 || local_layer >= stage_.num_layers) return;
  const int window = local_layer % parameter_windows();
  if (window_layer_[window] == local_layer) return;
  // A gather still in flight into this window was of a layer no longer wanted: it
  // lands first (the collectives complete in order on every rank anyway).
  for (const auto& collective : pending_gathers_[window]) collective->wait();
  pending_gathers_[window].clear();
  const auto [offset, size] = layer_gradient_range(local_layer);
  start_gathering_parameters(offset, size, params_.data() + parameter_position(offset), pending_gathers_[window]);
  window_layer_[window] = local_layer;
}

void GPT::ensure_layer_parameters(int local_layer) {
  if (!parameters_sharded()) return;
  const int window = local_layer % parameter_windows();
  const auto [offset, size] = layer_gradient_range(local_layer);
  const std::size_t position = parameter_position(offset);
  if (window_layer_[window] != local_layer) {
    prefetch_layer_parameters(local_layer);
  } else if (pending_gathers_[window].empty()) {
    return;
  }
  for (const auto& collective : pending_gathers_[window]) collective->wait();
  pending_gathers_[window].clear();
  // The working copy of exactly these values, as refresh_working_weights makes it.
  if (precision_ == Precision::kBf16) refresh_working_range(position, size, local_layer);
}

void GPT::progress_collectives() const {
  for (const auto& window : pending_gathers_) {
    for (const auto& collective : window) collective->test();
  }
  progress_gradient_sink();
}

void GPT::parameter_shard_updated() {
  DUFU_CHECK(parameters_sharded(), "GPT::parameter_shard_updated: the parameters are whole");
  drop_parameter_windows();
  const auto [begin, size] = layers_extent();
  const std::size_t end = begin + size * static_cast<std::size_t>(stage_.num_layers);
  if (begin > 0) gather_parameters(0, begin, params_.data());
  if (end < num_parameters_) gather_parameters(end, num_parameters_ - end, params_.data() + parameter_position(end));
  working_weights_stale_ = true;
}

std::vector<float> GPT::download_parameters() const {
  std::vector<float> host(num_parameters_);
  if (!parameters_sharded()) {
    if (!host.empty()) parameter_device_->download(host.data(), params_.data(), host.size() * sizeof(float));
    return host;
  }
  // Through one bucket of device memory: the whole piece is never on the device.
  const std::size_t bucket = std::min(parameter_bucket_elements_, num_parameters_);
  DeviceBuffer<float> staging(*device_, bucket);
  for (const auto& [low, high] : gradient_buckets(num_parameters_, bucket)) {
    gather_parameters(low, high - low, staging.data());
    device_->download(host.data() + low, staging.data(), (high - low) * sizeof(float));
  }
  return host;
}

void GPT::upload_parameters(std::span<const float> host) {
  if (host.size() != num_parameters_) {
    DUFU_FAIL("GPT::upload_parameters: ", host.size(), " floats for a piece of ", num_parameters_, " parameters");
  }
  working_weights_stale_ = true;
  if (!parameters_sharded()) {
    if (!host.empty()) parameter_device_->upload(params_.data(), host.data(), host.size_bytes());
    return;
  }
  drop_parameter_windows();
  const std::size_t shard_end = std::min(parameter_shard_begin_ + parameter_shard_size_, num_parameters_);
  if (shard_end > parameter_shard_begin_) {
    device_->upload(parameter_shard_.data(), host.data() + parameter_shard_begin_,
                    (shard_end - parameter_shard_begin_) * sizeof(float));
  }
  const auto [begin, size] = layers_extent();
  const std::size_t end = begin + size * static_cast<std::size_t>(stage_.num_layers);
  if (begin > 0) device_->upload(params_.data(), host.data(), begin * sizeof(float));
  if (end < num_parameters_) {
    device_->upload(params_.data() + parameter_position(end), host.data() + end,
                    (num_parameters_ - end) * sizeof(float));
  }
}

void GPT::shard_parameters(Communicator* data_group, std::size_t bucket_elements) {
  if (data_group != nullptr && data_group->size() == 1) data_group = nullptr;
  if (data_group == nullptr && !parameters_sharded()) return;
  if (data_group != nullptr) {
    RecipeChoices sharded = recipe_choices(precision_, optimizer_offloaded());
    sharded.zero_stage = 3;
    check_recipe(sharded);
    if (data_group->memory_space() != device_->memory_space()) {
      DUFU_FAIL("GPT::shard_parameters: the data group ", data_group->describe(), " moves ",
                memory_space_name(data_group->memory_space()), " but the model's device ", device_->describe(),
                " holds ", memory_space_name(device_->memory_space()));
    }
    DUFU_CHECK(bucket_elements >= 1, "GPT::shard_parameters: a bucket of 0 elements");
  }
  // Through the host, once: the whole piece, then the new layout from it. Dropping the
  // activations' pending backward is not needed: the values do not change.
  const std::vector<float> whole = download_parameters();
  drop_parameter_windows();
  parameter_group_ = data_group;
  parameter_bucket_elements_ = bucket_elements;
  if (data_group == nullptr) {
    parameter_shard_ = DeviceBuffer<float>();
    parameter_shard_begin_ = parameter_shard_size_ = 0;
    params_ = DeviceBuffer<float>();
    params_ = DeviceBuffer<float>(*device_, num_parameters_);
  } else {
    const auto [shard_begin, shard_end] = zero_shard_range(num_parameters_, data_group->size(), data_group->rank());
    parameter_shard_begin_ = shard_begin;
    parameter_shard_size_ = shard_end - shard_begin;
    // The whole piece is on the host now: freed before the shard takes its place.
    params_ = DeviceBuffer<float>();
    parameter_shard_ = DeviceBuffer<float>(*device_, std::max<std::size_t>(parameter_shard_size_, 1));
    const auto [begin, size] = layers_extent();
    const std::size_t layers = size * static_cast<std::size_t>(stage_.num_layers);
    params_ = DeviceBuffer<float>(*device_, num_parameters_ - layers +
                                                static_cast<std::size_t>(parameter_windows()) * size);
  }
  make_parameter_views();
  upload_parameters(whole);
}

}  // namespace dufu::trainer
