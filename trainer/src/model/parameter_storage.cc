#include "dufu/trainer/model/parameter_storage.h"

#include <utility>

#include "dufu/common/error.h"

namespace dufu::trainer {

std::pair<std::size_t, std::size_t> StorageShape::layer_range(int local_layer) const {
  DUFU_CHECK(local_layer >= 0 && local_layer < num_layers, "no local layer ", local_layer, " of ", num_layers);
  return {layers_begin + static_cast<std::size_t>(local_layer) * layer_size, layer_size};
}

DeviceBuffer<float> whole_parameters_on(Device& device, std::size_t count, ParameterValues values) {
  if (values.whole.size() == count && values.whole_device == &device) return std::move(values.whole);
  if (!values.whole.empty()) {
    values.host = values.whole.to_host();
    values.whole.reset();  // freed before the new buffer takes its place
  }
  DUFU_CHECK(values.host.size() == count, "parameter storage: ", values.host.size(), " values for ", count,
             " parameters");
  DeviceBuffer<float> whole(device, count);
  whole.upload(values.host);
  return whole;
}

WholeParameterStorage::WholeParameterStorage(const StorageShape& shape, bool allocate)
    : shape_(shape), parameter_device_(shape.parameter_device) {
  DUFU_CHECK(shape.device != nullptr && shape.parameter_device != nullptr, "WholeParameterStorage: no device");
  if (allocate) params_ = DeviceBuffer<float>(*parameter_device_, shape.num_parameters);
}

std::vector<float> WholeParameterStorage::download_parameters() const { return params_.to_host(); }

void WholeParameterStorage::upload_parameters(std::span<const float> host) {
  if (host.size() != shape_.num_parameters) {
    DUFU_FAIL("GPT::upload_parameters: ", host.size(), " floats for a piece of ", shape_.num_parameters,
              " parameters");
  }
  params_.upload(host);
  ++version_;
}

ParameterValues WholeParameterStorage::release_parameters() {
  ParameterValues values;
  values.whole = std::move(params_);
  values.whole_device = parameter_device_;
  return values;
}

void WholeParameterStorage::adopt_parameters(ParameterValues values) {
  params_ = whole_parameters_on(*parameter_device_, shape_.num_parameters, std::move(values));
  ++version_;
}

void WholeParameterStorage::move_parameters(Device& target) {
  if (&target == parameter_device_) return;
  DeviceBuffer<float> moved(target, params_.size());
  moved.upload(params_.to_host());
  params_ = std::move(moved);
  parameter_device_ = &target;
  ++version_;
}

void WholeParameterStorage::allocate_gradient() {
  if (grads_.empty()) grads_ = DeviceBuffer<float>(*shape_.device, shape_.num_parameters);
}

void WholeParameterStorage::zero_gradient() {
  allocate_gradient();
  shape_.device->fill(grads_.data(), 0.0f, grads_.size());
}

}  // namespace dufu::trainer
