// The bf16 storage of activations under train.precision = bf16: what a model allocates
// for its activations, measured on a counting device, against the memory plan's
// estimate (training_memory.h) under both precisions, and the half that bf16 storage
// saves on the tensors a backward reads; and pipeline activation slots whose forwards
// run before their backwards (as in the 1F1B schedule), so each backward must read its
// own micro-batch's bf16 copies, not the working layer the later forward overwrote.
#include <gtest/gtest.h>

#include <string>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/run/training_memory.h"
#include "support/activation_bytes.h"
#include "support/counting_cpu_device.h"
#include "support/gpt_fixture.h"
#include "support/pipeline_stage_check.h"

namespace {

using dufu::trainer::GPT;
using dufu::trainer::GPTConfig;
using dufu::trainer::Precision;

// The vocabulary is a multiple of vocab_multiple, so the plan's padding allowance (a
// whole vocab_multiple of logit columns) is exactly what it over-counts.
GPTConfig storage_model() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 3, .n_head = 2, .d_model = 32, .vocab_size = 64, .vocab_multiple = 16, .seq_length = 16});
}

constexpr int kB = 4;
constexpr int kT = 16;

double measured_activation_bytes(Precision precision) {
  return dufu::testing::measured_activation_bytes(storage_model(), precision, dufu::trainer::Recompute::kNone, kB, kT);
}

TEST(Bf16Storage, ActivationMemoryIsWhatThePlanSays) {
  const GPTConfig config = storage_model();
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(dufu::trainer::precision_name(precision));
    const double planned = dufu::trainer::activation_bytes(config, kB, kT, 1, {}, 1, 0, precision);
    EXPECT_EQ(measured_activation_bytes(precision),
              planned - dufu::testing::plan_over_count_bytes(config, precision, kB, kT));
  }
}

TEST(Bf16Storage, HalvesTheActivationsTheBackwardReads) {
  const GPTConfig config = storage_model();
  const double N = kB * kT;
  const double C = config.d_model;
  const double L = config.n_layer;
  // Per layer the backward reads ln_1, ln_2, the two residuals, qkv, the attention
  // output and the MLP's two hidden tensors (4C + 12C floats per token); attention's
  // lse and the stage's output stay fp32. bf16 keeps them in 2 bytes instead of 4, and
  // computes a layer in an fp32 working layer of 5C + 12C floats per token; the LM
  // head reads a bf16 copy of ln_f besides its fp32 one. The backward GEMMs read the
  // bits of their dout: the logits' gradient's (V per token) and those of the residual
  // stream's, qkv's and fc_pre's gradients (C + 3C + 4C per token).
  const double kept = L * 16.0 * C * N - C * N;
  const double working_layer = 17.0 * C * N;
  const double ln_f_copy = C * N;
  const double gradient_bits = config.vocab_size * N + 8.0 * C * N;
  EXPECT_EQ(measured_activation_bytes(Precision::kFp32) - measured_activation_bytes(Precision::kBf16),
            2.0 * kept - 4.0 * working_layer - 2.0 * ln_f_copy - 2.0 * gradient_bits);
}

TEST(Bf16Storage, PipelineSlotsKeepTheirOwnActivations) {
  // Each micro-batch's tail forward is followed by its backward; both go through the
  // first stage before either comes back, so its backward must read its own bf16 copies.
  dufu::testing::expect_pipeline_stages_match_whole_model(
      storage_model(), {.precision = Precision::kBf16,
                        .recompute = dufu::trainer::Recompute::kNone,
                        .B = kB,
                        .T = kT,
                        .first_seed = 21,
                        .first_ignored = 3,
                        .tail_forwards_first = false});
}

}  // namespace
