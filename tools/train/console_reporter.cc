// The train tool's console reporter and stop signals (see console_reporter.h).
#include "console_reporter.h"

#include <csignal>
#include <cstdio>

#include "dufu/common/error.h"
#include "dufu/common/human_units.h"
#include "dufu/common/log.h"

namespace dufu::tools {

namespace {

std::atomic<bool> g_stop_requested{false};

// SIGTERM stays caught however often it comes: `timeout` sends it to the process and
// then to its group, Slurm to every task, a user again when nothing seems to happen;
// each must leave the one orderly stop (and its checkpoint) to finish. Ctrl-C twice
// means "stop now", so the second SIGINT takes the default action.
extern "C" void request_stop(int signal_number) {
  g_stop_requested.store(true);
  if (signal_number == SIGINT) std::signal(SIGINT, SIG_DFL);
}

// Installs `handler` for `signal_number` (restarting interrupted system calls, so a
// checkpoint's writes are not cut short) and returns the previous one.
struct sigaction install(int signal_number, void (*handler)(int)) {
  struct sigaction action {};
  struct sigaction previous {};
  action.sa_handler = handler;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(signal_number, &action, &previous);
  return previous;
}

std::string format_rate(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", value);
  return text;
}

}  // namespace

void ConsoleReporter::effective_config(const std::string& toml) {
  std::printf("# effective configuration\n%s\n", toml.c_str());
  std::fflush(stdout);
}

void ConsoleReporter::layout(const trainer::LayoutReport& layout) {
  std::printf("layout: %s\n", layout.topology.c_str());
  for (const trainer::RankLayout& r : layout.ranks) {
    std::printf("  rank %d: tp %d, dp %d, pp %d | layers %d-%d%s%s | heads %d-%d | vocab rows %d-%d\n", r.rank,
                r.tp_rank, r.dp_rank, r.pp_rank, r.first_layer, r.last_layer, r.embeddings ? " + embeddings" : "",
                r.head ? " + ln_f, head" : "", r.first_head, r.last_head, r.first_vocab_row, r.last_vocab_row);
  }
  std::fflush(stdout);
}

void ConsoleReporter::nothing_to_do(std::int64_t step, std::int64_t steps) {
  std::printf("nothing to do: the run is at step %lld of %lld\n", static_cast<long long>(step),
              static_cast<long long>(steps));
}

void ConsoleReporter::run_summary(const trainer::RunSummary& s) {
  const std::string kv_heads = s.n_kv_head != s.n_head ? str_cat(" (", s.n_kv_head, " K/V)") : std::string();
  std::printf("model: %s %s parameters, %d layers, d_model %d, %d heads%s, vocab %d (padded %d), seq %d\n",
              s.arch.c_str(), human_count(static_cast<double>(s.parameters)).c_str(), s.n_layer, s.d_model, s.n_head,
              kv_heads.c_str(), s.vocab_size, s.padded_vocab_size, s.seq_length);
  std::printf("batch: %d x %d x %d samples (micro-batch x accumulation x data-parallel) = %.0f tokens per step; "
              "%d threads per rank; sgemm peak %.1f GFLOP/s per rank; %.3f GFLOP per token\n",
              s.micro_batch, s.accumulation, s.data_parallel_size, s.tokens_per_step, s.threads, s.peak_flops / 1e9,
              s.flops_per_token / 1e9);
  std::fflush(stdout);
}

void ConsoleReporter::step(const trainer::StepReport& r) {
  if (!r.log_due) return;
  const std::string comm = r.world_size > 1 ? str_cat(" | comm ", human_bytes(static_cast<double>(r.comm_bytes)), " ",
                                                      format_rate(100.0 * r.comm_seconds / r.seconds), "%")
                                            : "";
  std::printf("step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | %.1f ms | MFU %.1f%%%s%s\n",
              static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss, r.lr, r.grad_norm,
              format_rate(r.tokens_per_second).c_str(), r.seconds * 1e3, 100.0 * r.mfu, comm.c_str(),
              r.skipped ? " | skipped" : "");
  std::fflush(stdout);
}

void ConsoleReporter::evaluation(const trainer::EvalReport& r) {
  std::printf("eval at step %lld | val loss %.4f | val perplexity %.2f\n", static_cast<long long>(r.step), r.val_loss,
              r.val_perplexity);
  std::fflush(stdout);
}

void ConsoleReporter::checkpoint_saved(const std::string& path) {
  std::printf("checkpoint: %s\n", path.c_str());
  std::fflush(stdout);
}

void ConsoleReporter::stopped(trainer::StopReason reason, std::int64_t step) {
  if (reason == trainer::StopReason::kExitAtStep) {
    std::printf("stopping at step %lld as train.exit_at_step says; resume with train.exit_at_step=0\n",
                static_cast<long long>(step));
  } else {
    std::printf("stopped by a signal at step %lld; resume with the same command\n", static_cast<long long>(step));
  }
  std::fflush(stdout);
}

void ConsoleReporter::warning(const std::string& message) { DUFU_LOG_WARN("train", message); }

StopSignals::StopSignals() {
  g_stop_requested.store(false);
  previous_int_ = install(SIGINT, request_stop);
  previous_term_ = install(SIGTERM, request_stop);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &previous_int_, nullptr);
  // After a stop the process is on its way out with the stop's exit status: a SIGTERM
  // now must not turn that into a kill by the signal.
  if (g_stop_requested.load()) {
    install(SIGTERM, SIG_IGN);
  } else {
    ::sigaction(SIGTERM, &previous_term_, nullptr);
  }
}

const std::atomic<bool>& stop_requested() { return g_stop_requested; }

}  // namespace dufu::tools
