// ZeRO-2's side of the model: the layers' gradients handed to a sink as the backward
// makes them, and optionally kept in one layer's window instead of whole.
//
// The layout puts the stage's layers side by side between the edge tensors (wte and
// wpe before them, ln_f and lm_head after), every layer the same size. Windowed,
// grads_ holds the edges before, one layer, and the edges after: a flat offset inside
// the layers maps to the window by its place within its layer.
#include <algorithm>
#include <cstddef>
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

std::pair<std::size_t, std::size_t> GPT::layer_gradient_range(int local_layer) const {
  DUFU_CHECK(local_layer >= 0 && local_layer < stage_.num_layers, "GPT: no local layer ", local_layer, " of ",
             stage_.num_layers);
  const auto [begin, size] = layers_extent();
  return {begin + static_cast<std::size_t>(local_layer) * size, size};
}

std::size_t GPT::gradient_position(std::size_t offset) const {
  if (!gradients_windowed_) return offset;
  const auto [begin, size] = layers_extent();
  const std::size_t end = begin + size * static_cast<std::size_t>(stage_.num_layers);
  const auto windows = static_cast<std::size_t>(gradient_windows_);
  if (offset < begin) return offset;
  if (offset >= end) return begin + windows * size + (offset - end);
  return begin + ((offset - begin) / size % windows) * size + (offset - begin) % size;
}

GPTTensors GPT::gradient_views() {
  return tensor_views<float>(
      [&](const ParamTensor& tensor) { return grads_.data() + gradient_position(tensor.offset); });
}

void GPT::require_whole_gradients(const char* operation) const {
  if (grads_.size() == 0) DUFU_FAIL(operation, ": no gradient yet (zero_grad or backward makes it)");
  if (gradients_windowed_) {
    DUFU_FAIL(operation, ": the layers' gradients are not kept whole (dist.zero_stage = 2 reduces each layer's as the "
              "backward makes it); read edge_gradients() or the optimizer's shard");
  }
}

void GPT::set_layer_gradient_sink(LayerGradientSink* sink, bool windowed, int windows) {
  DUFU_CHECK(sink != nullptr || !windowed,
             "GPT::set_layer_gradient_sink: a window needs a sink to take each layer's gradient");
  DUFU_CHECK(windows == 1 || windows == 2, "GPT::set_layer_gradient_sink: ", windows, " windows; 1 or 2");
  // What the old sink holds goes back to it first.
  if (grads_.size() > 0) reclaim_gradient_windows();
  layer_gradient_sink_ = sink;
  windows = windowed ? std::min(windows, stage_.num_layers) : 1;
  if (windowed != gradients_windowed_ || windows != gradient_windows_) {
    // Dropped now and allocated by the next use: the old and the new are never held
    // at once (ZeRO-2 is for a gradient that does not fit whole).
    g_ = {};
    grads_ = DeviceBuffer<float>();
    gradients_windowed_ = windowed;
    gradient_windows_ = windows;
  } else if (grads_.size() > 0) {
    zero_grad();
  }
}

void GPT::ensure_gradients() {
  if (grads_.size() > 0) return;
  const auto [begin, size] = layers_extent();
  const std::size_t layers = size * static_cast<std::size_t>(stage_.num_layers);
  const std::size_t windows = static_cast<std::size_t>(gradient_windows_) * size;
  grads_ = DeviceBuffer<float>(*device_, gradients_windowed_ ? num_parameters_ - layers + windows : num_parameters_);
  g_ = gradient_views();
}

std::vector<GPT::EdgeGradient> GPT::edge_gradients() {
  ensure_gradients();
  const auto [begin, size] = layers_extent();
  const std::size_t end = begin + size * static_cast<std::size_t>(stage_.num_layers);
  std::vector<EdgeGradient> edges;
  if (begin > 0) edges.push_back({0, {grads_.data(), begin}});
  if (end < num_parameters_) {
    edges.push_back({end, {grads_.data() + gradient_position(end), num_parameters_ - end}});
  }
  return edges;
}

std::span<float> GPT::tensor_gradient(const ParamTensor& tensor) {
  ensure_gradients();
  if (tensor.name.starts_with("h.")) require_whole_gradients("GPT::tensor_gradient");
  return {grads_.data() + gradient_position(tensor.offset), tensor.size()};
}

void GPT::hand_off_layer_gradient(int local_layer) {
  const auto [offset, size] = layer_gradient_range(local_layer);
  const std::span<float> gradient(grads_.data() + gradient_position(offset), size);
  layer_gradient_sink_->take(local_layer, gradient);
  if (gradient_windows_ == 2) {
    taken_layer_[local_layer % 2] = local_layer;
    return;
  }
  layer_gradient_sink_->release(local_layer);
  device_->fill(gradient.data(), 0.0f, gradient.size());
}

void GPT::reclaim_gradient_window(int local_layer) {
  const int window = local_layer % gradient_windows_;
  if (gradient_windows_ != 2 || taken_layer_[window] < 0) return;
  const int taken = std::exchange(taken_layer_[window], -1);
  layer_gradient_sink_->release(taken);
  const auto [offset, size] = layer_gradient_range(taken);
  device_->fill(grads_.data() + gradient_position(offset), 0.0f, size);
}

void GPT::reclaim_gradient_windows() {
  for (int window = 0; window < 2; ++window) {
    if (taken_layer_[window] >= 0) reclaim_gradient_window(taken_layer_[window]);
  }
}

void GPT::progress_gradient_sink() const {
  if (taken_layer_[0] >= 0 || taken_layer_[1] >= 0) layer_gradient_sink_->progress();
}

}  // namespace dufu::trainer
