// `dataprep`: the command-line face of the dataprep library. Library errors arrive
// as dufu::Error and end here as one clear line on stderr and exit status 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.h"
#include "dufu/common/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "dataprep: tokenize corpora into indexed binary shards (Megatron-LM / fairseq "
      "compatible) and inspect, merge and train tokenizers for them."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dataprep 0.1.0");
  dufu::tools::add_preprocess_command(app);
  dufu::tools::add_inspect_command(app);
  dufu::tools::add_merge_command(app);
  dufu::tools::add_train_tokenizer_command(app);
  dufu::tools::add_build_index_command(app);
  dufu::tools::add_sample_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const dufu::Error& error) {
    std::fprintf(stderr, "dataprep: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dataprep: unexpected error: %s\n", error.what());
    return 2;
  }
  return 0;
}
