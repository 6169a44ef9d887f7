// `dataprep build-index`: build a blend's index caches ahead of training, so no rank
// waits on index building at start-up.
#include <chrono>
#include <cstdio>

#include "blend_flags.h"
#include "commands.h"
#include "dufu/dataprep/blend_builder.h"

namespace dufu::tools {

void add_build_index_command(CLI::App& app) {
  auto flags = std::make_shared<BlendFlags>();
  auto* command = app.add_subcommand(
      "build-index", "Prebuild the document/sample/shuffle and blend index caches for a blend");
  add_blend_flags(command, *flags);
  command->callback([flags] {
    const auto start = std::chrono::steady_clock::now();
    const auto built = dataprep::build_blend(flags->to_config());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("build-index: %llu samples of %llu tokens in %.2f s\n",
                static_cast<unsigned long long>(built.dataset->size()),
                static_cast<unsigned long long>(built.dataset->sample_length()), seconds);
    for (std::size_t i = 0; i < built.parts.size(); ++i) {
      std::printf("  weight %.4f  %s\n", built.weights[i], built.parts[i]->describe().c_str());
    }
    for (const auto& path : built.cache_paths) std::printf("  cache %s\n", path.c_str());
  });
}

}  // namespace dufu::tools
