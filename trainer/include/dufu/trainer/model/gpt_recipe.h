// How a training step computes (train.precision) and what its forward keeps for the
// backward (train.recompute): the two knobs of GPT's recipe.
#pragma once

#include <string_view>

namespace dufu::trainer {

// The arithmetic of a training step (train.precision). kFp32: every tensor is fp32.
// kBf16: the mixed-precision recipe of docs/architecture.md ("Mixed precision"):
// matmul inputs, the weights' working copy and the activations between kernels are
// bf16 (on the CPU device: floats rounded to bf16 at those points); master weights,
// parameter gradients, AdamW moments, LayerNorm statistics, softmax and the loss fp32.
enum class Precision { kFp32, kBf16 };

// "fp32" or "bf16"; and back, throwing dufu::Error naming `knob` for anything else.
const char* precision_name(Precision precision);
Precision parse_precision(std::string_view text, std::string_view knob);

// What the forward keeps of each layer for the backward (train.recompute). kNone:
// every activation the backward reads. kFull: only each layer's input (the residual
// stream) and its LayerNorm statistics; the backward runs the layer's forward again
// from that input into one layer's worth of memory shared by all layers and slots
// (Korthikanti et al. 2022's full recomputation), the same kernels on the same inputs,
// so the gradients are the same bits. Under tensor parallelism the recomputation
// repeats the attention projection's all-reduce.
// kSelective: every activation but the MLP's two hidden tensors (8C of a layer's 16C
// floats per token), which the backward recomputes from the stored ln_2 (the MLP's
// first matmul with its bias and GELU); the flash-style attention keeps no T x T
// probabilities to drop, only its inputs, output and row log-sum-exp.
enum class Recompute { kNone, kSelective, kFull };
// "none", "selective" or "full"; and back, throwing dufu::Error naming `knob` for anything else.
const char* recompute_name(Recompute recompute);
Recompute parse_recompute(std::string_view text, std::string_view knob);

// The whole recipe, fixed when a model is built (GPT's constructor), so no caller has
// to know in which order its parts may be set: precision, attention's tile products,
// recomputation and optimizer offload (recipe_rules.h says which combinations hold).
struct GPTRecipe {
  Precision precision = Precision::kFp32;
  Precision attention_products = Precision::kFp32;
  Recompute recompute = Recompute::kNone;
  bool optimizer_offload = false;
};

}  // namespace dufu::trainer
