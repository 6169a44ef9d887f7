// The ops a device runs for the GPT-2 model: one function pointer per op in a
// KernelTable, which every backend fills with its own implementations (the CPU's in
// src/cpu/, namespace dufu::trainer::cpu; a CUDA one in src/cuda/), so two backends
// link side by side and a test can run the same op on each. Every pointer argument
// is the memory of the device whose table it is (see device.h). Tensors are fp32 but for
// the operands typed TensorIn (fp32 or bf16), row-major, contiguous. Shapes: B batch, T positions, C channels, NH heads, V
// vocabulary (Vp padded), N = B·T rows. Backward kernels ACCUMULATE into parameter
// gradients (+=), so micro-batches sum without copies, and OVERWRITE or accumulate
// activation gradients as each entry says. Kernels are deterministic: no atomics in
// any reduction, so the same inputs give the same bits on a device. Arguments are
// checked by the caller (GPT) once, before any kernel runs; kernels check only what
// their entry says they throw for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace dufu::trainer {

// A run of consecutive parameters that share one weight decay (AdamW decays only the
// matrices, so a model's buffer alternates between decayed and undecayed runs). Each
// run starts where the previous one ends, the first at 0.
struct AdamWSegment {
  std::size_t end;  // one past the run's last parameter
  float weight_decay;
};

// The element type of a tensor a kernel reads.
enum class ElementType : std::uint8_t { kFloat32, kBf16 };

// A tensor a kernel reads, with its element type: fp32 values, or bf16 storage (bf16.h's
// bits) where the bf16 recipe keeps the tensor in bf16 (the weights' working copy, the
// activations kept for the backward). The type travels with the pointer, so one entry
// is one piece of math whatever the types and a caller never picks another entry for
// another precision; each backend reads bf16 its own way (the CPU widens to floats, a
// GPU multiplies bf16 on its tensor cores). Made implicitly from a float or bf16-bits
// pointer, or nullptr.
struct TensorIn {
  const void* data = nullptr;
  ElementType type = ElementType::kFloat32;

  constexpr TensorIn() = default;
  constexpr TensorIn(std::nullptr_t) {}
  constexpr TensorIn(const float* values) : data(values) {}
  constexpr TensorIn(const std::uint16_t* bits)
      : data(bits), type(ElementType::kBf16) {}

  bool bf16() const { return type == ElementType::kBf16; }
  const float* values() const { return static_cast<const float*>(data); }
  const std::uint16_t* bits() const { return static_cast<const std::uint16_t*>(data); }
};

// A tensor a kernel writes, as the bf16 recipe keeps it: fp32 `values`, and under
// kBf16 each value rounded to bf16 as it is written, its bits also written to `bits`
// unless that is null (store_bf16's contract, done by the kernel that computes the
// tensor instead of a pass after it). Made implicitly from a float pointer (fp32:
// nothing rounded) or nullptr.
struct TensorOut {
  float* values = nullptr;
  ElementType type = ElementType::kFloat32;
  std::uint16_t* bits = nullptr;

  constexpr TensorOut() = default;
  constexpr TensorOut(std::nullptr_t) {}
  constexpr TensorOut(float* written) : values(written) {}
  constexpr TensorOut(float* written, ElementType kept, std::uint16_t* kept_bits)
      : values(written), type(kept), bits(kept_bits) {}

  bool bf16() const { return type == ElementType::kBf16; }
};

// A tensor a kernel reads that an earlier kernel wrote as a TensorOut: its fp32 values,
// and under the bf16 recipe the bf16 bits it stored beside them (null where none were
// stored, and under fp32). A backend reads the form it computes with: the CPU the
// values, a GPU the bits, which go to its tensor cores as they are (without bits it
// copies the values to bf16, exactly: a kept tensor's values are on the bf16 grid).
// Made implicitly from a float pointer (no bits) or nullptr.
struct KeptIn {
  const float* values = nullptr;
  const std::uint16_t* bits = nullptr;

  constexpr KeptIn() = default;
  constexpr KeptIn(std::nullptr_t) {}
  constexpr KeptIn(const float* kept_values) : values(kept_values) {}
  constexpr KeptIn(const float* kept_values, const std::uint16_t* kept_bits) : values(kept_values), bits(kept_bits) {}
};

