// Where a model keeps its flat parameters and their gradient, and the moments of a
// forward and backward at which that may matter. The model computes through views into
// parameter_memory() and gradient_memory() at the positions the storage gives, and says
// which layer it is about to read or has finished differentiating; what the storage does
// at those moments is its own affair. The model's default, WholeParameterStorage, keeps
// both whole in layout order and does nothing then; the data-parallel room's
// ParameterStore (parallel/parameter_store.h) spreads them over the data-parallel ranks
// (ZeRO-2 and 3) behind the same interface, so the model knows no ZeRO stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "dufu/trainer/device/device.h"

namespace dufu::trainer {

// What a storage needs to know of the model's flat layout (this rank's piece): its
// size, and where the pipeline stage's layers lie, side by side between the edge
// tensors (wte and wpe before them, ln_f and lm_head after), every layer the same size.
struct StorageShape {
  Device* device = nullptr;            // the model's: the gradients, and the parameters unless offloaded
  Device* parameter_device = nullptr;  // the parameters' now (the CPU device under optim.offload = cpu)
  std::size_t num_parameters = 0;
  std::size_t layers_begin = 0;  // the first layer's first flat offset
  std::size_t layer_size = 0;    // floats per layer
  int num_layers = 0;

  std::size_t layers_end() const { return layers_begin + layer_size * static_cast<std::size_t>(num_layers); }
  // {first flat offset, size} of local layer l.
  std::pair<std::size_t, std::size_t> layer_range(int local_layer) const;
};

// A storage's parameter values handed to the one that replaces it: its whole buffer
// when it kept them whole (no copy), else a host copy of the whole piece.
struct ParameterValues {
  DeviceBuffer<float> whole;
  Device* whole_device = nullptr;  // whole's
  std::vector<float> host;
};

class ParameterStorage {
 public:
  virtual ~ParameterStorage() = default;

  // ---- parameters ----
  // The memory the model's views point into (parameter_device()'s) and where flat
  // offset `offset` of the layout lives in it.
  virtual std::span<float> parameter_memory() = 0;
  virtual std::size_t parameter_position(std::size_t offset) const = 0;
  virtual Device& parameter_device() const = 0;
  // Whether parameter_memory() is the whole piece in layout order (params() needs it).
  virtual bool parameters_whole() const = 0;
  // Counts the changes of the values made outside the model's views (an optimizer's
  // update, an upload): a copy the model made of them is stale once this moved.
  virtual std::uint64_t parameter_version() const = 0;
  // The whole piece (num_parameters floats) to and from host memory; collective where
  // the storage spreads the values over ranks.
  virtual std::vector<float> download_parameters() const = 0;
  virtual void upload_parameters(std::span<const float> host) = 0;
  // For a replacement: the values moved out, this storage left without them
  // (collective where download_parameters is); and taken in, before any other use.
  virtual ParameterValues release_parameters() = 0;
  virtual void adopt_parameters(ParameterValues values) = 0;
  // optim.offload: the whole parameters moved to `target`'s memory.
  virtual void move_parameters(Device& target) = 0;

  // ---- the gradient ----
  // Allocated zeroed by allocate_gradient(), and dropped by the storage when it
  // changes its layout (has_gradient_memory() tells the model to remake its views).
  virtual bool has_gradient_memory() const = 0;
  virtual void allocate_gradient() = 0;
  virtual std::span<float> gradient_memory() = 0;
  virtual std::size_t gradient_position(std::size_t offset) const = 0;
  // Whether gradient_memory() holds every layer's gradient, accumulating over
  // micro-batches (grads() needs it).
  virtual bool gradient_whole() const = 0;
  virtual void zero_gradient() = 0;
  // Why a backward cannot run now (null: it can).
  virtual const char* backward_refusal() const { return nullptr; }

  // ---- the moments of a forward and backward ----
  // Before a forward or backward reads local layer l: its values in place. True when
  // they were written there since (a copy the model keeps of that range is stale).
  virtual bool acquire_layer(int /*local_layer*/) { return false; }
  // Layer l is read next: the storage may start bringing it (nothing outside the stage).
  virtual void expect_layer(int /*local_layer*/) {}
  // Before layer l's backward adds to its gradient; after it has, its gradient of this
  // micro-batch complete.
  virtual void begin_layer_gradient(int /*local_layer*/) {}
  virtual void end_layer_gradient(int /*local_layer*/) {}
  // Between kernels: work in flight may progress (MPI moves a non-blocking collective
  // only inside MPI calls).
  virtual void progress() const {}
};

// Both whole, in layout order: the parameters on parameter_device, the gradient on the
// model's device, accumulating over micro-batches.
class WholeParameterStorage final : public ParameterStorage {
 public:
  // The parameters allocated zeroed unless `allocate` is false (for adopt_parameters).
  explicit WholeParameterStorage(const StorageShape& shape, bool allocate = true);

  std::span<float> parameter_memory() override { return params_.span(); }
  std::size_t parameter_position(std::size_t offset) const override { return offset; }
  Device& parameter_device() const override { return *parameter_device_; }
  bool parameters_whole() const override { return true; }
  std::uint64_t parameter_version() const override { return version_; }
  std::vector<float> download_parameters() const override;
  void upload_parameters(std::span<const float> host) override;
  ParameterValues release_parameters() override;
  void adopt_parameters(ParameterValues values) override;
  void move_parameters(Device& target) override;

  bool has_gradient_memory() const override { return !grads_.empty(); }
  void allocate_gradient() override;
  std::span<float> gradient_memory() override { return grads_.span(); }
  std::size_t gradient_position(std::size_t offset) const override { return offset; }
  bool gradient_whole() const override { return true; }
  void zero_gradient() override;

 private:
  StorageShape shape_;
  Device* parameter_device_;
  DeviceBuffer<float> params_;
  DeviceBuffer<float> grads_;
  std::uint64_t version_ = 0;
};

// The whole piece into `values` taken as ParameterValues: its buffer when it is on
// `device` with `count` floats, else through the host.
DeviceBuffer<float> whole_parameters_on(Device& device, std::size_t count, ParameterValues values);

}  // namespace dufu::trainer
