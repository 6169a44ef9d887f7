// The optimizer step of data-parallel training: the gradients summed over the data-
// parallel ranks, their global norm clipped, then AdamW. Two ways:
//   replicated  every rank all-reduces the whole gradient and updates every parameter
//               with a full copy of the moments;
//   ZeRO-1      the gradient is reduce-scattered, each rank updates only its shard of
//               the parameters with only its shard's moments (1/dp of the optimizer
//               memory), and the updated parameters are all-gathered.
//   ZeRO-2      as ZeRO-1, and the gradient is not kept whole either: the backward
//               hands each layer's gradient over as soon as it is made (every micro-
//               batch), it is reduce-scattered into this rank's shard of the sum and
//               its memory reused by the next layer (the ParameterStore this object
//               installs in the model, parameter_store.h);
//               the edge tensors (wte, wpe, ln_f, lm_head) accumulate whole and are
//               reduced after the last micro-batch, as before.
//   ZeRO-3      as ZeRO-2, and the parameters are sharded too: the model keeps only
//               this rank's shard (the store's parameter shard), which AdamW updates in
//               place; each layer's are gathered just before the forward or backward
//               uses them, the edge tensors' after each update. Its sums are ZeRO-2's,
//               and so are its bits.
// All give every rank the same parameters after each step; with one rank all are
// plain AdamW. The sums are the communicator's rank-ordered, deterministic ones.
//
// With gradient accumulation ZeRO-2 sums differently: a layer's gradient is the sum
// over micro-batches of each micro-batch's sum over ranks, where stages 0 and 1 sum
// over ranks once, the micro-batches' sum on each rank. Floating-point addition is not
// associative, so the bits differ, and no order that frees the layer gradients can
// give stage 0's (rank r's whole local sum would have to wait for the last micro-batch).
// `reduce_each_micro_batch` makes stage 0 sum as ZeRO-2 does (the layers' gradients
// all-reduced each micro-batch and accumulated): ZeRO-2 equals that bit for bit, and
// equals plain stage 0 at one micro-batch per step.
//
// The reduction runs in buckets of train.dp_bucket_mb (PyTorch DDP's bucket_cap_mb):
// one collective per bucket of the flat gradient, cut without regard to tensor
// boundaries. Every element is still the rank-ordered fold of the same values, so the
// bucket size cannot change a bit; what it bounds is the collectives' scratch memory
// (the NCCL backend's all-to-all needs one bucket of it, not one gradient) and, with
// backward overlap later, how soon the first bucket can leave. Under ZeRO a bucket
// [low, high) of the flat gradient crosses one or a few ranks' shards, which follow
// each other in rank order: one uneven reduce-scatter (Communicator::reduce_scatter_v)
// lands each rank's piece of the sum in its shard, and after the update one uneven
// all-gather puts every piece back into every rank's parameters, in place.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/trainer/parallel/flat_shards.h"  // zero_shard_range, gradient_buckets
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/model/zero_stage.h"
#include "dufu/trainer/parallel/parameter_store.h"

namespace dufu::trainer {


// train.dp_bucket_mb's default, as PyTorch DDP's bucket_cap_mb.
inline constexpr double kDefaultBucketMegabytes = 25.0;
// Floats in `megabytes` MiB, at least one.
std::size_t bucket_elements_for(double megabytes);

class DataParallelOptimizer : private LayerGradientSink {
 public:
  // `data_group` (and `pipeline_group`, the model's pipeline stages, and
  // `tensor_group`, its tensor-parallel ranks, or nullptr for one) must outlive this
  // object. The gradient norm is the whole model's:
  // summed over tensor-parallel shards (GPT::full_sum_of_squares) and stages.
  // bucket_elements: floats of gradient per collective (>= 1; bucket_elements_for).
  // zero_stage: 0 to 3 (1 to 3 shard only with more than one data-parallel rank).
  // reduce_each_micro_batch: stage 0 only (stages 2 and 3 always do), see above.
  // overlap_reduction: stages 2 and 3 (ignored otherwise) start each layer's
  // reduce-scatter as the backward hands the layer over and finish it when the model
  // needs the layer's memory again (Communicator::start_reduce_scatter_v; the model
  // keeps two layer windows of gradient), so the reduction runs while the next layer's
  // backward does: the same collectives, the same sums and bits.
  // Under ZeRO-2 and 3 (and reduce_each_micro_batch) the model's storage is a
  // ParameterStore whose gradient sink is this object until it is destroyed. ZeRO-3
  // leaves the model sharded when destroyed (unsharding would be collective).
  DataParallelOptimizer(GPT& model, AdamWOptions options, Communicator& data_group, int zero_stage,
                        Communicator* pipeline_group = nullptr, Communicator* tensor_group = nullptr,
                        std::size_t bucket_elements = bucket_elements_for(kDefaultBucketMegabytes),
                        bool reduce_each_micro_batch = false, bool overlap_reduction = false);
  ~DataParallelOptimizer() override;
  DataParallelOptimizer(const DataParallelOptimizer&) = delete;
  DataParallelOptimizer& operator=(const DataParallelOptimizer&) = delete;