struct KernelTable {
  // Operands of type TensorIn are fp32 or bf16; those of one entry are all of one type
  // (a null one aside): a mix throws dufu::Error. Outputs, biases, dout, pre and
  // gradients are fp32. With bf16 operands an entry computes what it computes on their
  // float values; a backward GEMM's dout is a KeptIn, on the bf16 grid under the bf16
  // recipe (it keeps every activation gradient), with its bits where the model stored
  // them, so a GPU multiplies bf16 with fp32 accumulation without a copy.
  //
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[p,:], kept as out says (TensorOut), where p
  // = positions[b,t], or t when positions is null (positions restart in each document
  // under document masking; they must index rows of wpe). Tokens must index rows of wte
  // (unchecked).
  void (*embedding_forward)(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions, TensorIn wte,
                            TensorIn wpe, int B, int T, int C);
  // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[p,:] += dout[b,t,:] (p as above), in the
  // order of (b, t) for each row of dwpe when positions are given.
  void (*embedding_backward)(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                             const std::int32_t* positions, int B, int T, int C);
  // Vocab-parallel embedding (tensor parallelism): wte holds rows
  // [vocab_begin, vocab_begin + V_local) of the full table. out[b,t,:] = the token's row
  // if its id is in that range, else 0, plus wpe[t,:] unless wpe is null. When the
  // ranks splitting the table each run this, one of them with wpe, the sum of their
  // outputs is embedding_forward's, exactly: each position's sum has at most two
  // non-zero terms (before out is kept: a group keeps the sum, after its all-reduce).
  // Positions as embedding_forward's.
  void (*vocab_parallel_embedding_forward)(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions,
                                           TensorIn wte, TensorIn wpe, int vocab_begin, int V_local, int B, int T,
                                           int C);
  // dwte[tokens[b,t] - vocab_begin,:] += dout[b,t,:] for the tokens in range;
  // dwpe as embedding_backward's unless dwpe is null.
  void (*vocab_parallel_embedding_backward)(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                                            const std::int32_t* positions, int vocab_begin, int V_local, int B,
                                            int T, int C);

  // LayerNorm of each of the N rows: out = (x - mean) * rstd * weight + bias; mean and
  // rstd (N each) are saved for backward. eps = 1e-5 like PyTorch/GPT-2. out is kept as
  // its TensorOut says; mean and rstd are those of x, whatever out's type.
  void (*layernorm_forward)(TensorOut out, float* mean, float* rstd, const float* x, const float* weight,
                            const float* bias, int N, int C);
  // Residual add fused with the next LayerNorm: residual_out = residual + branch, then
  // norm_out = LayerNorm(residual_out). residual_out may be residual (in place). Its
  // backward is layernorm_backward with dx = the residual stream's gradient, which then
  // serves both residual and branch.
  // Under bf16 (TensorOut) the sum is rounded before it is normalised, so the
  // LayerNorm and its backward see the residual stream as it is stored.
  void (*residual_layernorm_forward)(TensorOut residual_out, TensorOut norm_out, float* mean, float* rstd,
                                     const float* residual, const float* branch, const float* weight, const float* bias,
                                     int N, int C);
  // dx += LayerNorm'(x)^T dout; dweight += ...; dbias += ... (dx accumulates, so the
  // residual stream's gradient flows through unchanged; the sum is kept as dx says).
  void (*layernorm_backward)(TensorOut dx, float* dweight, float* dbias, const float* dout, const float* x,
                             const float* weight, const float* mean, const float* rstd, int N, int C);

  // out[N, OC] = x[N, C] · weight[OC, C]^T + bias[OC] (bias may be null); sgemm. A
  // bf16-kept out is rounded (and its bits stored) as it is written (TensorOut).
  void (*matmul_forward)(TensorOut out, TensorIn x, TensorIn weight, const float* bias, int N, int C, int OC);
  // dx[N, C] = dout · weight (overwritten, kept as TensorOut says; dx may be null);
  // dweight += dout^T · x; dbias += column sums of dout (dbias may be null).
  void (*matmul_backward)(TensorOut dx, float* dweight, float* dbias, KeptIn dout, TensorIn x, TensorIn weight, int N,
                          int C, int OC);

