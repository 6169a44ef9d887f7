// What a training run tells the person running it, as data: the Trainer (trainer.h)
// reports through this interface and never prints. The train tool's console reporter
// (tools/train/console_reporter.h) prints it to stdout; a test or another front end
// may collect it instead. metrics.jsonl, a file in the run directory, is written by
// the Trainer itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"

namespace dufu::trainer {

// Which rank holds which layers and shards.
struct RankLayout {
  int rank = 0;
  int tp_rank = 0;
  int dp_rank = 0;
  int pp_rank = 0;
  int first_layer = 0;  // the stage's layers, first to last
  int last_layer = 0;
  bool embeddings = false;  // the first stage: token and position embeddings
  bool head = false;        // the last stage: ln_f and the classifier
  int first_head = 0;       // the tensor-parallel shard's attention heads
  int last_head = 0;
  int first_vocab_row = 0;  // and its rows of the (padded) vocabulary
  int last_vocab_row = 0;
};

struct LayoutReport {
  std::string topology;  // Topology::describe()
  std::vector<RankLayout> ranks;  // every rank of the job, in rank order
};

// The model and the batch, once the run is ready to train.
struct RunSummary {
  std::size_t parameters = 0;  // of the whole model
  std::string arch;            // model.arch: "gpt2" or "llama"
  int n_layer = 0;
  int d_model = 0;
  int n_head = 0;
  int n_kv_head = 0;  // K/V heads (n_head unless grouped-query attention)
  int vocab_size = 0;
  int padded_vocab_size = 0;
  int seq_length = 0;
  int micro_batch = 0;
  int accumulation = 0;  // micro-batches per step on each data-parallel rank
  int data_parallel_size = 0;
  double tokens_per_step = 0.0;
  int threads = 0;             // OpenMP threads per rank
  double peak_flops = 0.0;     // measured sgemm peak of one rank, FLOP/s
  double flops_per_token = 0.0;  // training FLOPs per token
};

// One optimizer step (also in metrics.jsonl as a "train" record).
struct StepReport {
  std::int64_t step = 0;   // updates done, this one included
  std::int64_t steps = 0;  // train.steps
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_second = 0.0;
  double seconds = 0.0;  // wall time of the step
  double mfu = 0.0;      // model FLOPs utilisation, 0 to 1
  std::uint64_t consumed_samples = 0;
  std::uint64_t consumed_tokens = 0;
  bool skipped = false;  // the loss or gradient was not finite: no update
  std::uint64_t comm_bytes = 0;  // this rank's traffic in the step, all groups
  double comm_seconds = 0.0;
  CommunicationTraffic comm_traffic;  // the same, summed over the groups by collective kind
  // The process's peak resident memory so far (getrusage's ru_maxrss): on the CPU device
  // the high-water mark of what training holds (the touched pages of the mmap'd shards
  // too); on a GPU only the host side's.
  double peak_rss_bytes = 0.0;
  int world_size = 1;
  bool log_due = false;  // a train.log_interval ends here, or the run does
};

// One evaluation on the validation split (also in metrics.jsonl as "eval").
struct EvalReport {
  std::int64_t step = 0;
  double val_loss = 0.0;
  double val_perplexity = 0.0;
};

enum class StopReason {
  kExitAtStep,  // train.exit_at_step was reached
  kSignal,      // a stop was requested (SIGINT/SIGTERM in the train tool)
};

// Called on world rank 0 only (it speaks for the run), on the thread that drives the
// Trainer. A run reports effective_config, layout, then either nothing_to_do or
// run_summary followed by its steps (each step, then evaluation and checkpoint_saved
// when due), and stopped when it ends before train.steps. Every method does nothing
// by default, so TrainingReporter itself is a silent reporter.
class TrainingReporter {
 public:
  virtual ~TrainingReporter() = default;

  // The configuration the run uses (TOML), once run.dir is locked.
  virtual void effective_config(const std::string& /*toml*/) {}
  virtual void layout(const LayoutReport& /*layout*/) {}
  // The run is already at train.steps (a resume of a finished run).
  virtual void nothing_to_do(std::int64_t /*step*/, std::int64_t /*steps*/) {}
  virtual void run_summary(const RunSummary& /*summary*/) {}
  virtual void step(const StepReport& /*report*/) {}
  virtual void evaluation(const EvalReport& /*report*/) {}
  virtual void checkpoint_saved(const std::string& /*path*/) {}
  // The run stops at `step`, before train.steps, after saving a checkpoint.
  virtual void stopped(StopReason /*reason*/, std::int64_t /*step*/) {}
  // Something the user should know that does not stop the run (a skipped update).
  virtual void warning(const std::string& /*message*/) {}
};

}  // namespace dufu::trainer
