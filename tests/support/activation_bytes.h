// What one forward and backward allocate on the counting device, for the tests that
// hold the memory plan's activation count to what a model really allocates.
#pragma once

#include <cstddef>

#include "dufu/trainer/model/gpt.h"
#include "support/counting_cpu_device.h"
#include "support/gpt_fixture.h"

namespace dufu::testing {

// Bytes a forward with targets and its backward allocate on a model of `config` that
// has its weights and its gradient already, for a batch of B x T tokens.
inline double measured_activation_bytes(const trainer::GPTConfig& config, trainer::Precision precision,
                                        trainer::Recompute recompute, int B, int T) {
  CountingCpuDevice device;
  trainer::GPT model(config, nullptr, {}, &device,
                     trainer::GPTRecipe{.precision = precision, .recompute = recompute});
  model.init_gpt2(3);
  const auto batch = next_token_batch(B, T, config.vocab_size, 9, {});
  model.zero_grad();  // the gradient is the model's, not the activations'
  const std::size_t before = device.live_bytes();
  model.forward(batch.tokens, batch.targets, B, T);
  model.backward();
  return static_cast<double>(device.live_bytes() - before);
}

// What the plan's activation count (training_memory.h) holds beyond what a serial
// model allocates, for a vocabulary that is a multiple of vocab_multiple: the padding
// columns of the logits it allows for (one vocab_multiple per token, fp32, and under
// bf16 the bits of their gradient too), less the one-float loss the model keeps on the
// device, which the plan leaves out.
inline double plan_over_count_bytes(const trainer::GPTConfig& config, trainer::Precision precision, int B, int T) {
  const double bytes_per_column = precision == trainer::Precision::kBf16 ? 6.0 : 4.0;
  return bytes_per_column * B * T * config.vocab_multiple - 4.0;
}

}  // namespace dufu::testing
