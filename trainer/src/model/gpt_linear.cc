// The GPT's linear layers and embedding: one kernel entry whatever the precision, given
// the operands the recipe keeps (docs/architecture.md, "Mixed precision"): under fp32 the
// fp32 tensors, under bf16 the weights' bf16 working copy and the stored bf16 copies of
// the activations, so a GPU multiplies what is in memory without converting it first.
#include <cstdint>

#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

TensorIn GPT::typed(Operand operand) const {
  if (precision_ == Precision::kBf16) return operand.bits;
  return operand.values;
}

TensorIn GPT::attention_input(Operand qkv) const {
  if (precision_ == Precision::kBf16 && attention_products_ == Precision::kBf16) return qkv.bits;
  return qkv.values;
}

void GPT::linear_forward(TensorOut out, Operand x, Operand weight, const float* bias, int N, int C, int OC) {
  kernels_->matmul_forward(out, typed(x), typed(weight), bias, N, C, OC);
}

void GPT::linear_bias_gelu_forward(TensorOut out, TensorOut pre, Operand x, Operand weight, const float* bias, int N,
                                   int C, int OC) {
  kernels_->matmul_bias_gelu_forward(out, pre, typed(x), typed(weight), bias, N, C, OC);
}

void GPT::linear_backward(TensorOut dx, float* dweight, float* dbias, KeptIn dout, Operand x, Operand weight,
                          int N, int C, int OC) {
  kernels_->matmul_backward(dx, dweight, dbias, dout, typed(x), typed(weight), N, C, OC);
}

void GPT::linear_gelu_backward(TensorOut dpre, float* dweight, float* dbias, KeptIn dout, Operand x,
                               Operand weight, const float* pre, int N, int C, int OC) {
  kernels_->matmul_gelu_backward(dpre, dweight, dbias, dout, typed(x), typed(weight), pre, N, C, OC);
}

TensorOut GPT::kept_before_reduction(float* values) const {
  if (tp_ > 1) return values;
  return kept(values, nullptr);
}

void GPT::reduce_and_keep(float* values, std::size_t count) {
  if (tp_ == 1) return;
  reduce_over_tensor_group(values, count);
  // The one rounding pass left under bf16: a sum over ranks is final only here.
  if (precision_ == Precision::kBf16) kernels_->round_to_bf16(values, count);
}

// Tensor parallel, each rank looks up its rows of wte and one rank adds wpe, so the
// sum over the group is the embedding (GPT::forward_stage all-reduces it). Llama has
// no wpe: its one rank of one uses the vocab-parallel kernel over the whole table,
// which adds nothing for a null wpe.
void GPT::embed(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions, bool adds_positions, int B,
                int T, int C) {
  const TensorIn wte = typed({p_.wte, p16_.wte});
  const TensorIn wpe = typed({p_.wpe, p16_.wpe});
  if (tp_ == 1 && !config_.is_llama()) {
    kernels_->embedding_forward(out, tokens, positions, wte, wpe, B, T, C);
    return;
  }
  kernels_->vocab_parallel_embedding_forward(out, tokens, positions, wte, adds_positions ? wpe : nullptr,
                                             vocab_begin(), local_vocab_size(), B, T, C);
}

void GPT::embed_backward(const float* dout, const std::int32_t* tokens, const std::int32_t* positions, int B, int T,
                         int C) {
  if (tp_ == 1 && !config_.is_llama()) {
    kernels_->embedding_backward(g_.wte, g_.wpe, dout, tokens, positions, B, T, C);
  } else {
    kernels_->vocab_parallel_embedding_backward(g_.wte, g_.wpe, dout, tokens, positions, vocab_begin(),
                                                local_vocab_size(), B, T, C);
  }
}

void GPT::norm_forward(TensorOut out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                       int N, int C) {
  if (config_.is_llama()) {
    kernels_->rmsnorm_forward(out, rstd, x, weight, config_.norm_eps, N, C);
  } else {
    kernels_->layernorm_forward(out, mean, rstd, x, weight, bias, N, C);
  }
}

void GPT::norm_backward(TensorOut dx, float* dweight, float* dbias, const float* dout, const float* x,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  if (config_.is_llama()) {
    kernels_->rmsnorm_backward(dx, dweight, dout, x, weight, rstd, N, C);
  } else {
    kernels_->layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd, N, C);
  }
}

GPT::Operand GPT::head_weights() const {
  if (p_.lm_head != nullptr || p16_.lm_head != nullptr) return {p_.lm_head, p16_.lm_head};
  return {p_.wte, p16_.wte};
}

}  // namespace dufu::trainer
