// Attention with bf16 products on the tensor cores (attention_bf16.cu): what
// attention_forward and attention_backward run when qkv is bf16.
#pragma once

#include <cstdint>

#include "device/flash_attention.h"
#include "dufu/trainer/device/kernel_table.h"

namespace dufu::trainer::cuda {

void bf16_attention_forward(TensorOut out, float* lse, const std::uint16_t* qkv, int B,
                            const FlashAttentionShape& shape);
void bf16_attention_backward(TensorOut dqkv, const float* dout, const std::uint16_t* qkv, const float* out,
                             const float* lse, int B, const FlashAttentionShape& shape);

}  // namespace dufu::trainer::cuda