  // GELU (tanh approximation) after adding the bias: pre = x + bias[col] is written to
  // `pre` (kept for backward) and out = gelu(pre). x is [N, C]; pre may be x (in place).
  void (*bias_gelu_forward)(float* out, float* pre, const float* x, const float* bias, int N, int C);
  // The MLP's first projection with its bias and GELU fused, as a GPU runs them in the
  // matmul's epilogue: pre[N, OC] = x[N, C] · weight[OC, C]^T + bias[OC] (kept for
  // backward) and out = gelu(pre). The values of matmul_forward (without bias) into
  // pre, then bias_gelu_forward in place; out is the GELU of pre before pre is kept
  // (rounded, under bf16), so the product is rounded once on each path.
  void (*matmul_bias_gelu_forward)(TensorOut out, TensorOut pre, TensorIn x, TensorIn weight, const float* bias,
                                   int N, int C, int OC);
  // The MLP's second projection backward through the GELU before it, as a GPU runs it
  // with the GELU's derivative in the dx matmul's epilogue: for out = x · weight^T + bias
  // with x = gelu(pre), dpre[N, C] = gelu'(pre) ⊙ (dout · weight) (overwritten: the
  // gradient of the GELU's input, so the gradient of x is never stored);
  // dweight += dout^T · x; dbias += column sums of dout (dbias may be null). The values
  // of matmul_backward into dpre, then dpre *= gelu'(pre), then dpre kept (TensorOut).
  void (*matmul_gelu_backward)(TensorOut dpre, float* dweight, float* dbias, KeptIn dout, TensorIn x, TensorIn weight,
                               const float* pre, int N, int C, int OC);

  // Causal self-attention with grouped K/V heads on qkv [B, T, (NH + 2 NKV) hs]: each
  // row holds NH query heads, then NKV key heads, then NKV value heads, hs wide each
  // (rotary_forward's layout). NH is a multiple of NKV and query head h attends with
  // K/V head h / (NH / NKV): NKV = NH is multi-head attention (GPT-2, bitwise the
  // kernels before grouping), NKV = 1 multi-query attention. Flash-style
  // (device/flash_attention.h): out [B, T, NH hs]; lse [B, NH, T] the log-sum-exp of
  // each row's scaled scores, all the backward needs of the softmax. Scale 1/sqrt(hs).
  // No T x T matrix is stored: memory O(B NH T).
  // qkv's type picks the products' precision: fp32 qkv, fp32 products throughout;
  // bf16 qkv (its bits), bf16 products with fp32 accumulation, as tensor cores run them:
  // the probabilities are rounded to bf16 for P V (their row sums stay fp32) and, in
  // the backward, P and dS for dV, dQ and dK. lse stays fp32; out and dqkv are kept
  // as their TensorOut says, each value rounded from its fp32 sum as it is written.
  // document_starts [B, T] (document masking; null: every row one document): the
  // position in its row where token t's document begins, so that query t attends to
  // keys [document_starts[b,t], t] only; non-decreasing along a row, each <= t.
  // Tiles wholly outside a query block's documents are skipped.
  void (*attention_forward)(TensorOut out, float* lse, TensorIn qkv, const std::int32_t* document_starts, int B,
                            int T, int NH, int NKV, int hs);
  // dqkv (overwritten whole: q, k and v parts) from dout, recomputing the
  // probabilities tile by tile from qkv and the forward's out and lse. Deterministic:
  // no atomics, a fixed summation order; a K/V head's gradient sums its group's query
  // heads in order, lowest first.
  // document_starts as the forward's.
  void (*attention_backward)(TensorOut dqkv, const float* dout, TensorIn qkv, const float* out, const float* lse,
                             const std::int32_t* document_starts, int B, int T, int NH, int NKV, int hs);

  // Fused classifier: for each of the N rows of logits [N, Vp] (only the first V are
  // real vocabulary; the padding is excluded), losses[n] = -log softmax(logits)[target]
  // and logits are overwritten IN PLACE by dloss_scale · (softmax - onehot(target)),
  // the gradient of the mean loss when dloss_scale = 1/N_total. Padding columns get 0.
  // A target of -1 ignores the row (loss 0, gradient 0); any other target outside
  // [0, V) throws dufu::Error before anything is written. The gradient is kept as
  // logits says (TensorOut: logits.values is the buffer read and overwritten).
  void (*classifier_forward_backward)(TensorOut logits, float* losses, const std::int32_t* targets, float dloss_scale,
                                      int N, int V, int Vp);

