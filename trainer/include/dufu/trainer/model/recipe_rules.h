// The rule book: the combinations of a run's recipe and layout that training refuses,
// each rule and its one-line message written here once. The configuration asks it
// before any rank starts, the model again when a library caller sets its recipe
// without a configuration, and `train plan --search` skips the layouts it refuses,
// so the four can never disagree on a rule or its words.
#pragma once

#include <string>

#include "dufu/trainer/model/gpt_recipe.h"

namespace dufu::trainer {

struct RecipeChoices {
  Precision precision = Precision::kFp32;           // train.precision
  Precision attention_products = Precision::kFp32;  // train.attention_products
  bool optimizer_offload = false;                   // optim.offload = cpu
  int zero_stage = 0;                               // dist.zero_stage (3: parameters sharded)
  bool device_memory_is_host = false;               // train.device = cpu: the device's memory is the host's
  bool reduce_each_micro_batch = false;             // dist.reduce_each_micro_batch
};

// The refusal of the first rule `choices` break, one line naming the knobs, with a
// HINT; empty when every rule holds.
std::string recipe_refusal(const RecipeChoices& choices);

// Throws dufu::Error with recipe_refusal's line unless every rule holds.
void check_recipe(const RecipeChoices& choices);

}  // namespace dufu::trainer