  // Sums model.grads() over the data-parallel ranks (under ZeRO-1 only this rank's
  // shard ends up summed), and clips the global gradient norm to max_norm (0 = no
  // clipping). Returns the norm before clipping; the same value on every rank.
  // The clipping factor is applied by step(), inside AdamW's pass, so the summed
  // gradients are left unscaled.
  double reduce_gradients_and_clip(double max_norm);
  // One AdamW update at rate lr from the reduced, clipped gradients; collective under
  // ZeRO-1.
  void step(float lr);

  // Takes the moments and step count of a full state (loaded from a checkpoint, for
  // this rank's piece of the model): all of them, or under ZeRO-1 this rank's shard.
  void load_full_state(const AdamW& full);
  // An empty full-sized optimizer to load a checkpoint into.
  AdamW make_full_state() const;

  bool sharded() const { return sharded_; }
  // This rank's optimizer: the whole piece's moments, or under ZeRO-1 its shard's
  // (AdamW::shard_begin()), for checkpoints that keep each rank's state as it is.
  const AdamW& local_state() const { return optimizer_; }
  AdamW& local_state() { return optimizer_; }

 private:
  // ZeRO-1: the squared norm of the whole model's gradient from the reduced shards.
  double sharded_sum_of_squares();
  void all_reduce_in_buckets(std::span<float> gradient);
  // The floats of the flat range [low, high) in each rank's shard (consecutive in rank
  // order): the counts of its reduce-scatter and all-gather.
  std::span<const std::size_t> shard_pieces(std::size_t low, std::size_t high);
  // After the update: every rank's updated shard into every rank's parameters.
  void all_gather_parameters_in_buckets();
  // Per micro-batch (ZeRO-2 or reduce_each_micro_batch): the sink's work for one
  // layer's gradient, the start of a step's sums, and the reduction of the flat range
  // [offset, offset + gradient.size()) into this rank's shard (ZeRO-2).
  void take(int local_layer, std::span<float> gradient) override;
  void release(int local_layer) override;
  void progress() override;
  // Overlapped: layer l's reduce-scatter started, one collective per bucket, into the
  // reduced window of l % 2; and finished: waited for, and added into the shard.
  void start_layer_reduction(int local_layer, std::span<const float> gradient);
  void finish_layer_reduction(int window);
  void start_accumulation();
  void reduce_scatter_into_shard(std::size_t offset, std::span<const float> gradient, bool accumulate);
  void reduce_edges_and_layers();

  GPT& model_;
  ParameterStore* store_ = nullptr;  // the model's storage, installed by this object (null: whole)
  AdamWOptions options_;
  Communicator& group_;
  Communicator* pipeline_group_;
  Communicator* tensor_group_;
  ZeroStage zero_;  // before sharded_, which is read from it
  bool sharded_;
  bool layers_each_micro_batch_;  // ZeRO-2, or stage 0's reduce_each_micro_batch, over > 1 rank
  bool accumulation_fresh_ = true;  // the next layer gradient starts a step's sums
  std::size_t shard_size_ = 0;  // elements per rank, the parameters padded to a multiple of dp
  // reduce_gradients_and_clip's factor for step(): one pass over the gradients fewer
  // than scaling them in place, and the same bits.
  float grad_scale_ = 1.0f;
  std::size_t bucket_elements_;
  AdamW optimizer_;             // full, or this rank's shard
  // ZeRO-1 and 2: this rank's summed gradient shard, on the model's device like the
  // gradients it is cut from; under offload, one bucket of parameters on the device.
  DeviceBuffer<float> grad_shard_;
  DeviceBuffer<float> staging_;
  std::vector<std::size_t> piece_counts_;  // shard_pieces' answer
  // Stage 0's reduce_each_micro_batch: the stage's layers' reduced gradients, summed
  // over the micro-batches. ZeRO-2: one bucket's piece of the shard, as reduced.
  DeviceBuffer<float> layer_sums_;
  DeviceBuffer<float> reduced_piece_;
  // overlap_reduction: per gradient window, the layer whose reduction is in flight
  // (-1: none), its buckets' collectives, and where each lands before it is added to
  // the shard (this rank's piece of the layer, at most a layer or a shard).
  bool overlap_ = false;
  struct PendingBucket {
    std::unique_ptr<PendingCollective> collective;
    float* reduced;
    float* destination;
    std::size_t count;
  };
  int pending_layer_[2] = {-1, -1};
  std::vector<PendingBucket> pending_[2];
  DeviceBuffer<float> reduced_windows_[2];
  // optim.offload = cpu: the reduced gradients, downloaded for the host's AdamW.
  std::vector<float> host_grads_;
};

}  // namespace dufu::trainer