  // Vocab-parallel classifier (tensor parallelism): classifier_forward_backward's losses
  // and gradient when the vocabulary is split over a group of ranks and no rank holds
  // a whole row. Each rank has logits [N, Vl] for the vocabulary ids
  // [vocab_begin, vocab_begin + Vl); ids from V on are padding, excluded. Targets are
  // vocabulary ids (or -1 to ignore the row), the same on every rank. Three phases,
  // with an all-reduce over the group after each of the first two:
  //   1. max: row_max[n] = the largest of this rank's real logits of row n (-inf if it
  //      has none, or the row is ignored). Then all-reduce MAX over row_max [N].
  //   2. exp_sum: logits = exp(logit - row_max) in place over the real columns;
  //      stats[n] = their sum, stats[N + n] = the target's logit if this rank holds the
  //      target, else 0 (both 0 for ignored rows). Then all-reduce SUM over stats [2N].
  //   3. finish: losses[n] = log(stats[n]) - (stats[N + n] - row_max[n]), the same on
  //      every rank, and logits = dloss_scale · (softmax - onehot(target)) in place;
  //      padding columns and ignored rows get 0, ignored rows loss 0; the gradient
  //      kept as logits says (logits.values is the buffer read and overwritten).
  // Phase 1 throws dufu::Error for a target neither -1 nor in [0, V), or for a
  // vocab_begin or Vl out of range, before anything is written.
  void (*vocab_parallel_classifier_max)(float* row_max, const float* logits, const std::int32_t* targets, int N, int V,
                                        int vocab_begin, int Vl);
  void (*vocab_parallel_classifier_exp_sum)(double* stats, float* logits, const float* row_max,
                                            const std::int32_t* targets, int N, int V, int vocab_begin, int Vl);
  void (*vocab_parallel_classifier_finish)(TensorOut logits, float* losses, const double* stats, const float* row_max,
                                           const std::int32_t* targets, float dloss_scale, int N, int V,
                                           int vocab_begin, int Vl);

  // sum of squares of `n` values, accumulated in double in a fixed order (deterministic).
  double (*sum_of_squares)(const float* values, std::size_t n);
  // values *= scale
  void (*scale_in_place)(float* values, float scale, std::size_t n);

  // One fused AdamW pass (decoupled weight decay, bias-corrected moments) over the
  // parameters [0, segments.back().end), each decayed by its segment's weight_decay (0
  // for parameters not decayed): step t starts at 1. Same formula and order of
  // operations as torch.optim.AdamW, one pass over the whole buffer whatever the
  // segments. Each gradient is used as the float grads[i] * grad_scale, the
  // value scale_in_place(grads, grad_scale) would have stored, so gradient clipping
  // folds into this pass without changing a bit (and saves its own pass over the
  // gradients). Throws dufu::Error for t < 1 or segment ends that decrease.
  void (*adamw_update)(float* params, const float* grads, float* m, float* v, std::span<const AdamWSegment> segments,
                       float lr, float beta1, float beta2, float eps, int t, float grad_scale);

  // ---- the model's glue, kept on the device so no step leaves it ----
  // out[i] = a[i] + b[i] for i < n (out may be a or b): the residual add at the end of
  // a pipeline stage, where no LayerNorm follows to fuse it with. out kept (TensorOut).
  void (*add)(TensorOut out, const float* a, const float* b, std::size_t n);
  // mean_out[0] = the mean of losses[i] over the rows whose target is not -1, summed
  // in double in row order (0 when every row is ignored): the loss a forward returns.
  void (*masked_mean_loss)(float* mean_out, const float* losses, const std::int32_t* targets, int N);

