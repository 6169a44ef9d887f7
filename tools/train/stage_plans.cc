// Memory plans per stage and the search over layouts (see stage_plans.h).
#include "stage_plans.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "dufu/common/error.h"
#include "dufu/common/human_units.h"
#include "dufu/trainer/model/gpt_layout.h"
#include "dufu/trainer/model/zero_stage.h"

namespace dufu::tools {

std::vector<StagePlan> stage_plans(const trainer::TrainingOptions& options, int data_parallel,
                                   const trainer::Device* device) {
  const int tp = options.tensor_parallel_size;
  const int pp = options.pipeline_parallel_size;
  // Refuses a tp that does not divide the heads, the K/V heads or the MLP, as training would.
  (void)trainer::gpt_parameter_layout(options.model, tp);
  trainer::check_global_batch(options, data_parallel);
  const std::vector<int> split = trainer::pipeline_layer_split(options.model.n_layer, pp, options.pipeline_num_layers);
  const double bucket = static_cast<double>(trainer::bucket_elements_for(options.dp_bucket_mb));
  std::vector<StagePlan> plans;
  for (int index = 0; index < pp; ++index) {
    const trainer::PipelineStage stage = pp > 1 ? trainer::pipeline_stage(split, index) : trainer::PipelineStage{};
    const int slots = trainer::pipeline_slots(stage);
    StagePlan row;
    row.layers = split[static_cast<std::size_t>(index)];
    row.parameters = trainer::rank_parameter_count(options.model, tp, stage);
    if (device != nullptr) {
      row.plan = trainer::rank_memory_plan(options.model, options.micro_batch, options.model.seq_length, tp,
                                           data_parallel, stage, slots, options.prefetch_batches, options.precision,
                                           options.zero_stage, *device, options.recompute, bucket,
                                           options.overlap_reduction);
    } else {
      row.plan = trainer::memory_plan(
          row.parameters, data_parallel, options.zero_stage, options.precision == trainer::Precision::kBf16,
          trainer::activation_bytes(options.model, options.micro_batch, options.model.seq_length, tp, stage, slots,
                                    options.prefetch_batches, options.precision, options.recompute),
          trainer::rank_gradient_floats(options.model, tp, stage, data_parallel, options.zero_stage,
                                        options.overlap_reduction),
          bucket, trainer::rank_weight_floats(options.model, tp, stage, data_parallel, options.zero_stage));
      // A device that cannot be opened here is not the CPU: the save's copy is beside it.
      row.plan.save_staging =
          trainer::checkpoint_save_bytes(options.model, tp, stage, data_parallel, options.zero_stage);
    }
    if (options.optimizer_offload) trainer::offload_to_host(row.plan);
    if (trainer::ZeroStage(options.zero_stage, data_parallel).shards_parameters()) {
      row.held_whole = trainer::zero3_held_whole(options.model, tp, stage, data_parallel, options.precision,
                                                 options.overlap_reduction, bucket);
      row.stage0_model_bytes =
          trainer::memory_plan(row.parameters, data_parallel, 0, options.precision == trainer::Precision::kBf16, 0.0)
              .model();
    }
    plans.push_back(row);
  }
  return plans;
}

PlanCap plan_cap(const trainer::TrainingOptions& options, const trainer::Device* device) {
  if (options.memory_limit_bytes > 0.0) return {options.memory_limit_bytes, "train.memory_limit"};
  if (device != nullptr) return {device->memory_capacity_bytes(), device->describe()};
  return {};
}

namespace {

struct Candidate {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int zero_stage = 0;
  trainer::Recompute recompute = trainer::Recompute::kNone;
  double largest = 0.0;  // the largest stage's total
  // The order of what each choice adds to a step: recomputation adds compute on every
  // rank (full: about one more forward), model parallelism adds communication inside
  // every layer (tp) or a pipeline bubble (pp), a higher ZeRO stage adds data-parallel
  // traffic once per step (none from 0 to 1, stage 3 half again stage 0's).
  auto cost() const { return std::tuple(static_cast<int>(recompute), tp * pp, zero_stage, pp); }
};

std::vector<Candidate> candidates(const trainer::TrainingOptions& options, int ranks, const trainer::Device* device) {
  std::vector<Candidate> found;
  for (int tp = 1; tp <= ranks; ++tp) {
    for (int pp = 1; tp * pp <= ranks; ++pp) {
      if (ranks % (tp * pp) != 0) continue;
      const int dp = ranks / (tp * pp);
      for (int zero_stage = 0; zero_stage <= (dp > 1 ? 3 : 0); ++zero_stage) {
        for (const trainer::Recompute recompute :
             {trainer::Recompute::kNone, trainer::Recompute::kSelective, trainer::Recompute::kFull}) {
          trainer::TrainingOptions layout = options;
          layout.tensor_parallel_size = tp;
          layout.pipeline_parallel_size = pp;
          layout.zero_stage = zero_stage;
          layout.recompute = recompute;
          // The configuration's split of the layers is for its own number of stages.
          if (static_cast<int>(layout.pipeline_num_layers.size()) != pp) layout.pipeline_num_layers.clear();
          if (zero_stage != 0) layout.reduce_each_micro_batch = false;
          if (!trainer::recipe_refusal(trainer::recipe_choices(layout)).empty()) continue;  // as training refuses
          Candidate candidate{tp, pp, dp, zero_stage, recompute};
          try {
            for (const StagePlan& stage : stage_plans(layout, dp, device)) {
              candidate.largest = std::max(candidate.largest, stage.plan.total());
            }
          } catch (const Error&) {
            continue;  // a layout training refuses for this model or batch
          }
          found.push_back(candidate);
        }
      }
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Candidate& a, const Candidate& b) { return a.cost() < b.cost(); });
  return found;
}

}  // namespace

bool print_layout_search(const trainer::TrainingOptions& options, int ranks, const trainer::Device* device,
                         const PlanCap& cap) {
  const std::vector<Candidate> found = candidates(options, ranks, device);
  if (found.empty()) {
    DUFU_FAIL("no layout of ", ranks, " rank", ranks > 1 ? "s" : "", " can train this model: tp must divide the ",
              "heads, pp must not exceed the layers, and train.global_batch must split over the replicas");
  }
  std::printf("layouts of %d rank%s, cheapest first: no recomputation before selective before full, then fewer "
              "model-parallel ranks (tp x pp), then the lower ZeRO stage, then fewer pipeline stages\n",
              ranks, ranks > 1 ? "s" : "");
  std::printf("cap: %s\n", cap.bytes ? (human_bytes(*cap.bytes) + " (" + cap.source + ")").c_str()
                                     : "unknown (no device to ask; set train.memory_limit)");
  std::printf("%-4s %-4s %-4s %-5s %-10s %-14s %s\n", "tp", "pp", "dp", "zero", "recompute", "largest stage",
              "verdict");
  const Candidate* cheapest = nullptr;
  for (const Candidate& candidate : found) {
    const bool fits = cap.bytes && candidate.largest <= *cap.bytes;
    if (fits && cheapest == nullptr) cheapest = &candidate;
    std::printf("%-4d %-4d %-4d %-5d %-10s %-14s %s\n", candidate.tp, candidate.pp, candidate.dp,
                candidate.zero_stage, trainer::recompute_name(candidate.recompute),
                human_bytes(candidate.largest).c_str(), !cap.bytes ? "unknown" : (fits ? "fits" : "does not fit"));
  }
  if (device == nullptr) std::printf("(the totals leave out the device's scratch: no device to ask here)\n");
  if (cheapest != nullptr) {
    std::printf("cheapest that fits: dist.tensor_parallel_size=%d dist.pipeline_parallel_size=%d dist.zero_stage=%d "
                "train.recompute=%s\n",
                cheapest->tp, cheapest->pp, cheapest->zero_stage, trainer::recompute_name(cheapest->recompute));
  } else if (cap.bytes) {
    std::printf("no layout of %d rank%s fits %s\n", ranks, ranks > 1 ? "s" : "", human_bytes(*cap.bytes).c_str());
  }
  std::fflush(stdout);
  return cheapest != nullptr;
}

}  // namespace dufu::tools
