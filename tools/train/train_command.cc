// `train CONFIG.toml [key=value ...]`, `train --resume DIR [key=value ...]`: the
// configuration comes from the file (or, when resuming without one, the
// checkpoint's saved configuration), then the overrides in order.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "console_reporter.h"
#include "dufu/common/config.h"
#include "dufu/common/error.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/run/trainer.h"
#include "dufu/trainer/run/training_config.h"

namespace dufu::tools {

namespace {

struct TrainingFlags {
  std::vector<std::string> arguments;  // CONFIG.toml and/or key=value overrides
  std::string resume;
  bool print_config = false;
};

// The first argument is the config file unless it is an override (has '='); without
// a file the overrides apply to the defaults.
Config build_config(const TrainingFlags& flags) {
  std::string toml_path;
  std::vector<std::string> overrides = flags.arguments;
  if (!overrides.empty() && overrides.front().find('=') == std::string::npos) {
    toml_path = overrides.front();
    overrides.erase(overrides.begin());
  }
  for (const std::string& argument : overrides) {
    if (argument.find('=') == std::string::npos) {
      DUFU_FAIL("'", argument, "' is neither the config file (which comes first) nor a key=value override");
    }
  }
  Config config(trainer::training_config_schema());
  if (!toml_path.empty()) {
    config.load_file(toml_path);
  } else if (!flags.resume.empty()) {
    // Resuming without a config file: continue with the run's own configuration.
    const auto checkpoint = trainer::find_usable_checkpoint(flags.resume);
    if (!checkpoint) DUFU_FAIL("--resume ", flags.resume, ": no checkpoint there");
    config.load_toml(trainer::read_checkpoint_state(*checkpoint).config_toml, *checkpoint + "/state.json");
  } else if (!flags.print_config && overrides.empty()) {
    DUFU_FAIL("no configuration: give a TOML file (train CONFIG.toml [key=value ...]), key=value overrides "
              "of the defaults, or --resume DIR");
  }
  config.apply_overrides(overrides);
  return config;
}

// Trains, printing to stdout; SIGINT and SIGTERM stop the run after a checkpoint (one
// that comes while the run is set up, after its first step). Returns whether it was
// stopped so.
bool train(const Config& config, const std::string& resume) {
  const StopSignals stop_signals;
  ConsoleReporter reporter;
  trainer::Trainer trainer(config, resume, reporter, &stop_requested());
  if (!trainer.setup()) return false;
  return trainer.run().interrupted;
}

}  // namespace

void add_training_command(CLI::App& app) {
  auto flags = std::make_shared<TrainingFlags>();
  app.add_option("config_and_overrides", flags->arguments,
                 "CONFIG.toml, then key=value overrides (e.g. model.n_layer=4 optim.lr=3e-4 "
                 "data.blend=\"0.7 A 0.3 B\")");
  app.add_option("--resume", flags->resume,
                 "Resume from this run directory (its newest usable checkpoint) or checkpoint directory; "
                 "without it a run resumes from run.dir by itself");
  app.add_flag("--print-config", flags->print_config, "Print the effective configuration and exit");
  app.footer("Configuration knobs (TOML tables and keys; override any with key=value):\n\n" +
             trainer::training_config_schema().help_text());
  // Writes docs/config-reference.md (training_knobs_test fails when it is stale).
  app.add_subcommand("config-reference", "Print every configuration knob as Markdown (docs/config-reference.md)")
      ->callback([] { std::printf("%s", trainer::training_config_reference().c_str()); });
  app.callback([&app, flags]() {
    if (app.get_subcommands().size() > 0) return;  // plot or generate ran instead
    Config config = build_config(*flags);
    if (flags->print_config) {
      std::printf("%s", config.to_toml().c_str());
      return;
    }
    if (train(config, flags->resume)) throw CLI::RuntimeError(130);
  });
}

}  // namespace dufu::tools
