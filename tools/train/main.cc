// `train`: the command-line face of the trainer library. Library errors arrive as
// dufu::Error (command-line errors as CLI11's) and end here as one clear line on
// stderr and exit status 1; under
// mpirun the failing rank also stops every other rank (abort_all) instead of leaving
// them waiting in a collective. Exit statuses: 0 done; 1 an error in the input, the
// command line, the files or the machine (dufu::Error, CLI11's, out of memory); 2 an
// exception dufu does not throw (std::exception: "unexpected error"); 3 a broken
// internal invariant (dufu::InternalError, a DUFU_CHECK: "internal error", a bug in
// dufu to report); 130 stopped by a signal after a checkpoint.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "bus_error.h"
#include "commands.h"
#include "dufu/common/atomic_file.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/rank_agreement.h"
#include "flag_names.h"

int main(int argc, char** argv) {
  dufu::tools::report_bus_errors();  // a shard truncated under the run: one line, not "Bus error"
  dufu::ignore_file_size_signal();   // a write past `ulimit -f`: one line, not exit 153
  CLI::App app{
      "train: train GPT models on dataprep's shards.\n"
      "  train CONFIG.toml [key=value ...]       train (or resume the run in run.dir)\n"
      "  train --resume DIR [key=value ...]       resume from a run or checkpoint directory\n"
      "  train plot RUN_DIR [-o loss.png]          plot the loss curves\n"
      "  train generate --checkpoint DIR --prompt TEXT [--tokenizer M.model]\n"
      "  train merge-checkpoint SOURCE DESTINATION  one serial checkpoint from a sharded one\n"
      "  train export-hf CHECKPOINT DIR [--tokenizer M.model]  a directory transformers loads\n"
      "  train plan CONFIG.toml [key=value ...] [--ranks N]  each pipeline stage's memory, without training\n"
      "  train import-hf HF_DIR CHECKPOINT [--tensor-parallel-size N] [--pipeline-parallel-size M]\n"
      "                                            a HuggingFace model as a checkpoint (model.init_from)\n"
      "  train config-reference                    every configuration knob as Markdown\n"
      "  (the tokenizer defaults to the one the checkpoint records; see --tokenizer in each command's --help)"};
  app.set_version_flag("--version", "train 0.1.0");
  dufu::tools::add_plot_command(app);
  dufu::tools::add_generate_command(app);
  dufu::tools::add_merge_command(app);
  dufu::tools::add_export_hf_command(app);
  dufu::tools::add_plan_command(app);
  dufu::tools::add_import_hf_command(app);
  dufu::tools::add_training_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& request) {
    return app.exit(request);
  } catch (const CLI::CallForAllHelp& request) {
    return app.exit(request);
  } catch (const CLI::CallForVersion& request) {
    return app.exit(request);
  } catch (const CLI::RuntimeError& stop) {
    return stop.get_exit_code();  // 130: stopped by a signal after a checkpoint
  } catch (const CLI::ParseError& error) {
    // A bad command line is the user's error like any other: one line, status 1.
    std::fprintf(stderr, "train: error: %s; HINT: train --help lists the commands and options\n", error.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // The library names what did not fit where sizes come from the user; this is
    // what is left.
    std::fprintf(stderr, "train: error: not enough memory\n");
    dufu::abort_all("not enough memory", 1);
    return 1;
  } catch (const dufu::RanksStopped& stopped) {
    // Every rank found the same and stops alike: one of them reports.
    if (stopped.report()) {
      std::fprintf(stderr, "train: error: %s\n", dufu::tools::with_flag_names(stopped.what()).c_str());
    }
    return 1;
  } catch (const dufu::Error& error) {
    std::fprintf(stderr, "train: error: %s\n", dufu::tools::with_flag_names(error.what()).c_str());
    dufu::abort_all(error.what(), 1);
    return 1;
  } catch (const dufu::InternalError& bug) {
    std::fprintf(stderr, "train: internal error: %s\n", bug.what());
    dufu::abort_all(bug.what(), 3);
    return 3;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "train: unexpected error: %s\n", error.what());
    dufu::abort_all(error.what(), 2);
    return 2;
  }
  return 0;
}
