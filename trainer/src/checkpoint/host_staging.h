// Moving a rank's training state between device memory and the host code that reads
// or writes it as host memory (checkpoint files, generation, export). On the CPU
// device the copies are memcpy; on a GPU they are the only way the host may touch the
// parameters, gradients, AdamW moments or logits (device.h). A save downloads this
// rank's own piece into ONE host buffer (not one per tensor), so the checkpoint files
// are written from host memory and keep their bytes whatever device trained.
// Internal to the trainer library.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"

namespace dufu::trainer::host_staging {

// This rank's parameters and (given an optimizer) its AdamW moments, downloaded into
// one host buffer: params, then m, then v.
class StagedState {
 public:
  // with_params false leaves the parameters out (a rank that writes only moments).
  // Collective over the data-parallel group while the model's parameters are sharded
  // (ZeRO-3): every rank of it must construct one.
  StagedState(const GPT& model, const AdamW* optimizer, bool with_params = true);
  std::span<const float> params() const { return std::span<const float>(buffer_).first(params_count_); }
  std::span<const float> m() const { return std::span<const float>(buffer_).subspan(params_count_, moments_count_); }
  std::span<const float> v() const {
    return std::span<const float>(buffer_).subspan(params_count_ + moments_count_, moments_count_);
  }

 private:
  std::vector<float> buffer_;
  std::size_t params_count_ = 0;
  std::size_t moments_count_ = 0;
};

// host -> device_destination, both of the same length (device memory of `device`).
void upload(Device& device, std::span<float> device_destination, std::span<const float> host);

}  // namespace dufu::trainer::host_staging
