// Each `dataprep` subcommand registers its flags and its action on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace dufu::tools {

void add_preprocess_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_merge_command(CLI::App& app);
void add_train_tokenizer_command(CLI::App& app);
void add_build_index_command(CLI::App& app);
void add_sample_command(CLI::App& app);

}  // namespace dufu::tools
