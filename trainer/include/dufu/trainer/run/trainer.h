// The training program: data from a blend of shards through the infinite loader, the
// GPT, AdamW with warmup and cosine decay, gradient accumulation and clipping,
// evaluation, metrics.jsonl, checkpoints, and exact resume; over the launcher's ranks
// in tensor, pipeline and data parallel. It reports through a TrainingReporter and
// prints nothing itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "dufu/common/config.h"
#include "dufu/trainer/run/training_reporter.h"

namespace dufu::trainer {

struct RunOutcome {
  std::int64_t step = 0;     // optimizer updates done when the run stopped
  bool interrupted = false;  // stopped early by a stop request (checkpoint saved)
  double last_loss = 0.0;    // training loss of the last step
};

// Trains as `config` (training_config_schema()) says, in run.dir: every rank of the
// job makes one, and they proceed together (setup, step, evaluate and save are
// collective). Typical use is setup() and, when it returns true, run().
//
// Resumes from `resume_from` (a run or checkpoint directory, see
// find_usable_checkpoint) or, when that is empty, from the newest usable checkpoint in
// run.dir, if any; the loss sequence then continues bitwise as if the run had never
// stopped (same build and thread count). `stop_requested`, when not null, is read at
// every step boundary (a signal handler may set it): once it is set on any rank, run()
// saves a checkpoint and stops. Throws dufu::Error for bad configuration or data, a
// non-finite loss or gradient (with train.on_nonfinite="stop"), a run.dir already
// in use by another process or whose checkpoints are all unusable (never started over
// them), a model or batch that cannot fit in memory ("not enough memory for ..."), a
// shard that differs from the one the checkpoint was trained on (unless
// data.allow_changed_shards), or a checkpoint that would hold non-finite weights.
class Trainer {
 public:
  Trainer(const Config& config, std::string resume_from, TrainingReporter& reporter,
          const std::atomic<bool>* stop_requested = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Everything before the first step: checks that the model and a micro-batch fit in
  // memory, locks run.dir (removing what dead processes left in its checkpoints/) and
  // writes its config.toml, builds the data and records its shards' identity, the
  // layout, the model and optimizer (initialised, or loaded from the checkpoint to
  // resume from, after comparing the shards with the ones it records), the loader and
  // metrics.jsonl, and measures the sgemm peak. Reports effective_config and layout,
  // then run_summary; or nothing_to_do and returns false when the run is already at
  // train.steps.
  bool setup();

  // One optimizer step: the global batch forward and backward, gradient reduction and
  // clipping, the update (or, with train.on_nonfinite="skip", none), the metrics
  // record; reported and returned.
  StepReport step();
  // Whether the step just done ends an evaluation interval (or the run); never with
  // eval.interval 0.
  bool evaluation_due() const;
  // The validation loss, recorded in metrics.jsonl and reported (needs eval.interval
  // above 0, which loads the validation split).
  EvalReport evaluate();
  // Writes the checkpoint of the current step (keeping train.checkpoint_keep of them)
  // and returns its directory; reported. Throws, writing nothing, when a training shard
  // was changed in place since setup() or a weight is not finite.
  std::string save();

  // The loop after setup(): steps to train.steps, evaluating and saving when due;
  // stops early, after a checkpoint, at train.exit_at_step or on a stop request.
  RunOutcome run();

  // Optimizer updates done so far.
  std::int64_t completed_steps() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace dufu::trainer
