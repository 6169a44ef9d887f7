// The training program: data from a blend of shards through the infinite loader, the
// GPT, AdamW with warmup and cosine decay, gradient accumulation and clipping,
// evaluation, per-step logs and metrics.jsonl, checkpoints, and exact resume.
#pragma once

#include <cstdint>
#include <string>

#include "dufu/common/config.h"

namespace dufu::trainer {

struct RunOutcome {
  std::int64_t step = 0;        // optimizer updates done when the run stopped
  bool interrupted = false;     // stopped early by SIGINT/SIGTERM (checkpoint saved)
  double last_loss = 0.0;       // training loss of the last step
};

// Trains as `config` (training_config_schema()) says, in run.dir: the effective
// configuration goes to stdout and run.dir/config.toml, a line per log interval to
// stdout, every step to run.dir/metrics.jsonl. Resumes from `resume_from` (a run or
// checkpoint directory, see find_usable_checkpoint) or, when that is empty, from the
// newest usable checkpoint in run.dir, if any; the loss sequence then continues
// bitwise as if the run had never stopped (same build and thread count). SIGINT and
// SIGTERM stop at the next step boundary after a checkpoint. Throws dufu::Error for
// bad configuration or data, a non-finite loss or gradient (with
// train.on_nonfinite="stop"), or a run.dir already in use by another process.
RunOutcome run_training(const Config& config, const std::string& resume_from);

}  // namespace dufu::trainer
