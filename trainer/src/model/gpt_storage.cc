// GPT's side of its parameter storage (parameter_storage.h): the views over the
// storage's memory, the whole-buffer accessors that need the storage to keep things
// whole, and the replacement of one storage by another.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/trainer/model/gpt.h"
#include "gpt_tensor_views.h"

namespace dufu::trainer {

std::pair<std::size_t, std::size_t> GPT::layers_extent() const {
  std::size_t begin = num_parameters_;
  std::size_t end = 0;
  for (const ParamTensor& tensor : layout_) {
    if (!tensor.name.starts_with("h.")) continue;
    begin = std::min(begin, tensor.offset);
    end = std::max(end, tensor.offset + tensor.size());
  }
  const auto layers = static_cast<std::size_t>(stage_.num_layers);
  DUFU_CHECK(layers >= 1 && end > begin && (end - begin) % layers == 0, "GPT: the stage's ", layers,
             " layers do not fill [", begin, ", ", end, ") evenly");
  return {begin, (end - begin) / layers};
}

StorageShape GPT::storage_shape() const { return storage_shape_with(storage_->parameter_device()); }

StorageShape GPT::storage_shape_with(Device& parameter_device) const {
  const auto [begin, size] = layers_extent();
  return {.device = device_,
          .parameter_device = &parameter_device,
          .num_parameters = num_parameters_,
          .layers_begin = begin,
          .layer_size = size,
          .num_layers = stage_.num_layers};
}

std::pair<std::size_t, std::size_t> GPT::layer_range(int local_layer) const {
  DUFU_CHECK(local_layer >= 0 && local_layer < stage_.num_layers, "GPT: no local layer ", local_layer, " of ",
             stage_.num_layers);
  return storage_shape().layer_range(local_layer);
}

int GPT::layout_part(std::size_t offset) const {
  const auto [begin, size] = layers_extent();
  if (offset < begin) return -1;
  return static_cast<int>(std::min((offset - begin) / size, static_cast<std::size_t>(stage_.num_layers)));
}

void GPT::replace_parameter_storage(std::unique_ptr<ParameterStorage> storage) {
  DUFU_CHECK(storage != nullptr, "GPT::replace_parameter_storage: no storage");
  // The old gradient goes with the old storage: the new one allocates its own, zeroed.
  g_ = {};
  storage->adopt_parameters(storage_->release_parameters());
  storage_ = std::move(storage);
  make_parameter_views();
  working_weights_stale_ = true;
}

void GPT::require_whole_parameters(const char* operation) const {
  if (!storage_->parameters_whole()) {
    DUFU_FAIL(operation, ": the parameter storage spreads the parameters over the data-parallel ranks ",
              "(dist.zero_stage = 3); read download_parameters()");
  }
}

std::span<float> GPT::params() {
  require_whole_parameters("GPT::params");
  working_weights_stale_ = true;
  return storage_->parameter_memory();
}

std::span<const float> GPT::params() const {
  require_whole_parameters("GPT::params");
  return storage_->parameter_memory();
}

void GPT::upload_parameters(std::span<const float> host) {
  storage_->upload_parameters(host);
  working_weights_stale_ = true;
}

void GPT::acquire_layer_parameters(int local_layer) {
  if (!storage_->acquire_layer(local_layer) || precision_ != Precision::kBf16) return;
  // The working copy of exactly the values that arrived, as refresh_working_weights
  // makes it.
  const auto [offset, size] = layer_range(local_layer);
  refresh_working_range(storage_->parameter_position(offset), size, local_layer);
}

GPTTensors GPT::gradient_views() {
  float* const memory = storage_->gradient_memory().data();
  return tensor_views<float>(
      [&](const ParamTensor& tensor) { return memory + storage_->gradient_position(tensor.offset); });
}

void GPT::ensure_gradients() {
  if (storage_->has_gradient_memory() && !g_.h.empty()) return;
  storage_->allocate_gradient();
  g_ = gradient_views();
}

void GPT::require_whole_gradients(const char* operation) const {
  if (!storage_->has_gradient_memory()) DUFU_FAIL(operation, ": no gradient yet (zero_grad or backward makes it)");
  if (!storage_->gradient_whole()) {
    DUFU_FAIL(operation, ": the parameter storage does not keep the layers' gradients whole (dist.zero_stage = 2 ",
              "and 3 reduce each layer's as the backward makes it); read the optimizer's shard");
  }
}

std::span<float> GPT::grads() {
  ensure_gradients();
  require_whole_gradients("GPT::grads");
  return storage_->gradient_memory();
}

std::span<const float> GPT::grads() const {
  require_whole_gradients("GPT::grads");
  return storage_->gradient_memory();  // a const model's storage is still its own
}

std::vector<float> GPT::host_gradients() const {
  const std::span<const float> gradient = grads();
  std::vector<float> host(gradient.size());
  if (!host.empty()) device_->download(host.data(), gradient.data(), gradient.size_bytes());
  return host;
}

std::span<float> GPT::tensor_gradient(const ParamTensor& tensor) {
  ensure_gradients();
  if (tensor.name.starts_with("h.")) require_whole_gradients("GPT::tensor_gradient");
  return {storage_->gradient_memory().data() + storage_->gradient_position(tensor.offset), tensor.size()};
}

}  // namespace dufu::trainer
