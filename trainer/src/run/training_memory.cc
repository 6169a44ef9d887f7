// Memory estimates of a training rank (see training_memory.h). The activation count
// mirrors GPT::ensure_activations, ensure_working_layer and ensure_activation_grads
// (gpt.cc, gpt_precision.cc) buffer by buffer (bf16_test checks it against what a
// model allocates); it need not be exact to the byte, only to tell what cannot fit.
#include "dufu/trainer/run/training_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>

#include "dufu/common/error.h"
#include "dufu/common/human_units.h"
#include "dufu/trainer/model/zero_stage.h"

namespace dufu::trainer {

namespace {

int stage_layers(const GPTConfig& config, const PipelineStage& stage) {
  return stage.num_layers < 0 ? config.n_layer : stage.num_layers;
}

// A layer's widths on one tensor-parallel rank (GPT::local_widths): the fused q, k, v
// output, the attention output, the MLP's first projection's output and its hidden
// values.
struct RankWidths {
  double qkv, attn, mlp_pre, mlp_hidden;
};
RankWidths rank_widths(const GPTConfig& config, int tensor_parallel_size) {
  const double tp = tensor_parallel_size;
  const double hs = config.head_size();
  const double hidden = config.mlp_hidden() / tp;
  return {.qkv = (config.n_head + 2.0 * config.kv_heads()) * hs / tp,
          .attn = config.n_head * hs / tp,
          .mlp_pre = config.is_llama() ? 2.0 * hidden : hidden,
          .mlp_hidden = hidden};
}

}  // namespace

double rank_parameter_count(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage) {
  const RankParameters counts = rank_parameters(config, tensor_parallel_size, stage);
  return counts.layers * counts.layer + counts.edges;
}

double rank_gradient_floats(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                            int data_parallel_size, int zero_stage, bool overlap_reduction) {
  const RankParameters counts = rank_parameters(config, tensor_parallel_size, stage);
  // ZeRO-2 keeps one layer's window and the edges (ParameterStore, parallel/parameter_store.h); the
  // overlap a second window, and two layers' reduced pieces (DataParallelOptimizer).
  if (ZeroStage(zero_stage, data_parallel_size).shards_gradients()) {
    if (!overlap_reduction || counts.layers < 2) return counts.layer + counts.edges;
    const double shard = std::ceil((counts.layers * counts.layer + counts.edges) / data_parallel_size);
    return 2.0 * counts.layer + counts.edges + 2.0 * std::min(counts.layer, shard);
  }
  return counts.layers * counts.layer + counts.edges;
}

double rank_weight_floats(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                          int data_parallel_size, int zero_stage) {
  const RankParameters counts = rank_parameters(config, tensor_parallel_size, stage);
  if (ZeroStage(zero_stage, data_parallel_size).shards_parameters()) {
    return std::min(counts.layers, 2.0) * counts.layer + counts.edges;
  }
  return counts.layers * counts.layer + counts.edges;
}

HeldWhole zero3_held_whole(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                           int data_parallel_size, Precision precision, bool overlap_reduction, double bucket_floats) {
  DUFU_CHECK(data_parallel_size > 1, "zero3_held_whole: ZeRO-3 over ", data_parallel_size,
             " data-parallel rank shards nothing");
  const RankParameters counts = rank_parameters(config, tensor_parallel_size, stage);
  const double shard = std::ceil((counts.layers * counts.layer + counts.edges) / data_parallel_size);
  // fp32 values, and under bf16 the working copy's bits of each (memory_plan).
  const double weight_bytes = precision == Precision::kBf16 ? 6.0 : 4.0;
  const double gradient_floats =
      rank_gradient_floats(config, tensor_parallel_size, stage, data_parallel_size, 3, overlap_reduction);
  const double weight_floats = rank_weight_floats(config, tensor_parallel_size, stage, data_parallel_size, 3);
  return {.edge_weights = weight_bytes * counts.edges,
          .layer_weights = weight_bytes * (weight_floats - counts.edges),
          .edge_gradients = 4.0 * counts.edges,
          .layer_gradients = 4.0 * (gradient_floats - counts.edges),
          .reduced_piece = 4.0 * std::min(bucket_floats, shard)};
}

RankParameters rank_parameters(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage) {
  const double C = config.d_model;
  const double tp = tensor_parallel_size;
  const double vocab = static_cast<double>(config.vocab_size) + config.vocab_multiple * tp;  // padded, at most
  const RankWidths widths = rank_widths(config, tensor_parallel_size);
  // A block: the QKV, attention-out, MLP weights and the split biases divided over the
  // tensor group; the norms and the row-parallel biases whole. GPT-2's MLP has two
  // matrices of 4C, Llama's three of F (its mlp_pre is gate and up).
  const double matrices = C * (widths.qkv + widths.attn + widths.mlp_pre + widths.mlp_hidden);
  const double layer = config.is_llama() ? matrices + 2.0 * C : matrices + (7.0 * C) / tp + 6.0 * C;
  double edges = 0.0;
  const double table = vocab * C / tp;  // wte's (or lm_head's) rows on this rank
  if (stage.is_first()) edges += table + (config.is_llama() ? 0.0 : static_cast<double>(config.seq_length) * C);
  if (stage.is_last()) {
    edges += (config.is_llama() ? 1.0 : 2.0) * C;
    if (!config.tie_embeddings || !stage.is_first()) edges += table;  // lm_head, or the tied head's copy of wte
  }
  return {.layer = layer, .layers = static_cast<double>(stage_layers(config, stage)), .edges = edges};
}

double checkpoint_save_bytes(const GPTConfig& config, int tensor_parallel_size, const PipelineStage& stage,
                             int data_parallel_size, int zero_stage) {
  const RankParameters counts = rank_parameters(config, tensor_parallel_size, stage);
  const double parameters = counts.layers * counts.layer + counts.edges;
  const ZeroStage zero(zero_stage, data_parallel_size);
  const double moments = zero.shards_optimizer_state() ? std::ceil(parameters / data_parallel_size) : parameters;
  double floats = parameters + 2.0 * moments;
  if (zero.shards_parameters()) floats += parameters;
  if (tensor_parallel_size == 1 && stage.num_stages == 1 && !config.is_llama()) {
    const RankWidths widths = rank_widths(config, 1);
    floats += counts.layers * config.d_model * (widths.qkv + widths.attn + widths.mlp_pre + widths.mlp_hidden);
  }
  return sizeof(float) * floats;
}

double model_state_bytes(double parameters, int data_parallel_size, int zero_stage) {
  return memory_plan(parameters, data_parallel_size, zero_stage, false, 0.0).model();
}

MemoryPlan memory_plan(double parameters, int data_parallel_size, int zero_stage, bool bf16_working_copy,
                       double activation_bytes, double gradient_floats, double bucket_floats, double weight_floats) {
  constexpr double kFloat = sizeof(float);
  const ZeroStage zero(zero_stage, data_parallel_size);
  const bool sharded = zero.shards_optimizer_state();
  const double shard = std::ceil(parameters / data_parallel_size);
  // ZeRO-3: the shard of masters and what the model holds whole (ParameterStore).
  const double whole_weights = zero.shards_parameters() && weight_floats >= 0.0 ? weight_floats : parameters;
  MemoryPlan plan;
  plan.weights = kFloat * (zero.shards_parameters() ? shard + whole_weights : parameters);
  plan.gradients = kFloat * (gradient_floats >= 0.0 ? gradient_floats : parameters);
  // ZeRO-1 to 3 add the rank's reduced gradient shard (DataParallelOptimizer).
  if (sharded) plan.gradients += kFloat * shard;
  if (zero.shards_gradients()) plan.gradients += kFloat * std::min(bucket_floats, shard);
  plan.moments = kFloat * 2.0 * parameters / (sharded ? data_parallel_size : 1);
  // bf16 bits of every parameter held whole (its biases and LayerNorm parameters also
  // as floats, a fraction of a percent of a GPT, left out).
  plan.working_copy = bf16_working_copy ? 2.0 * whole_weights : 0.0;
  plan.activations = activation_bytes;
  return plan;
}

void offload_to_host(MemoryPlan& plan) {
  plan.host += plan.weights + plan.moments;
  plan.weights = 0.0;
  plan.moments = 0.0;
}

std::string MemoryPlan::describe(double limit_bytes) const {
  std::string text = str_cat("weights ", human_bytes(weights), ", gradients ", human_bytes(gradients),
                             ", AdamW moments ", human_bytes(moments));
  if (working_copy > 0.0) text += str_cat(", bf16 working copy ", human_bytes(working_copy));
  text += str_cat(", activations ", human_bytes(activations));
  if (device_is_host && save_staging > 0.0) text += str_cat(", checkpoint save's copy ", human_bytes(save_staging));
  if (scratch > 0.0) text += str_cat(", device scratch ", human_bytes(scratch));
  text = str_cat(text, ": ", human_bytes(total()), " of at most ", human_bytes(limit_bytes));
  if (host > 0.0) text += str_cat(" (and ", human_bytes(host), " of masters and moments in host memory)");
  if (!device_is_host && save_staging > 0.0) {
    text += str_cat(" (and a checkpoint save's copy of ", human_bytes(save_staging), " in host memory)");
  }
  return text;
}

StepShapes training_step_shapes(const GPTConfig& config, int B, int T, int tensor_parallel_size,
                                const PipelineStage& stage, Precision precision, double parameters) {
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const std::int64_t C = config.d_model;
  const RankWidths widths = rank_widths(config, tensor_parallel_size);
  const auto width = [](double value) { return static_cast<std::int64_t>(value); };
  StepShapes shapes{.rows = N,
                    .width = C,
                    .parameters = static_cast<std::int64_t>(parameters),
                    .bf16_operands = precision == Precision::kBf16};
  if (stage_layers(config, stage) > 0) {
    // A block's column-parallel QKV and MLP-up, and row-parallel attention-out and MLP-down.
    shapes.matmuls = {{N, C, width(widths.qkv), true},
                      {N, width(widths.attn), C, true},
                      {N, C, width(widths.mlp_pre), true},
                      {N, width(widths.mlp_hidden), C, true}};
    shapes.attention_row_heads = N * (config.n_head / tensor_parallel_size);
  }
  if (stage.is_last()) {
    const std::int64_t vocab = config.padded_vocab_size(tensor_parallel_size) / tensor_parallel_size;
    shapes.matmuls.push_back({N, C, vocab, false});  // the LM head, this rank's vocabulary slice
  }
  return shapes;
}

MemoryPlan rank_memory_plan(const GPTConfig& config, int B, int T, int tensor_parallel_size, int data_parallel_size,
                            const PipelineStage& stage, int slots, int prefetch, Precision precision,
                            int zero_stage, const Device& device, Recompute recompute, double bucket_floats,
                            bool overlap_reduction) {
  const double parameters = rank_parameter_count(config, tensor_parallel_size, stage);
  MemoryPlan plan =
      memory_plan(parameters, data_parallel_size, zero_stage, precision == Precision::kBf16,
                  activation_bytes(config, B, T, tensor_parallel_size, stage, slots, prefetch, precision, recompute),
                  rank_gradient_floats(config, tensor_parallel_size, stage, data_parallel_size, zero_stage,
                                       overlap_reduction),
                  bucket_floats,
                  rank_weight_floats(config, tensor_parallel_size, stage, data_parallel_size, zero_stage));
  plan.scratch = device.scratch_bytes(training_step_shapes(config, B, T, tensor_parallel_size, stage, precision,
                                                           parameters));
  plan.save_staging = checkpoint_save_bytes(config, tensor_parallel_size, stage, data_parallel_size, zero_stage);
  plan.device_is_host = device.memory_space() == MemorySpace::kHost;
  return plan;
}

double activation_bytes(const GPTConfig& config, int B, int T, int tensor_parallel_size, const PipelineStage& stage,
                        int slots, int prefetch, Precision precision, Recompute recompute) {
  const double N = static_cast<double>(B) * T;
  const double C = config.d_model;
  const RankWidths widths = rank_widths(config, tensor_parallel_size);
  // Attention keeps one log-sum-exp per row and head (flash-style: no T x T matrix).
  const double lse = N * config.n_head / tensor_parallel_size;
  const double vocab = (static_cast<double>(config.vocab_size) + config.vocab_multiple) / tensor_parallel_size;
  const double layers = stage_layers(config, stage);
  // In floats. One slot: the input and output, per layer the LayerNorm statistics and
  // attention's lse (fp32 under both precisions) and the tensors a backward reads
  // (ln_1, ln_2, the residuals, QKV, the attention output, the MLP's two: GPT-2's
  // 4 C + 12 Cl,
  // less the last layer's output already counted), in bf16 under bf16, which then
  // computes in one fp32 working layer shared by the slots; the last stage's ln_f
  // and logits (under bf16 with the bits of their gradient); the branch scratch
  // buffer; the tokens and targets.
  // Recomputation keeps less of each layer: selective all but the MLP's two hidden
  // tensors, full only the layer's output (the next one's
  // input) and its LayerNorm statistics. What it drops is computed, in the forward
  // and again in the backward, in one working layer: under fp32 just those tensors;
  // under bf16 the whole fp32 working layer (which bf16 has anyway) and bf16 copies
  // of those tensors, one layer's.
  const bool bf16 = precision == Precision::kBf16;
  const double mlp = N * (widths.mlp_pre + widths.mlp_hidden);
  const double layer_tensors = 3.0 * N * C + N * (widths.qkv + widths.attn) + mlp;  // all but the two residuals
  const double dropped = recompute == Recompute::kFull        ? layer_tensors
                         : recompute == Recompute::kSelective ? mlp
                                                              : 0.0;
  const double kept = layers * (N * C + layer_tensors - dropped) - N * C;
  // RMSNorm keeps rstd, LayerNorm mean and rstd.
  const double norm_stats = (config.is_llama() ? 1.0 : 2.0) * N;
  double slot = 2.0 * N * C + layers * (2.0 * norm_stats + lse) + (bf16 ? 0.5 : 1.0) * kept;
  // ln_f (and its bf16 copy), the logits (and their gradient's bits)
  if (stage.is_last()) slot += (bf16 ? 1.5 : 1.0) * (N * C + N * vocab) + norm_stats + N;
  slot += N * C + 2.0 * N;
  const double working_layer = bf16 ? 2.0 * N * C + layer_tensors + 0.5 * dropped : dropped;
  // The gradients of the activations, one set for every slot: the residual stream's
  // and a LayerNorm output's, atty, qkv and fc_pre (GPT-2's fc_gelu's is never stored:
  // matmul_gelu_backward goes through the GELU; Llama's SwiGLU output's is); under
  // bf16 also the bits of those a backward GEMM reads: the residual stream's, qkv's
  // and fc_pre's.
  const double grads = 2.0 * N * C + N * (widths.attn + widths.qkv + widths.mlp_pre) +
                       (config.is_llama() ? N * widths.mlp_hidden : 0.0) +
                       (bf16 ? 0.5 * N * (C + widths.qkv + widths.mlp_pre) : 0.0);
  const double loader = static_cast<double>(prefetch) * B * (T + 1.0);
  return 4.0 * (slots * slot + working_layer + grads + loader);
}

void check_memory(const std::string& what, double bytes) {
  const double limit = memory_limit_bytes();
  if (bytes > limit) {
    DUFU_FAIL("not enough memory for ", what, " (needs ", human_bytes(bytes), ", this process can have at most ",
              human_bytes(limit), " of memory and swap)");
  }
}

void check_plan_fits_device(const MemoryPlan& plan, double capacity_bytes, const std::string& device) {
  if (plan.total() <= capacity_bytes) return;
  DUFU_FAIL("the memory plan of this rank does not fit ", device, ": ", plan.describe(capacity_bytes),
            "; HINT: lower train.micro_batch or model.seq_length (activations), set dist.zero_stage=1 (shards the "
            "AdamW moments), 2 (and the gradients) or 3 (and the weights), or raise dist.tensor_parallel_size or "
            "dist.pipeline_parallel_size (each rank's share of the model)");
}

void fail_out_of_memory(const std::string& what, double bytes) {
  DUFU_FAIL("not enough memory for ", what, " (needs about ", human_bytes(bytes), "; allocating it failed)");
}

}  // namespace dufu::trainer
