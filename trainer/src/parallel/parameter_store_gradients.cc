// ParameterStore's gradient: whole, or (ZeRO-2 and 3) the edges whole and the layers in
// one or two windows, each layer's handed to the sink as the backward completes it. A
// flat offset inside the layers maps to its window by its place within its layer.
#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/trainer/parallel/parameter_store.h"

namespace dufu::trainer {

std::size_t ParameterStore::gradient_position(std::size_t offset) const {
  if (!gradient_windowed_) return offset;
  const std::size_t begin = shape_.layers_begin;
  const std::size_t size = shape_.layer_size;
  const auto windows = static_cast<std::size_t>(gradient_windows_);
  if (offset < begin) return offset;
  if (offset >= shape_.layers_end()) return begin + windows * size + (offset - shape_.layers_end());
  return begin + ((offset - begin) / size % windows) * size + (offset - begin) % size;
}

void ParameterStore::allocate_gradient() {
  if (!grads_.empty()) return;
  const std::size_t layers = shape_.layer_size * static_cast<std::size_t>(shape_.num_layers);
  const std::size_t windows = static_cast<std::size_t>(gradient_windows_) * shape_.layer_size;
  grads_ = DeviceBuffer<float>(*shape_.device,
                               gradient_windowed_ ? shape_.num_parameters - layers + windows : shape_.num_parameters);
}

void ParameterStore::zero_gradient() {
  allocate_gradient();
  reclaim_gradient_windows();
  shape_.device->fill(grads_.data(), 0.0f, grads_.size());
}

const char* ParameterStore::backward_refusal() const {
  if (gradient_windowed_ && sink_ == nullptr) {
    return "the layers' gradients are windowed but nothing takes them (the optimizer that did is gone)";
  }
  return nullptr;
}

void ParameterStore::detach_sink() {
  // What the sink holds goes back to it first.
  if (!grads_.empty()) reclaim_gradient_windows();
  sink_ = nullptr;
  if (gradient_windowed_) {
    // Dropped now and allocated whole by the next use.
    grads_.reset();
    gradient_windowed_ = false;
    gradient_windows_ = 1;
  } else if (!grads_.empty()) {
    zero_gradient();
  }
}

std::vector<ParameterStore::EdgeGradient> ParameterStore::edge_gradients() {
  // Allocated by the model only, which then makes its views over it.
  DUFU_CHECK(!grads_.empty(), "ParameterStore::edge_gradients: no gradient yet");
  const std::size_t begin = shape_.layers_begin;
  const std::size_t end = shape_.layers_end();
  std::vector<EdgeGradient> edges;
  if (begin > 0) edges.push_back({0, {grads_.data(), begin}});
  if (end < shape_.num_parameters) {
    edges.push_back({end, {grads_.data() + gradient_position(end), shape_.num_parameters - end}});
  }
  return edges;
}

void ParameterStore::begin_layer_gradient(int local_layer) {
  if (sink_ != nullptr) reclaim_gradient_window(local_layer);
}

void ParameterStore::end_layer_gradient(int local_layer) {
  if (sink_ == nullptr) return;
  const auto [offset, size] = shape_.layer_range(local_layer);
  const std::span<float> gradient(grads_.data() + gradient_position(offset), size);
  sink_->take(local_layer, gradient);
  if (gradient_windows_ == 2) {
    taken_layer_[local_layer % 2] = local_layer;
    return;
  }
  sink_->release(local_layer);
  shape_.device->fill(gradient.data(), 0.0f, gradient.size());
}

void ParameterStore::reclaim_gradient_window(int local_layer) {
  const int window = local_layer % gradient_windows_;
  if (gradient_windows_ != 2 || taken_layer_[window] < 0) return;
  const int taken = std::exchange(taken_layer_[window], -1);
  sink_->release(taken);
  const auto [offset, size] = shape_.layer_range(taken);
  shape_.device->fill(grads_.data() + gradient_position(offset), 0.0f, size);
}

void ParameterStore::reclaim_gradient_windows() {
  for (int window = 0; window < 2; ++window) {
    if (taken_layer_[window] >= 0) reclaim_gradient_window(taken_layer_[window]);
  }
}

}  // namespace dufu::trainer
