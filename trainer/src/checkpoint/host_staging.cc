// Host staging of a rank's training state (see host_staging.h).
#include "host_staging.h"

#include <algorithm>
#include <vector>

#include "dufu/common/error.h"

namespace dufu::trainer::host_staging {

namespace {

void download_into(Device& device, std::span<float> host, std::span<const float> device_source) {
  DUFU_CHECK(host.size() == device_source.size(), "host staging: ", device_source.size(), " floats into ", host.size());
  if (!host.empty()) device.download(host.data(), device_source.data(), host.size_bytes());
}

}  // namespace

StagedState::StagedState(const GPT& model, const AdamW* optimizer, bool with_params)
    : params_count_(with_params ? model.num_parameters() : 0),
      moments_count_(optimizer != nullptr ? optimizer->num_parameters() : 0) {
  DUFU_CHECK(optimizer == nullptr || &optimizer->device() == &model.parameter_device(),
             "host staging: the optimizer's moments and the model's parameters are on different devices");
  buffer_.resize(params_count_ + 2 * moments_count_);
  const std::span<float> all(buffer_);
  Device& device = model.parameter_device();
  if (!model.parameters_whole()) {
    // ZeRO-3: the piece is gathered from the data-parallel ranks' shards, collective,
    // so every rank of the group gathers, whether it keeps the result or not.
    const std::vector<float> gathered = model.download_parameters();
    if (with_params) std::copy(gathered.begin(), gathered.end(), buffer_.begin());
  } else if (with_params) {
    download_into(device, all.first(params_count_), model.params());
  }
  if (optimizer != nullptr) {
    download_into(device, all.subspan(params_count_, moments_count_), optimizer->m());
    download_into(device, all.subspan(params_count_ + moments_count_, moments_count_), optimizer->v());
  }
}

void upload(Device& device, std::span<float> device_destination, std::span<const float> host) {
  DUFU_CHECK(host.size() == device_destination.size(), "host staging: ", host.size(), " floats into ",
             device_destination.size(), " of device memory");
  if (!host.empty()) device.upload(device_destination.data(), host.data(), host.size_bytes());
}

}  // namespace dufu::trainer::host_staging
