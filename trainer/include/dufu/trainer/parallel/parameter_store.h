// The data-parallel room's parameter store: the model's flat parameters and gradient
// as ZeRO-2 and 3 keep them (Rajbhandari et al. 2020), behind the model's storage
// interface (model/parameter_storage.h), as Megatron-core's DistributedDataParallel
// owns a ParamAndGradBuffer beside a model that knows nothing of it. The
// DataParallelOptimizer makes one and installs it in the model
// (GPT::replace_parameter_storage).
//
// The gradient: every backward hands local layer l's gradient of its micro-batch to a
// LayerGradientSink (the optimizer) once it is complete, take(l, gradient), and later
// release(l), after which the store zeroes that memory: the layers' gradients do not
// accumulate over micro-batches here, the sink accumulates what it makes of them
// (ZeRO-2: this rank's shard of their sum over the data-parallel ranks). Windowed, the
// layers' gradients are not kept whole either: the layers share `gradient_windows`
// layers' worth of memory (layer l in window l % windows) and only the edge tensors
// (wte, wpe, ln_f, lm_head) keep whole gradients, which accumulate as before
// (edge_gradients()). With one window (or none) release follows take at once; with
// two, a layer is released only when its window is needed again (the backward of
// layer l - 2, or zeroing), so the sink can reduce it while the next layer's backward
// runs, and between that backward's kernels the store calls progress().
//
// The parameters, with a parameter group (ZeRO-3): this rank keeps only its shard of
// the flat parameters, zero_shard_range(num_parameters, size, rank) (flat_shards.h),
// the fp32 masters its optimizer updates. The layers' parameters are gathered from
// every rank's shard (Communicator::all_gather_v, in buckets of bucket_elements floats)
// into one of two layer windows just before a forward or backward uses them (the next
// layer's while the current one runs: the forward's fused residual add needs the next
// LayerNorm), and the edge tensors are kept whole, gathered after each update. The
// gathered values are the masters' bits, so the arithmetic is unchanged. Every forward
// and backward is then collective over the group. The group must outlive the store.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/trainer/model/parameter_storage.h"

namespace dufu::trainer {

class LayerGradientSink {
 public:
  virtual ~LayerGradientSink() = default;
  // The store leaves `gradient` alone until release(local_layer).
  virtual void take(int local_layer, std::span<float> gradient) = 0;
  // The sink is done reading that layer's gradient when this returns.
  virtual void release(int local_layer) = 0;
  virtual void progress() {}
};

struct ParameterStoreOptions {
  LayerGradientSink* sink = nullptr;  // takes each layer's gradient; must outlive its use (detach_sink)
  bool gradient_windowed = false;     // the layers' gradients not kept whole (ZeRO-2 and 3)
  int gradient_windows = 1;           // 1 or 2 (two: the reduction overlaps the next layer's backward)
  Communicator* parameter_group = nullptr;  // ZeRO-3: the ranks the parameters are sharded over (null: whole)
  std::size_t bucket_elements = 1;          // floats per gather
};

class ParameterStore final : public ParameterStorage {
 public:
  // Refused (dufu::Error) for a parameter group whose collectives do not move the
  // model's device memory, or with offloaded parameters.
  ParameterStore(const StorageShape& shape, const ParameterStoreOptions& options);
  ~ParameterStore() override;
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // ---- ParameterStorage ----
  std::span<float> parameter_memory() override { return params_.span(); }
  std::size_t parameter_position(std::size_t offset) const override;
  Device& parameter_device() const override { return *parameter_device_; }
  bool parameters_whole() const override { return !parameters_sharded(); }
  std::uint64_t parameter_version() const override { return version_; }
  std::vector<float> download_parameters() const override;
  void upload_parameters(std::span<const float> host) override;
  ParameterValues release_parameters() override;
  void adopt_parameters(ParameterValues values) override;
  void move_parameters(Device& target) override;

  bool has_gradient_memory() const override { return !grads_.empty(); }
  void allocate_gradient() override;
  std::span<float> gradient_memory() override { return grads_.span(); }
  std::size_t gradient_position(std::size_t offset) const override;
  bool gradient_whole() const override { return !gradient_windowed_; }
  void zero_gradient() override;
  const char* backward_refusal() const override;

  bool acquire_layer(int local_layer) override;
  void expect_layer(int local_layer) override;
  void begin_layer_gradient(int local_layer) override;
  void end_layer_gradient(int local_layer) override;
  void progress() const override;

  // ---- for the optimizer ----
  // The sink's windows back, then no sink: the gradient whole again, dropped if it was
  // windowed (the next use allocates it zeroed). The parameters stay as they are
  // (unsharding would be collective). A backward under a windowed store without a
  // sink refuses to run.
  void detach_sink();
  // The edge tensors' gradients, each run with its offset in the flat layout.
  struct EdgeGradient {
    std::size_t offset;
    std::span<float> gradient;
  };
  std::vector<EdgeGradient> edge_gradients();
  // ZeRO-3: this rank's shard, its first flat offset and its masters (device memory),
  // which an optimizer may update; parameter_shard_updated() (collective) then
  // refreshes the edges and drops the gathered layers, to be gathered again at their
  // next use.
  bool parameters_sharded() const { return parameter_group_ != nullptr; }
  std::size_t parameter_shard_begin() const { return parameter_shard_begin_; }
  std::span<float> parameter_shard();
  void parameter_shard_updated();

 private:
  int parameter_windows() const;
  // Both parameter windows emptied, the gathers in flight into them landed first.
  void drop_parameter_windows();
  void gather_parameters(std::size_t offset, std::size_t count, float* destination) const;
  // The same, started: one collective per bucket, appended to `pending`.
  void start_gathering_parameters(std::size_t offset, std::size_t count, float* destination,
                                  std::vector<std::unique_ptr<PendingCollective>>& pending) const;
  // Before layer l's backward under two windows: its window back from the sink, zeroed.
  void reclaim_gradient_window(int local_layer);
  // Every window the sink holds, back and zeroed.
  void reclaim_gradient_windows();

  StorageShape shape_;
  Device* parameter_device_;
  std::uint64_t version_ = 0;
  // The parameters: whole, or (sharded) the edges before, two layer windows and the
  // edges after; local layer l lives in window l % 2, so the layer being computed and
  // the next one (forward) or the previous one (backward) are held at once.
  DeviceBuffer<float> params_;
  Communicator* parameter_group_;
  std::size_t parameter_bucket_elements_;
  std::size_t parameter_shard_begin_ = 0;
  std::size_t parameter_shard_size_ = 0;
  DeviceBuffer<float> parameter_shard_;
  int window_layer_[2] = {-1, -1};  // the local layer each parameter window holds (-1: none)
  // The gathers still in flight into each window (expect_layer).
  std::vector<std::unique_ptr<PendingCollective>> pending_gathers_[2];
  mutable std::vector<std::size_t> gather_counts_;

  // The gradient: whole, or (windowed) the edges before, gradient_windows_ layers and
  // the edges after.
  DeviceBuffer<float> grads_;
  LayerGradientSink* sink_;
  bool gradient_windowed_;
  int gradient_windows_;
  // With two windows: the layer each window holds that the sink took and has not
  // released (-1: none).
  int taken_layer_[2] = {-1, -1};
};

}  // namespace dufu::trainer