  // ---- mixed precision (train.precision = bf16; docs/architecture.md) ----
  // values[i] = round_to_bf16(values[i]) (bf16.h) for i < n: where the recipe stores
  // bf16, a device that keeps float arrays rounds their values instead. Every backend
  // fills it (kernel_list.h); a table that leaves it null (a test's) gets bf16 refused
  // by GPT.
  void (*round_to_bf16)(float* values, std::size_t n) = nullptr;
  // The bf16 storage of the activations a layer's backward reads, kept from the forward
  // to the backward in half the memory (GPT, under bf16): store_bf16 rounds values[i]
  // in place as round_to_bf16 does and writes the bf16 bits of the result to
  // stored[i] (bf16.h's float_to_bf16_bits); load_bf16 gives back values[i] = the
  // float of stored[i], exactly. Null in a table without them, like round_to_bf16.
  void (*store_bf16)(std::uint16_t* stored, float* values, std::size_t n) = nullptr;
  void (*load_bf16)(float* values, const std::uint16_t* stored, std::size_t n) = nullptr;
  // bits[i] = the bf16 bits of values[i], rounded (values unchanged): the bf16 working
  // copy of the weights, made from the fp32 masters.
  void (*to_bf16)(std::uint16_t* bits, const float* values, std::size_t n) = nullptr;

  // ---- Llama-family ops (model.arch = llama; docs/architecture.md) ----
  // RMSNorm of each of the N rows: out = x * rstd * weight with
  // rstd = 1 / sqrt(mean(x^2) + eps), saved (N) for backward. No bias, no mean
  // subtracted. eps is the model's (Llama 1: 1e-6; Llama 2 and 3: 1e-5). out kept as
  // layernorm_forward's.
  void (*rmsnorm_forward)(TensorOut out, float* rstd, const float* x, const float* weight, float eps, int N,
                          int C) = nullptr;
  // Residual add fused with the next RMSNorm, as residual_layernorm_forward:
  // residual_out = residual + branch (may be residual, in place), then norm_out =
  // RMSNorm(residual_out). Its backward is rmsnorm_backward with dx = the residual
  // stream's gradient, which then serves both residual and branch.
  void (*residual_rmsnorm_forward)(TensorOut residual_out, TensorOut norm_out, float* rstd, const float* residual,
                                   const float* branch, const float* weight, float eps, int N, int C) = nullptr;
  // dx += RMSNorm'(x)^T dout (accumulates, like layernorm_backward); dweight += column
  // sums of x * rstd * dout, over kernel_partition.h's row chunks in a fixed order.
  void (*rmsnorm_backward)(TensorOut dx, float* dweight, const float* dout, const float* x, const float* weight,
                           const float* rstd, int N, int C) = nullptr;
  // Rotary position embedding, IN PLACE on the q and k heads of a fused projection
  // qkv [B, T, (NH + 2 NKV) hs]: each row holds NH query heads, then NKV key heads, then
  // NKV value heads (untouched), each hs wide (hs even; NH a multiple of NKV for
  // grouped-query attention, NKV = NH plain multi-head). HF Llama's convention
  // (rotate_half): element i < hs/2 of a head pairs with i + hs/2 and turns by the
  // angle p * theta^(-2i/hs) at position p = positions[b,t], or t when positions is
  // null (llama_math.h). Under tensor parallelism a
  // rank passes its own NH / tp and NKV / tp heads. The rotation finishes the tensor,
  // so the whole of qkv is kept as its TensorOut says, the v heads too (qkv.values is
  // the buffer read and written): the projection before it leaves fp32 values.
  void (*rotary_forward)(TensorOut qkv, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs,
                         float theta) = nullptr;
  // The backward, in place on dqkv of the same layout: the gradients of q and k turned
  // by -angle (the rotation's transpose); v's gradient unturned; the whole of dqkv kept
  // as rotary_forward keeps qkv.
  void (*rotary_backward)(TensorOut dqkv, const std::int32_t* positions, int B, int T, int NH, int NKV, int hs,
                          float theta) = nullptr;
  // SwiGLU on the fused gate/up projection gate_up [N, 2H] (each row: H gate values,
  // then H up values): out [N, H] = silu(gate) * up. Under tensor parallelism a rank's
  // projection stacks its column slice of the gate rows over the same slice of the up
  // rows, so its local output has this layout with H / tp. out kept (TensorOut).
  void (*swiglu_forward)(TensorOut out, const float* gate_up, int N, int H) = nullptr;
  // dgate_up [N, 2H] (overwritten) = (dgate, dup) of out's gradient dout [N, H]: the
  // gradient of the fused projection's output, in its layout, kept (TensorOut).
  void (*swiglu_backward)(TensorOut dgate_up, const float* dout, const float* gate_up, int N, int H) = nullptr;
};

}  // namespace dufu::trainer
