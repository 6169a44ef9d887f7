// What a training rank allocates for the sizes a user gives (model shape, micro-batch,
// sequence length, prefetch), estimated before anything is allocated, so that a model
// or batch that cannot fit is refused as "not enough memory for X (needs N)" instead
// of ending in std::bad_alloc or the kernel's OOM killer once the pages are touched.
// The estimates follow the buffers GPT, AdamW and the loader allocate (in double, so
// absurd sizes do not wrap around).
#pragma once

#include <string>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/memory_limit.h"  // memory_limit_bytes, which check_memory compares with
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"  // kDefaultBucketMegabytes

namespace dufu::trainer {

// This rank's parameters: its tensor-parallel share of the stage's layers and the
// embeddings and head the stage holds.
double rank_parameter_count(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage);
// The same in pieces: one layer's parameters, the stage's layer count, and the edge
// tensors (embeddings, final norm, head) it holds.
struct RankParameters {
  double layer, layers, edges;
};
RankParameters rank_parameters(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage);
// The gradient floats the model keeps: all of them, or under ZeRO-2 and 3 over more
// than one data-parallel rank the edges and one layer's window; with
// overlap_reduction two windows, and the two layers' pieces their reductions land in.
double rank_gradient_floats(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                            int data_parallel_size, int zero_stage, bool overlap_reduction = false);

// The parameter floats the model keeps whole beside its shard: under ZeRO-3 over more
// than one data-parallel rank the edges and two layer windows (ParameterStore),
// otherwise all of them.
double rank_weight_floats(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                          int data_parallel_size, int zero_stage);

// What a ZeRO-3 rank over more than one data-parallel rank holds beyond its shards of
// the weights, gradients and moments (each 1/dp of stage 0's), in bytes: what the model
// keeps whole (ParameterStore, parallel/parameter_store.h) and where a
// reduction lands. Under bf16 the weights' parts include their bf16 working copy.
struct HeldWhole {
  double edge_weights = 0.0;     // embeddings, final norm, head: gathered after each update
  double layer_weights = 0.0;    // the windows: the layer computing and the one gathered ahead
  double edge_gradients = 0.0;   // summed over the micro-batches, reduced once per step
  double layer_gradients = 0.0;  // one layer's window (two and their reduced pieces under the overlap)
  double reduced_piece = 0.0;    // where one bucket's reduce-scatter lands before it is added
  double total() const { return edge_weights + layer_weights + edge_gradients + layer_gradients + reduced_piece; }
};
HeldWhole zero3_held_whole(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                           int data_parallel_size, Precision precision, bool overlap_reduction, double bucket_floats);

// Bytes of weights, gradients and both AdamW moments for `parameters` under ZeRO
// stage `zero_stage` (0 to 3; see memory_plan).
double model_state_bytes(double parameters, int data_parallel_size, int zero_stage);

// Bytes of the activations and their gradients for `slots` micro-batches of B x T
// tokens in flight on this rank's stage (1 unless pipelined), plus the loader's
// `prefetch` batches of B x (T + 1) tokens. Under bf16 the activations a backward
// reads are kept in bf16; recomputation keeps less (gpt.h's Recompute).
double activation_bytes(const GPTConfig& config, int B, int T, int tensor_parallel_size, const PipelineStage& stage,
                        int slots, int prefetch, Precision precision, Recompute recompute = Recompute::kNone);

// What the kernels of one training step of this rank work on (for
// Device::scratch_bytes): its stage's matmuls for micro-batches of B x T tokens, the
// LayerNorms' rows and width, and its `parameters` (the gradient norm's length).
StepShapes training_step_shapes(const GPTConfig& config, int B, int T, int tensor_parallel_size,
                                const PipelineStage& stage, Precision precision, double parameters);

// What this rank will allocate, by kind, printed at start (one line per distinct piece
// of the model) so a user sees where the memory goes before the first step.
struct MemoryPlan {
  double weights = 0.0;       // fp32 parameters (the masters under bf16; under ZeRO-3 the shard and what is gathered)
  double gradients = 0.0;     // fp32 (under ZeRO-1 to 3 with the reduced shard)
  double moments = 0.0;       // AdamW m and v (this rank's shard under ZeRO-1 to 3)
  double working_copy = 0.0;  // the bf16 recipe's working copy of the weights
  double activations = 0.0;   // activations, their gradients, the loader's batches
  double scratch = 0.0;       // the device's own (Device::scratch_bytes), e.g. cuBLASLt's workspace
  double host = 0.0;          // in host memory instead (optim.offload = cpu: the masters and moments)
  double save_staging = 0.0;  // the host copy a checkpoint save holds beside all the above (checkpoint_save_bytes)
  bool device_is_host = false;  // the device's memory is the process's (the CPU device)
  // The device's part: host is not in it; on the CPU device the save's copy is.
  double model() const { return weights + gradients + moments + working_copy; }
  double total() const { return model() + activations + scratch + (device_is_host ? save_staging : 0.0); }
  // Host memory at the peak, a checkpoint save: on the CPU device everything, on another
  // the offloaded state and the save's copy.
  double host_total() const { return device_is_host ? total() + host : host + save_staging; }
  // "weights 498 MB, gradients 498 MB, AdamW moments 995 MB, activations 5.43 GB,
  // device scratch 856 MB: 8.28 GB of at most 25.0 GB" (the working copy, the CPU
  // device's checkpoint save and the scratch only when there are any).
  std::string describe(double limit_bytes) const;
};

// The host memory a checkpoint save of this rank holds at once, in bytes, while the
// training state stays allocated (the save is synchronous: no second copy is in flight):
// host_staging.h's copy of the weights (the first data-parallel replica writes them)
// and of both AdamW moments (this rank's shard under ZeRO-1 to 3); under ZeRO-3 also the
// piece gathered whole from the shards, which the copy is made from; and a serial GPT-2
// checkpoint's transposed Conv1D matrices (checkpoint_files.cc's write_model).
double checkpoint_save_bytes(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                             int data_parallel_size, int zero_stage);
// ZeRO stages 1 and 2 over more than one data-parallel rank divide the moments over the
// ranks and add the rank's reduced gradient shard to the gradients, and stage 2 the
// piece of one bucket (`bucket_floats`, train.dp_bucket_mb) each reduction lands in
// before it is added to the shard; gradient_floats is what the model keeps of its own
// gradient (rank_gradient_floats; negative: all `parameters`). Stage 3 also divides
// the fp32 weights, keeping weight_floats of them whole beside the shard
// (rank_weight_floats; negative: all), and the bf16 working copy is of those.
MemoryPlan memory_plan(double parameters, int data_parallel_size, int zero_stage, bool bf16_working_copy,
                       double activation_bytes, double gradient_floats = -1.0,
                       double bucket_floats = kDefaultBucketMegabytes * 1024 * 1024 / sizeof(float),
                       double weight_floats = -1.0);
// optim.offload = cpu: the fp32 masters and the moments move from the device's plan to
// host memory (GPTRecipe::optimizer_offload).
void offload_to_host(MemoryPlan& plan);

// The micro-batches whose activations a stage holds at once under the 1F1B schedule:
// the first of p stages p, the last 1 (and 1 without pipelining).
inline int pipeline_slots(const PipelineStage& stage) { return stage.num_stages - stage.stage; }

// This rank's plan for training micro-batches of B x T tokens: its parameters
// (rank_parameter_count), the activations of `slots` micro-batches and `prefetch`
// loader batches (activation_bytes), and the scratch `device` says such a step needs
// (Device::scratch_bytes of training_step_shapes): the plan asks the device, so a plan
// that fits leaves room for what the device allocates at the first backward.
MemoryPlan rank_memory_plan(const GPTConfig& config, int B, int T, int tensor_parallel_size, int data_parallel_size,
                            const PipelineStage& stage, int slots, int prefetch, Precision precision,
                            int zero_stage, const Device& device, Recompute recompute = Recompute::kNone,
                            double bucket_floats = kDefaultBucketMegabytes * 1024 * 1024 / sizeof(float),
                            bool overlap_reduction = false);

// Throws dufu::Error when `plan` needs more than `capacity_bytes` of `device` (its
// Device::describe()), naming the plan and the knobs that shrink it: train.micro_batch
// and model.seq_length (activations), dist.zero_stage (the AdamW moments), and
// dist.tensor_parallel_size / dist.pipeline_parallel_size (this rank's share of the
// model).
void check_plan_fits_device(const MemoryPlan& plan, double capacity_bytes, const std::string& device);

// Throws dufu::Error "not enough memory for <what> (needs N, this machine has M...)"
// when `bytes` is above memory_limit_bytes().
void check_memory(const std::string& what, double bytes);

// The message of a std::bad_alloc caught while allocating `what` of about `bytes`.
[[noreturn]] void fail_out_of_memory(const std::string& what, double bytes);

}  // namespace dufu::trainer
