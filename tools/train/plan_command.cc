// `train plan CONFIG.toml [key=value ...] [--ranks N]`: the memory plan of every
// distinct rank of the configuration's layout (one per pipeline stage: the tensor
// ranks of a stage, and its data-parallel replicas, plan alike), computed as the
// trainer computes it at start (training_memory.h) but without starting ranks or
// allocating the model, so that a layout larger than this machine can be sized here.
// Exits with status 1 when a stage does not fit the cap: train.memory_limit when it
// is set (the target machine's memory), else what this machine's device has.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
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

void run(const PlanFlags& flags) {
  const trainer::TrainingOptions options = trainer::training_options(plan_config(flags));
  const int tp = options.tensor_parallel_size;
  const int pp = options.pipeline_parallel_size;
  const int ranks = flags.ranks > 0 ? flags.ranks : tp * pp;
  if (ranks % (tp * pp) != 0) {
    DUFU_FAIL("--ranks ", ranks, " is not a multiple of dist.tensor_parallel_size (", tp,
              ") x dist.pipeline_parallel_size (", pp, ")");
  }
  const int dp = ranks / (tp * pp);
  // Refuses a tp that does not divide the heads, the K/V heads or the MLP, as training would.
  (void)trainer::gpt_parameter_layout(options.model, tp);
  trainer::check_global_batch(options, dp);
  const std::vector<int> split = trainer::pipeline_layer_split(options.model.n_layer, pp, options.pipeline_num_layers);

  // The scratch is the device's answer; a CUDA device that cannot run here cannot give it.
  const trainer::DeviceAvailability availability = trainer::device_availability(options.device);
  const trainer::Device* device = availability.available ? &trainer::device_of_kind(options.device) : nullptr;
  std::optional<double> cap;
  std::string cap_source;
  if (options.memory_limit_bytes > 0.0) {
    cap = options.memory_limit_bytes;
    cap_source = "train.memory_limit";
  } else if (device != nullptr) {
    cap = device->memory_capacity_bytes();
    cap_source = device->describe();
  }

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
  std::printf("cap: %s\n", cap ? (human_bytes(*cap) + " (" + cap_source + ")").c_str()
                               : "unknown (no device to ask; set train.memory_limit)");
  std::printf("%-5s %-7s %-10s %-10s %-10s %-10s %-10s %-11s %-10s %-10s %s\n", "stage", "layers", "parameters",
              "weights", "gradients", "moments", "bf16 copy", "activations", "scratch", "total", "verdict");
  std::vector<int> refused;
  for (int index = 0; index < pp; ++index) {
    const trainer::PipelineStage stage = pp > 1 ? trainer::pipeline_stage(split, index) : trainer::PipelineStage{};
    const int slots = trainer::pipeline_slots(stage);
    const double parameters = trainer::rank_parameter_count(options.model, tp, stage);
    trainer::MemoryPlan plan;
    if (device != nullptr) {
      plan = trainer::rank_memory_plan(options.model, options.micro_batch, options.model.seq_length, tp, dp, stage,
                                       slots, options.prefetch_batches, options.precision, options.zero_stage, *device,
                                       options.recompute,
                                       static_cast<double>(trainer::bucket_elements_for(options.dp_bucket_mb)),
                                       options.overlap_reduction);
    } else {
      plan = trainer::memory_plan(
          parameters, dp, options.zero_stage, options.precision == trainer::Precision::kBf16,
          trainer::activation_bytes(options.model, options.micro_batch, options.model.seq_length, tp, stage, slots,
                                    options.prefetch_batches, options.precision, options.recompute),
          trainer::rank_gradient_floats(options.model, tp, stage, dp, options.zero_stage, options.overlap_reduction),
          static_cast<double>(trainer::bucket_elements_for(options.dp_bucket_mb)),
          trainer::rank_weight_floats(options.model, tp, stage, dp, options.zero_stage));
    }
    if (options.optimizer_offload) trainer::offload_to_host(plan);
    std::string verdict;
    if (!cap) {
      verdict = "unknown";
    } else if (plan.total() <= *cap) {
      verdict = device != nullptr ? "fits" : "fits without the scratch";
    } else {
      verdict = "does not fit (needs " + human_bytes(plan.total()) + ", cap " + human_bytes(*cap) + ")";
      refused.push_back(index);
    }
    std::printf("%-5d %-7d %-10s %-10s %-10s %-10s %-10s %-11s %-10s %-10s %s\n", index, split[index],
                human_count(parameters).c_str(), human_bytes(plan.weights).c_str(), human_bytes(plan.gradients).c_str(),
                human_bytes(plan.moments).c_str(), bytes_cell(plan.working_copy).c_str(),
                human_bytes(plan.activations).c_str(), device ? bytes_cell(plan.scratch).c_str() : "unknown",
                human_bytes(plan.total()).c_str(), verdict.c_str());
    if (plan.host > 0.0) {
      std::printf("      optim.offload = cpu: %s of fp32 masters and AdamW moments in host memory\n",
                  human_bytes(plan.host).c_str());
    }
  }
  std::fflush(stdout);
  if (!refused.empty()) {
    std::string stages;
    for (const int index : refused) stages += (stages.empty() ? "" : ", ") + std::to_string(index);
    DUFU_FAIL("the memory plan of pipeline stage", refused.size() > 1 ? "s " : " ", stages, " does not fit ",
              human_bytes(*cap), " (", cap_source, "); HINT: lower train.micro_batch or model.seq_length, set "
              "train.recompute=full or dist.zero_stage=1, 2 or 3, or raise dist.tensor_parallel_size, "
              "dist.pipeline_parallel_size or --ranks");
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
      ->check(CLI::PositiveNumber);
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
