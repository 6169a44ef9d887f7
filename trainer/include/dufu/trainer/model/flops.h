// Model FLOP utilization: the FLOPs a GPT training step needs by the usual count, and
// the machine's measured sgemm rate to compare them with.
#pragma once

#include <cstdint>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

// Training FLOPs per token (forward + backward = 3 × forward) as PaLM's appendix
// counts them: 6 per weight of every matmul (the blocks' linear layers and the LM
// head over the padded vocabulary; embeddings and biases are lookups and adds) plus
// 12·n_layer·d_model·T for attention's two T×T products (the causal mask is not
// subtracted, as in Megatron's and PaLM's figures).
double gpt_training_flops_per_token(const GPTConfig& config, int T);

// sgemm throughput of `device`, in FLOP/s, through the same matmul kernel the model
// uses (its table's matmul_forward; on the CPU all OpenMP threads) on a
// GPT-2-small-sized product ([1024, 768] × [768, 3072]), best of repeated runs over
// about `seconds`.
double measure_sgemm_peak_flops(double seconds = 0.5, Device& device = cpu_device());

// What MFU on a GPU is measured against: measure_cuda_bf16_gemm_flops (device.h).

}  // namespace dufu::trainer
