// `train plan CONFIG.toml [key=value ...] [--ranks N]`: the memory plan of every
// distinct rank of the configuration's layout (one per pipeline stage: the tensor
// ranks of a stage, and its data-parallel replicas, plan alike), computed as the
// trainer computes it at start (training_memory.h) but without starting ranks or
// allocating the model, so that a layout larger than this machine can be sized here.
// Exits with status 1 when a stage does not fit the cap: train.memory_limit when it
// is set (the target machine's memory), else what this machine's device has.
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "stage_plans.h"
#include "dufu/common/config.h"
#include "dufu/common/error.h"
#include "dufu/common/human_units.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt_layout.h"
#include "dufu/trainer/run/training_config.h"
#include "dufu/trainer/run/training_memory.h"

namespace dufu::tools {
namespace {

struct PlanFlags {
  std::vector<std::string> arguments;  // CONFIG.toml, then key=value overrides
  int ranks = 0;                       // the launcher's ranks; 0 = tp x pp (one data-parallel replica)
  bool search = false;                 // every layout of `ranks`, not the configuration's
};

Config plan_config(const PlanFlags& flags) {
  std::vector<std::string> overrides = flags.arguments;
  std::string toml_path;
  if (!overrides.empty() && overrides.front().find('=') == std::string::npos) {
    toml_path = overrides.front();
    overrides.erase(overrides.begin());
  }
  Config config = Config::load(trainer::training_config_schema(), toml_path, overrides);
  // The plan reads no data; the check that a run names its shards is not the plan's.
  if (config.get_string("data.blend").empty()) config.apply_override("data.blend=unread");
  return config;
}

std::string bytes_cell(double bytes) { return bytes > 0.0 ? human_bytes(bytes) : "-"; }

// Why ZeRO-3's model state is more than 1/dp of stage 0's: the shards, then each part
// the model keeps whole.
void print_held_whole(const StagePlan& row, int dp) {
  const trainer::HeldWhole& held = *row.held_whole;
  const double model = row.plan.model();
  std::printf("      model state %s: shards %s (stage 0 holds %s, 1/%d of it %s) + held whole %s\n",
              human_bytes(model).c_str(), human_bytes(model - held.total()).c_str(),
              human_bytes(row.stage0_model_bytes).c_str(), dp, human_bytes(row.stage0_model_bytes / dp).c_str(),
              human_bytes(held.total()).c_str());
  std::printf("      held whole: edges (embeddings, final norm, head) %s of weights and %s of gradients, layer "
              "windows %s of weights and %s of gradients, reduced piece %s\n",
              human_bytes(held.edge_weights).c_str(), human_bytes(held.edge_gradients).c_str(),
              human_bytes(held.layer_weights).c_str(), human_bytes(held.layer_gradients).c_str(),
              human_bytes(held.reduced_piece).c_str());
}

void run(const PlanFlags& flags) {
  const trainer::TrainingOptions options = trainer::training_options(plan_config(flags));
  const int tp = options.tensor_parallel_size;
  const int pp = options.pipeline_parallel_size;
  const int ranks = flags.ranks > 0 ? flags.ranks : tp * pp;
  // The scratch is the device's answer; a CUDA device that cannot run here cannot give it.
  const trainer::DeviceAvailability availability = trainer::device_availability(options.device);
  const trainer::Device* device = availability.available ? &trainer::device_of_kind(options.device) : nullptr;
  const PlanCap cap = plan_cap(options, device);
  if (flags.search) {
    if (!print_layout_search(options, ranks, device, cap) && cap.bytes) {
      DUFU_FAIL("no layout of ", ranks, " ranks fits ", human_bytes(*cap.bytes), " (", cap.source,
                "); HINT: lower train.micro_batch or model.seq_length, use train.precision=bf16, or raise --ranks");
    }
    return;
  }
  if (ranks % (tp * pp) != 0) {
    DUFU_FAIL("--ranks ", ranks, " is not a multiple of dist.tensor_parallel_size (", tp,
              ") x dist.pipeline_parallel_size (", pp, ")");
  }
  const int dp = ranks / (tp * pp);
  const std::vector<StagePlan> plans = stage_plans(options, dp, device);

  std::printf("memory plan: %d rank%s (dp %d x tp %d x pp %d), train.device %s, %s, zero_stage %d, recompute %s, "
              "micro-batch %d x %d tokens, prefetch %d\n",
              ranks, ranks > 1 ? "s" : "", dp, tp, pp, trainer::device_kind_name(options.device),
              trainer::precision_name(options.precision), options.zero_stage,
              trainer::recompute_name(options.recompute), options.micro_batch, options.model.seq_length,
              options.prefetch_batches);
  if (device == nullptr) {
    std::printf("device scratch unknown: train.device %s cannot be opened here (%s); the totals leave it out\n",
                trainer::device_kind_name(options.device), availability.reason.c_str());
  }
  std::printf("cap: %s\n", cap.bytes ? (human_bytes(*cap.bytes) + " (" + cap.source + ")").c_str()
                                     : "unknown (no device to ask; set train.memory_limit)");
  std::printf("%-5s %-7s %-10s %-10s %-10s %-10s %-10s %-11s %-10s %-10s %s\n", "stage", "layers", "parameters",
              "weights", "gradients", "moments", "bf16 copy", "activations", "scratch", "total", "verdict");
  std::vector<int> refused;
  for (int index = 0; index < pp; ++index) {
    const StagePlan& row = plans[static_cast<std::size_t>(index)];
    const trainer::MemoryPlan& plan = row.plan;
    std::string verdict;
    if (!cap.bytes) {
      verdict = "unknown";
    } else if (plan.total() <= *cap.bytes) {
      verdict = device != nullptr ? "fits" : "fits without the scratch";
    } else {
      verdict = "does not fit (needs " + human_bytes(plan.total()) + ", cap " + human_bytes(*cap.bytes) + ")";
      refused.push_back(index);
    }
    std::printf("%-5d %-7d %-10s %-10s %-10s %-10s %-10s %-11s %-10s %-10s %s\n", index, row.layers,
                human_count(row.parameters).c_str(), human_bytes(plan.weights).c_str(),
                human_bytes(plan.gradients).c_str(), human_bytes(plan.moments).c_str(),
                bytes_cell(plan.working_copy).c_str(), human_bytes(plan.activations).c_str(),
                device ? bytes_cell(plan.scratch).c_str() : "unknown", human_bytes(plan.total()).c_str(),
                verdict.c_str());
    if (row.held_whole) print_held_whole(row, dp);
    if (plan.host > 0.0) {
      std::printf("      optim.offload = cpu: %s of fp32 masters and AdamW moments in host memory\n",
                  human_bytes(plan.host).c_str());
    }
    if (plan.save_staging > 0.0) {
      std::printf("      checkpoint save: %s host copy of the weights and AdamW moments %s; host memory at the peak %s\n",
                  human_bytes(plan.save_staging).c_str(),
                  plan.device_is_host ? "(in the total: the CPU device's memory is host memory)"
                                      : "(beside the device's total)",
                  human_bytes(plan.host_total()).c_str());
    }
  }
  std::fflush(stdout);
  if (!refused.empty()) {
    std::string stages;
    for (const int index : refused) stages += (stages.empty() ? "" : ", ") + std::to_string(index);
    DUFU_FAIL("the memory plan of pipeline stage", refused.size() > 1 ? "s " : " ", stages, " does not fit ",
              human_bytes(*cap.bytes), " (", cap.source, "); HINT: lower train.micro_batch or model.seq_length, set "
              "train.recompute=full or dist.zero_stage=1, 2 or 3, or raise dist.tensor_parallel_size, "
              "dist.pipeline_parallel_size or --ranks; `train plan --search` lists the layouts that fit");
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  auto* command = app.add_subcommand(
      "plan",
      "Print the memory plan of every pipeline stage of a configuration's layout (weights, gradients, AdamW "
      "moments, bf16 working copy, activations, device scratch) against train.memory_limit or this machine's "
      "device, without training; exit status 1 when a stage does not fit");
  command->add_option("config_and_overrides", flags->arguments, "CONFIG.toml, then key=value overrides")->required();
  command->add_option("--ranks", flags->ranks,
                      "Ranks the run would start (data parallel = ranks / (tp x pp)); default tp x pp")
      ->check(whole_number_in(1, std::numeric_limits<int>::max()));
  command->add_flag("--search", flags->search,
                    "List every layout of --ranks (tensor and pipeline parallel sizes, ZeRO stage, recomputation; "
                    "the rest as configured) with its largest stage's memory, cheapest first, and the cheapest that "
                    "fits; exit status 1 when none does");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
