// The train tool's face of a training run: the reports of the Trainer as lines on
// stdout (the effective configuration, the layout, the model and batch, a line per
// log interval, evaluations, checkpoints, why the run stopped), warnings through the
// log on stderr; and the SIGINT/SIGTERM handlers that ask the run to stop.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "dufu/trainer/run/training_reporter.h"

namespace dufu::tools {

class ConsoleReporter final : public trainer::TrainingReporter {
 public:
  void effective_config(const std::string& toml) override;
  void layout(const trainer::LayoutReport& layout) override;
  void nothing_to_do(std::int64_t step, std::int64_t steps) override;
  void run_summary(const trainer::RunSummary& summary) override;
  void step(const trainer::StepReport& report) override;
  void evaluation(const trainer::EvalReport& report) override;
  void checkpoint_saved(const std::string& path) override;
  void stopped(trainer::StopReason reason, std::int64_t step) override;
  void warning(const std::string& message) override;
};

// While one exists, SIGINT and SIGTERM (Ctrl-C, a scheduler's preemption) set
// stop_requested(), which the Trainer reads at each step boundary to stop after a
// checkpoint. Any number of SIGTERMs is that one stop; a second SIGINT kills as usual.
// The previous handlers come back when it is destroyed, but for SIGTERM after a stop,
// which is ignored from then on (the process is exiting with the stop's status).
class StopSignals {
 public:
  StopSignals();  // also clears stop_requested()
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

const std::atomic<bool>& stop_requested();

}  // namespace dufu::tools
