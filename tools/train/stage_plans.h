// The memory plan of each pipeline stage of a layout, as the trainer computes it at
// start (training_memory.h), without starting ranks or allocating a model: what
// `train plan` prints for one layout and what `train plan --search` compares across
// layouts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "dufu/trainer/run/training_config.h"
#include "dufu/trainer/run/training_memory.h"

namespace dufu::tools {

struct StagePlan {
  int layers = 0;
  double parameters = 0.0;
  trainer::MemoryPlan plan;
  // Under ZeRO-3 over more than one data-parallel rank: what the rank holds whole
  // beside its shards, and stage 0's model state for the same layout.
  std::optional<trainer::HeldWhole> held_whole;
  double stage0_model_bytes = 0.0;
};

// One per pipeline stage of `options`' layout (its tp, pp, ZeRO stage, recompute) with
// `data_parallel` replicas. `device` gives the scratch; without one the plans leave it
// out. Throws dufu::Error for a layout training would refuse (a tp that does not divide
// the heads, more stages than layers, a global batch the replicas cannot share).
std::vector<StagePlan> stage_plans(const trainer::TrainingOptions& options, int data_parallel,
                                   const trainer::Device* device);

// The cap a plan is held to: train.memory_limit when set, else what `device` has
// (unknown without one), with where it comes from.
struct PlanCap {
  std::optional<double> bytes;
  std::string source;
};
PlanCap plan_cap(const trainer::TrainingOptions& options, const trainer::Device* device);

// `train plan --search`: every layout of `ranks` ranks (tp, pp, ZeRO stage, recompute;
// the rest as `options` says) with its largest stage's total, cheapest first, and the
// first that fits the cap. Returns whether one fits.
bool print_layout_search(const trainer::TrainingOptions& options, int ranks, const trainer::Device* device,
                         const PlanCap& cap);

}  // namespace dufu::tools
