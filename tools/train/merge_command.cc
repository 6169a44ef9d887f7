// `train merge-checkpoint`: the serial checkpoint (model.safetensors in HF's layout,
// optimizer.safetensors) of a tensor-, pipeline- or ZeRO-sharded one, for tools that
// want one file: transformers, `train generate`, a single-process resume.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "dufu/common/error.h"
#include "dufu/common/human_units.h"
#include "dufu/trainer/checkpoint/checkpoint.h"

namespace dufu::tools {
namespace {

struct MergeFlags {
  std::string source;
  std::string destination;
};

void run(const MergeFlags& flags) {
  const auto start = std::chrono::steady_clock::now();
  const auto found = trainer::find_usable_checkpoint(flags.source);
  if (!found) DUFU_FAIL("no checkpoint in '", flags.source, "'; HINT: give a checkpoint or a run directory");
  const trainer::TrainingState state = trainer::read_checkpoint_state(*found);
  const trainer::CheckpointLayout& layout = state.layout;
  std::fprintf(stderr, "checkpoint %s: step %lld, tensor parallel %d, pipeline parallel %d, data parallel %d%s, %zu files\n",
               found->c_str(), static_cast<long long>(state.step), layout.tensor_parallel_size,
               layout.pipeline_parallel_size, layout.data_parallel_size,
               layout.optimizer_sharded ? " (ZeRO-1 optimizer shards)" : "",
               trainer::checkpoint_file_names(layout).size());
  trainer::merge_checkpoint(*found, flags.destination);
  std::uintmax_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(flags.destination)) {
    if (entry.is_regular_file()) bytes += entry.file_size();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("merged into %s (%s in %.1f s): model.safetensors, optimizer.safetensors, state.json, config.toml\n",
              flags.destination.c_str(), human_bytes(static_cast<double>(bytes)).c_str(), seconds);
}

}  // namespace

void add_merge_command(CLI::App& app) {
  auto flags = std::make_shared<MergeFlags>();
  auto* command = app.add_subcommand(
      "merge-checkpoint",
      "Write the single-process checkpoint (model.safetensors in HuggingFace's GPT-2 layout, optimizer.safetensors) "
      "of a tensor-, pipeline- or ZeRO-sharded checkpoint; it resumes and generates like the original");
  command->add_option("SOURCE", flags->source, "Checkpoint directory, or a run directory (its newest)")->required();
  command->add_option("DESTINATION", flags->destination, "New directory for the merged checkpoint")->required();
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
