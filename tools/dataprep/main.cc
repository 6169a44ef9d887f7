// `dataprep`: the command-line face of the dataprep library. Every error a user can
// cause (a bad flag, a bad file, a size that does not fit in memory) ends here as one
// line on stderr and exit status 1 (a write past `ulimit -f` too); temporaries are
// removed on SIGINT, SIGTERM and SIGHUP as well. Under mpirun one rank's error stops
// every rank. The library's messages name options (`workers`); this one says the
// flags (--workers: flag_names.h). Exit status: 0 done, 1 an error (of input, files,
// memory or flags), 3 an internal error (a failed DUFU_CHECK: a bug in dufu).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "commands.h"
#include "dufu/common/atomic_file.h"
#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/rank_agreement.h"
#include "flag_names.h"

namespace {

// One line: CLI11 and some library messages span several.
std::string one_line(std::string message) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  for (char& c : message) {
    if (c == '\n') c = ' ';
  }
  return message;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "dataprep: error: %s\n", one_line(message).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  dufu::install_cleanup_signal_handlers();
  dufu::ignore_file_size_signal();
  CLI::App app{
      "dataprep: tokenize corpora into indexed binary shards (Megatron-LM's layouts, or fairseq's "
      "with preprocess --layout fairseq) and inspect, merge and train tokenizers for them."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dataprep 0.1.0");
  dufu::tools::add_preprocess_command(app);
  dufu::tools::add_inspect_command(app);
  dufu::tools::add_merge_command(app);
  dufu::tools::add_train_tokenizer_command(app);
  dufu::tools::add_build_index_command(app);
  dufu::tools::add_sample_command(app);
  // CLI11 only says "A subcommand is required" for a mistyped one.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* command : app.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || command->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + command->get_name();
    }
    if (!known) return fail(std::string("unknown command '") + argv[1] + "'; the commands are " + names);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version are "errors" with exit code 0: let CLI11 print them.
    if (error.get_exit_code() == 0) return app.exit(error);
    return fail(std::string(error.what()) + " (see --help)");
  } catch (const dufu::RanksStopped& stopped) {
    // Every rank of a divided job agreed to stop and cleaned up: one of them reports.
    if (stopped.report()) fail(dufu::tools::with_flag_names(stopped.what()));
    return 1;
  } catch (const dufu::Error& error) {
    // Under mpirun an error of this rank alone also ends the others (they may be
    // waiting for it); without MPI abort_all does nothing.
    const std::string message = dufu::tools::with_flag_names(error.what());
    fail(message);
    dufu::abort_all(message, 1);
    return 1;
  } catch (const dufu::InternalError& bug) {
    fail(std::string("internal error: ") + bug.what());
    dufu::abort_all(bug.what(), 3);
    return 3;
  } catch (const std::bad_alloc&) {
    fail("not enough memory (an allocation failed); lower the sizes asked for, or --workers");
    dufu::abort_all("not enough memory", 1);
    return 1;
  } catch (const std::exception& error) {
    fail(std::string("unexpected error: ") + error.what());
    dufu::abort_all(error.what(), 1);
    return 1;
  }
  return 0;
}
