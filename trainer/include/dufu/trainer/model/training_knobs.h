// The knob table of a training run: every knob's name, type, default, accepted values
// and help, written once. The schema (training_config_schema), `train --help`, the
// generated docs/config-reference.md and the structs' defaults (GPTConfig,
// AdamWOptions, TrainingOptions, LrSchedule) all come from it, so none can drift from
// another. It sits in model/, the lowest layer holding a struct that takes its
// defaults from it; it is data only and includes nothing of the trainer.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include "dufu/common/config.h"

namespace dufu::trainer {

namespace knob_words {
inline constexpr std::string_view kArchitectures[] = {"gpt2", "llama"};
inline constexpr std::string_view kTieEmbeddings[] = {"auto", "true", "false"};
inline constexpr std::string_view kImpls[] = {"mmap", "lazy", "cached"};
inline constexpr std::string_view kDataOrders[] = {"megatron", "stable"};
inline constexpr std::string_view kDevices[] = {"cpu", "cuda"};
inline constexpr std::string_view kNonFiniteActions[] = {"stop", "skip"};
inline constexpr std::string_view kPrecisions[] = {"fp32", "bf16"};
inline constexpr std::string_view kRecomputes[] = {"none", "selective", "full"};
inline constexpr std::string_view kOffloads[] = {"none", "cpu"};
inline constexpr std::string_view kSchedules[] = {"cosine", "wsd"};
inline constexpr std::string_view kWsdDecayShapes[] = {"linear", "1-sqrt"};
}  // namespace knob_words

namespace knob_limits {
// The widths the knobs are narrowed to: a bound that is only a type's limit.
inline constexpr std::int64_t kInt = std::numeric_limits<std::int32_t>::max();
inline constexpr std::int64_t kUint32 = std::numeric_limits<std::uint32_t>::max();
inline constexpr std::int64_t kInt64 = std::numeric_limits<std::int64_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();
// A data-parallel bucket holds at least one float and at most 1 TiB (beyond that a
// bucket is just the whole gradient).
inline constexpr double kBucketMinMb = 4.0 / (1024.0 * 1024.0);
inline constexpr double kBucketMaxMb = 1024.0 * 1024.0;
}  // namespace knob_limits

// In the order `train --help`, the reference and the saved config.toml list them.
inline constexpr KnobSpec kTrainingKnobs[] = {
    string_knob("model.arch", "gpt2",
                "gpt2 (LayerNorm, learned positions, GELU MLP, biases, tied head) or llama (RMSNorm, rotary "
                "positions, SwiGLU MLP, grouped-query attention, no biases)",
                knob_words::kArchitectures),
    int_knob("model.n_layer", 4, 1, knob_limits::kInt, "Transformer blocks"),
    int_knob("model.n_head", 4, 1, knob_limits::kInt, "Attention heads per block (must divide model.d_model)"),
    int_knob("model.d_model", 256, 1, knob_limits::kInt, "Width of the residual stream"),
    int_knob("model.vocab_size", 32000, 1, knob_limits::kInt,
             "Vocabulary size: the tokenizer's (every token id must be below it)"),
    int_knob("model.vocab_multiple", 128, 1, knob_limits::kInt,
             "The embedding gets a multiple of this many rows (padding masked)"),
    int_knob("model.seq_length", 256, 1, knob_limits::kInt, "Tokens per training sample (context length)"),
    int_knob("model.n_kv_head", 0, 0, knob_limits::kInt,
             "llama: key/value heads of grouped-query attention (1 = MQA; 0 = model.n_head)"),
    int_knob("model.ffn_hidden", 0, 0, knob_limits::kInt,
             "llama: SwiGLU hidden width (0 = Llama's rule, 8/3 x d_model rounded up to a multiple of 256)"),
    double_knob("model.rope_theta", 10000.0, "llama: base of the rotary embedding's angles (Llama 3: 500000)"),
    double_knob("model.norm_eps", 1e-5, "llama: RMSNorm epsilon (gpt2's LayerNorm is fixed at 1e-5)"),
    string_knob("model.tie_embeddings", "auto",
                "Whether the LM head is the embedding: true, false, or auto (gpt2: true, llama: false)",
                knob_words::kTieEmbeddings),
    int_knob("model.init_seed", 1234, 0, knob_limits::kUint32, "Seed of the GPT-2 weight initialisation"),
    string_knob("model.init_from", "",
                "Start from this checkpoint's weights (a checkpoint or run directory, any layout; e.g. from "
                "`train import-hf`) with a fresh optimizer at step 0; ignored once the run has checkpoints"),

    string_knob("data.blend", "", "Megatron-style blend of shard prefixes: \"0.7 A 0.3 B\", or one prefix"),
    string_knob("data.impl", "mmap", "How shards are read: mmap, lazy or cached", knob_words::kImpls),
    string_knob("data.split", "969,30,1", "Megatron split of each shard's documents: train,valid,test"),
    int_knob("data.seed", 1234, 0, knob_limits::kUint32, "Seed of the sample shuffle (Megatron's default 1234)"),
    string_knob("data.order", "megatron",
                "Sample order: megatron (Megatron's indices bit for bit; they depend on the run's length) or "
                "stable (each epoch shuffled on its own: the first N samples are the same for any train.steps, "
                "so a run made longer continues exactly)",
                knob_words::kDataOrders),
    string_knob("data.cache_dir", "", "Index cache directory (default: $DUFU_CACHE_DIR or ~/.cache/dufu)"),
    int_knob("data.workers", 2, 1, 256, "Loader threads reading samples"),
    int_knob("data.prefetch", 4, 1, 1024, "Batches the loader prepares ahead"),
    bool_knob("data.allow_changed_shards", false,
              "Resume even when a shard differs from the one the checkpoint was trained on (size or index "
              "digest); the samples then differ from the run's"),
    bool_knob("data.reset_position_ids", false,
              "Document masking (Megatron's): positions restart at 0 after each end-of-document token"),
    bool_knob("data.reset_attention_mask", false,
              "Document masking (Megatron's): a token attends only to its own document, the one its last "
              "end-of-document token opened"),
    bool_knob("data.eod_mask_loss", false,
              "Document masking (Megatron's): no loss where the input token is the end-of-document token; "
              "the loss is the mean over the positions that count, over the whole global batch"),
    int_knob("data.eod_id", -1, -1, knob_limits::kInt,
             "The end-of-document token that document masking splits samples at (-1: the shards' recorded "
             "tokenizer's)"),

    string_knob("train.device", "cpu",
                "Where the model runs: cpu, or cuda (one GPU per rank, NCCL between ranks; refused with the "
                "reason where there is no GPU)",
                knob_words::kDevices),
    int_knob("train.micro_batch", 8, 1, knob_limits::kInt, "Samples per forward/backward"),
    int_knob("train.global_batch", 0, 0, knob_limits::kInt,
             "Samples per optimizer step, a multiple of the micro-batch (0 = micro_batch)"),
    int_knob("train.steps", 1000, 1, knob_limits::kInt64, "Optimizer steps to train for"),
    string_knob("train.on_nonfinite", "stop",
                "What a NaN or Inf loss or gradient does: stop (error naming the step) or skip (no update)",
                knob_words::kNonFiniteActions),
    int_knob("train.exit_at_step", 0, 0, knob_limits::kInt64,
             "Stop with a checkpoint after this step (0 = run to train.steps): splits a run into jobs"),
    int_knob("train.threads", 0, 0, 4096, "OpenMP threads for the kernels (0 = OMP_NUM_THREADS or every core)"),
    string_knob("train.precision", "fp32",
                "fp32, or bf16: bf16 matmul inputs, weight working copy and stored activations with fp32 master "
                "weights, moments, LayerNorm statistics, softmax and loss (kernels compute in fp32 and round to "
                "bf16 at the recipe's points)",
                knob_words::kPrecisions),
    string_knob("train.attention_products", "fp32",
                "fp32, or bf16 (needs train.precision = bf16): attention's tile products on bf16 operands with "
                "fp32 sums, as tensor cores run them (P, dS and dout rounded to bf16; CUDA: mma.sync, compiled, "
                "not run yet)",
                knob_words::kPrecisions),
    string_knob("train.recompute", "none",
                "none; selective: the backward recomputes each layer's MLP hidden values; full: "
                "each layer keeps only its input and the backward runs its forward again (activation memory for "
                "compute; the same results, bit for bit)",
                knob_words::kRecomputes),
    double_knob("train.dp_bucket_mb", 25.0,
                "MiB of gradient per data-parallel collective (PyTorch DDP's bucket_cap_mb); the result does not "
                "depend on it, the collectives' scratch memory does",
                knob_limits::kBucketMinMb, knob_limits::kBucketMaxMb),
    string_knob("train.memory_limit", "0",
                "Memory one rank may plan for, in bytes or with a unit (\"24GB\", \"512MiB\"; kB, MB, GB, TB "
                "and KiB, MiB, GiB, TiB): a run or `train plan` whose plan needs more is refused; 0 = what the "
                "device has (the host's memory and swap on cpu, the free memory of the GPU on cuda)"),

    double_knob("optim.lr", 6e-4, "Peak learning rate, reached at the end of the warmup", 0.0),
    double_knob("optim.min_lr", 6e-5, "Floor the cosine decay ends at", 0.0),
    int_knob("optim.warmup_steps", 100, 0, knob_limits::kInt64, "Steps of linear warmup"),
    string_knob("optim.schedule", "cosine",
                "cosine: the rate decays from the warmup's end to optim.decay_steps; wsd (warmup-stable-decay): "
                "constant after the warmup and decays over the last optim.wsd_decay_steps before "
                "optim.decay_steps, so a run can be extended before its decay begins",
                knob_words::kSchedules),
    int_knob("optim.decay_steps", 0, 0, knob_limits::kInt64,
             "Step the decay reaches optim.min_lr (0 = train.steps)"),
    int_knob("optim.wsd_decay_steps", 0, 0, knob_limits::kInt64,
             "Under optim.schedule = wsd: steps of the final decay (0 = optim.wsd_decay_fraction of "
             "optim.decay_steps)"),
    double_knob("optim.wsd_decay_fraction", 0.1,
                "Under optim.schedule = wsd with optim.wsd_decay_steps = 0: the decay's share of the run", 0.0, 1.0),
    string_knob("optim.wsd_decay_shape", "linear",
                "Under optim.schedule = wsd: linear, or 1-sqrt (1 - sqrt of the decay's progress, Hagele et al. "
                "2024)",
                knob_words::kWsdDecayShapes),
    double_knob("optim.beta1", 0.9, "AdamW beta1", 0.0, 1.0, true),
    double_knob("optim.beta2", 0.95, "AdamW beta2", 0.0, 1.0, true),
    double_knob("optim.eps", 1e-8, "AdamW epsilon", 0.0),
    double_knob("optim.weight_decay", 0.1, "Decoupled weight decay of the matrices (not biases or LayerNorm)", 0.0),
    double_knob("optim.grad_clip", 1.0, "Clip the global gradient norm to this (0 = no clipping)", 0.0),
    string_knob("optim.offload", "none",
                "none, or cpu: the fp32 master weights and AdamW moments in host memory and AdamW on the host, the "
                "device keeping the bf16 weights, gradients and activations (ZeRO-Offload's split; needs "
                "train.precision = bf16 and a GPU)",
                knob_words::kOffloads),

    int_knob("eval.interval", 100, 0, knob_limits::kInt64,
             "Evaluate on the validation split every this many steps (0 = never)"),
    int_knob("eval.batches", 8, 1, knob_limits::kInt, "Micro-batches per evaluation (the same ones each time)"),

    int_knob("checkpoint.interval", 100, 0, knob_limits::kInt64,
             "Save a checkpoint every this many steps (0 = only at the end)"),
    int_knob("checkpoint.keep", 3, 1, knob_limits::kInt, "Newest checkpoints kept"),

    int_knob("dist.tensor_parallel_size", 1, 1, 4096,
             "Tensor-parallel ranks (Megatron: heads and MLP split, vocab-parallel embedding and loss)"),
    int_knob("dist.pipeline_parallel_size", 1, 1, 4096, "Pipeline stages (1F1B schedule over the micro-batches of a step)"),
    string_knob("dist.pipeline_num_layers", "",
                "Layers per pipeline stage, e.g. \"5,7\" (empty: an even split, earlier stages one more)"),
    string_knob("dist.pipeline_stage_ids", "",
                "The stage of each layer, e.g. \"0,0,0,0,0,1,1,1,1,1,1,1\" (LiBai's explicit stage ids; "
                "instead of dist.pipeline_num_layers)"),
    int_knob("dist.zero_stage", 0, 0, 3,
             "1: shard the AdamW moments over the data-parallel ranks (ZeRO-1: reduce-scatter, update, "
             "all-gather); 2: the gradients too (each layer's reduce-scattered as the backward makes it); "
             "3: the parameters too (each layer's gathered just before use); 0: every rank keeps them all"),
    bool_knob("dist.overlap_reduction", false,
              "Stages 2 and 3: start each layer's reduce-scatter as its backward ends and finish it during the "
              "next layer's (one more layer of gradient memory; the same sums and bits; measured no faster on "
              "MPI over shared memory)"),
    double_knob("dist.collective_timeout", 600.0,
                "Seconds an MPI rank waits for the others in one operation before the job ends with one line "
                "naming the rank that did not answer (a stopped process, a stuck device), as PyTorch's NCCL "
                "watchdog does; waiting ranks sleep rather than spin",
                0.0, knob_limits::kInf, true),
    bool_knob("dist.reduce_each_micro_batch", false,
              "Stage 0: all-reduce each micro-batch's layer gradients and sum those, as ZeRO-2 does (its "
              "results bit for bit; to compare the two)"),

    string_knob("run.dir", "runs/gpt", "Directory of the run: checkpoints, metrics.jsonl, config.toml"),
    int_knob("run.log_interval", 1, 1, knob_limits::kInt64, "Print a step line every this many steps"),
};

// A default of the table, as the struct field's type: `int n_layer = training_knob_int<int>("model.n_layer")`.
template <typename T>
consteval T training_knob_int(std::string_view name) {
  return static_cast<T>(knob_int(kTrainingKnobs, name));
}
template <typename T>
consteval T training_knob_double(std::string_view name) {
  return static_cast<T>(knob_double(kTrainingKnobs, name));
}
consteval bool training_knob_bool(std::string_view name) { return knob_bool(kTrainingKnobs, name); }
consteval std::string_view training_knob_string(std::string_view name) { return knob_string(kTrainingKnobs, name); }

}  // namespace dufu::trainer
