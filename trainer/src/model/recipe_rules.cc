#include "dufu/trainer/model/recipe_rules.h"

#include "dufu/common/error.h"

namespace dufu::trainer {

std::string recipe_refusal(const RecipeChoices& choices) {
  if (choices.attention_products == Precision::kBf16 && choices.precision != Precision::kBf16) {
    return "train.attention_products = bf16 needs train.precision = bf16; HINT: set train.precision = \"bf16\" "
           "or leave train.attention_products at \"fp32\"";
  }
  if (choices.reduce_each_micro_batch && choices.zero_stage != 0) {
    return "dist.reduce_each_micro_batch is stage 0's option (dist.zero_stage = 2 and 3 always reduce each "
           "micro-batch, and stage 1 reduce-scatters the whole gradient once); HINT: set dist.zero_stage = 0";
  }
  if (!choices.optimizer_offload) return {};
  if (choices.zero_stage == 3) {
    return "optim.offload = cpu with dist.zero_stage = 3 is not supported yet: the offloaded masters would be the "
           "parameter shard's; HINT: use dist.zero_stage = 2 with offload, or stage 3 without";
  }
  if (choices.device_memory_is_host) {
    return "optim.offload = cpu with train.device = cpu: the device's memory is the host's already, there is "
           "nothing to move; HINT: use optim.offload = none";
  }
  if (choices.precision != Precision::kBf16) {
    return "optim.offload = cpu needs train.precision = bf16: under fp32 the device would need the fp32 weights, "
           "which are what offload moves to the host; HINT: set train.precision = bf16, or optim.offload = none";
  }
  return {};
}

void check_recipe(const RecipeChoices& choices) {
  if (std::string refusal = recipe_refusal(choices); !refusal.empty()) throw Error(std::move(refusal));
}

}  // namespace dufu::trainer
