// The subcommands of `train`; each adds itself to the CLI11 app and runs from its
// callback. Library errors propagate as dufu::Error to main().
#pragma once

#include <CLI/CLI.hpp>

namespace dufu::tools {

// The default command: `train CONFIG.toml [key=value ...] [--resume DIR]`, set on
// the top-level app itself.
void add_training_command(CLI::App& app);
// `train plot RUN_DIR|metrics.jsonl [-o loss.png]`: the loss curves with gnuplot.
void add_plot_command(CLI::App& app);
// `train generate --checkpoint DIR --model M.model --prompt TEXT`: sampled text.
void add_generate_command(CLI::App& app);
// `train merge-checkpoint SOURCE DESTINATION`: a sharded checkpoint as a serial one.
void add_merge_command(CLI::App& app);
// `train export-hf CHECKPOINT DIR --tokenizer-model M`: a HuggingFace model directory.
void add_export_hf_command(CLI::App& app);
// `train plan CONFIG.toml [key=value ...] [--ranks N]`: each pipeline stage's memory plan.
void add_plan_command(CLI::App& app);
void add_import_hf_command(CLI::App& app);

}  // namespace dufu::tools
