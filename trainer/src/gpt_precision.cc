// The GPT's side of the bf16 mixed-precision recipe (docs/architecture.md, "Mixed
// precision"): the precision knob, the working copy of the weights and the rounding
// points gpt.cc calls. Under fp32 every function here leaves the model's arithmetic
// exactly as it was.
#include <string>

#include "dufu/common/error.h"
#include "dufu/trainer/gpt.h"

namespace dufu::trainer {

const char* precision_name(Precision precision) { return precision == Precision::kBf16 ? "bf16" : "fp32"; }

Precision parse_precision(std::string_view text, std::string_view knob) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  DUFU_FAIL(knob, " must be \"fp32\" or \"bf16\", got \"", text, "\"");
}

void GPT::set_precision(Precision precision) {
  if (precision == Precision::kBf16 && kernels_->round_to_bf16 == nullptr) {
    DUFU_FAIL("train.precision = bf16: the device ", device_->describe(),
              " has no bf16 rounding kernel yet; HINT: use train.precision = fp32 on it");
  }
  precision_ = precision;
  // Every kernel call of forward and backward goes through kernels_, so this one
  // pointer decides whether a GPU's matmuls take the recipe's operands as bf16.
  kernels_ = precision == Precision::kBf16 ? &device_->kernels_for_bf16_operands() : &device_->kernels();
  if (precision == Precision::kFp32) {
    working_weights_.reset();
    p_ = tensors(params_.span());
    return;
  }
  if (working_weights_.size() != params_.size()) working_weights_ = DeviceBuffer<float>(*device_, params_.size());
  p_ = tensors(working_weights_.span());
  working_weights_stale_ = true;
}

void GPT::round_if_bf16(float* values, std::size_t count) const {
  if (precision_ == Precision::kBf16) kernels_->round_to_bf16(values, count);
}

void GPT::refresh_working_weights() {
  if (precision_ != Precision::kBf16 || !working_weights_stale_) return;
  // A pure function of the masters: remaking it at any time gives the same bits, so a
  // resumed run (which saves and loads only the masters) computes what the
  // uninterrupted one did.
  device_->copy(working_weights_.data(), params_.data(), params_.size() * sizeof(float));
  kernels_->round_to_bf16(working_weights_.data(), working_weights_.size());
  working_weights_stale_ = false;
}

void GPT::residual_layernorm(float* residual_out, float* norm_out, float* mean, float* rstd, const float* residual,
                             const float* branch, const float* weight, const float* bias, int N, int C) {
  const KernelTable& k = *kernels_;
  if (precision_ == Precision::kFp32) {
    k.residual_layernorm_forward(residual_out, norm_out, mean, rstd, residual, branch, weight, bias, N, C);
    return;
  }
  // The residual stream is stored in bf16, and the LayerNorm normalises what was
  // stored (as llm.c's fused kernel does), so its backward sees the same x.
  const std::size_t count = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
  k.add(residual_out, residual, branch, count);
  k.round_to_bf16(residual_out, count);
  k.layernorm_forward(norm_out, mean, rstd, residual_out, weight, bias, N, C);
  k.round_to_bf16(norm_out, count);
}

}  // namespace dufu::trainer
