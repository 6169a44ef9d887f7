// The training program (see trainer.h). One step: micro-batches forward and backward
// with the gradient accumulating, clip, AdamW at the scheduled rate; then the metrics
// record and the report, evaluation and checkpoint when due. Setting a run up, resume
// included, is trainer_setup.cc's.
#include "dufu/trainer/run/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/log.h"
#include "dufu/trainer/checkpoint/parallel_checkpoint.h"
#include "dufu/trainer/model/flops.h"
#include "dufu/trainer/parallel/pipeline_schedule.h"
#include "dufu/trainer/run/lr_schedule.h"
#include "dufu/trainer/run/training_memory.h"
#include "trainer_state.h"

namespace dufu::trainer {

namespace {

using Clock = std::chrono::steady_clock;

// The process's peak resident set (Linux reports ru_maxrss in KiB); 0 if unknown.
double peak_resident_bytes() {
  struct rusage usage {};
  return ::getrusage(RUSAGE_SELF, &usage) == 0 ? 1024.0 * static_cast<double>(usage.ru_maxrss) : 0.0;
}

}  // namespace

Trainer::Trainer(const Config& config, std::string resume_from, TrainingReporter& reporter,
                 const std::atomic<bool>* stop_requested)
    : s_(std::make_unique<State>(config, std::move(resume_from), reporter, stop_requested)) {}

Trainer::~Trainer() = default;

std::int64_t Trainer::completed_steps() const { return s_->state.step; }
void Trainer::State::forward_backward() {
  GPT& gpt = *model;
  gpt.zero_grad();
  const DocumentMasking& masking = options.documents;
  if (topology->pipeline_parallel_size() == 1 && !masking.eod_mask_loss) {
    // The losses stay on the device until step_loss_sum: the host queues the whole
    // step without waiting for the device.
    for (int micro = 0; micro < accumulation; ++micro) {
      split_batch(loader->next(), batch, masking);
      gpt.forward_keeping_loss(batch.inputs, batch.targets, options.micro_batch, T, dloss_scale, batch.documents());
      gpt.backward();
    }
    return;
  }
  // The step's batches first: every stage of a pipeline reads the same batches (same
  // data-parallel rank; the first uses the tokens, the last the targets), and the loss
  // mask's scale needs every target of the step before the first backward.
  for (int micro = 0; micro < accumulation; ++micro) {
    split_batch(loader->next(), step_batches[static_cast<std::size_t>(micro)], masking);
  }
  if (masking.eod_mask_loss) count_step_targets();
  if (topology->pipeline_parallel_size() == 1) {
    for (const ModelBatch& micro_batch : step_batches) {
      gpt.forward_keeping_loss(micro_batch.inputs, micro_batch.targets, options.micro_batch, T, dloss_scale,
                               micro_batch.documents());
      gpt.backward();
    }
    return;
  }
  std::vector<PipelineMicroBatch> views;
  for (int micro = 0; micro < accumulation; ++micro) {
    const ModelBatch& micro_batch = step_batches[static_cast<std::size_t>(micro)];
    const double weight = loss_weights.empty() ? 1.0 : loss_weights[static_cast<std::size_t>(micro)];
    views.push_back({micro_batch.inputs, micro_batch.targets, micro_batch.documents(), weight});
  }
  pipeline_loss_sum = pipeline_train_step(gpt, *groups.pipeline, groups.embedding.get(), views, options.micro_batch,
                                          T, dloss_scale, pipeline_buffers);
}

void Trainer::State::count_step_targets() {
  loss_weights.clear();
  double counted = 0.0;
  for (const ModelBatch& micro_batch : step_batches) {
    loss_weights.push_back(static_cast<double>(counted_targets(micro_batch.targets)));
    counted += loss_weights.back();
  }
  if (dp > 1) counted = groups.data->all_reduce_value(counted, ReduceOp::kSum);
  // A global batch of end-of-document tokens only counts nothing: its loss and
  // gradient are 0, as Megatron's sum over an empty mask.
  loss_divisor = std::max(counted, 1.0);
  dloss_scale = static_cast<float>(1.0 / loss_divisor);
}

double Trainer::State::step_loss_sum() {
  if (topology->pipeline_parallel_size() > 1) return pipeline_loss_sum;
  double sum = 0.0;
  const std::vector<float> losses = model->read_kept_losses();
  for (std::size_t micro = 0; micro < losses.size(); ++micro) {
    sum += static_cast<double>(losses[micro]) * (loss_weights.empty() ? 1.0 : loss_weights[micro]);
  }
  return sum;
}

StepReport Trainer::step() {
  State& s = *s_;
  DUFU_CHECK(s.ready, "Trainer::step without a successful setup()");
  const TrainingOptions& options = s.options;
  TrainingState& state = s.state;
  const auto start = Clock::now();
  for (Communicator* group : s.all_groups()) {
    if (group != nullptr) group->reset_traffic();
  }
  try {
    s.forward_backward();
  } catch (const std::bad_alloc&) {
    fail_out_of_memory(s.activations_what, s.activations_bytes);  // the first step allocates them
  }
  const double grad_norm = s.optimizer->reduce_gradients_and_clip(options.grad_clip);
  // After the norm, which has waited for the device: reading the losses waits no more.
  double loss_sum = s.step_loss_sum();
  if (s.dp > 1) loss_sum = s.groups.data->all_reduce_value(loss_sum, ReduceOp::kSum);
  const double loss = loss_sum / s.loss_divisor;
  const double lr = learning_rate(options.schedule, state.step);
  const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
  if (finite) {
    s.optimizer->step(static_cast<float>(lr));
  } else if (options.on_nonfinite == NonFiniteAction::kStop) {
    DUFU_FAIL("step ", state.step + 1, ": the ", std::isfinite(loss) ? "gradient norm" : "loss", " is ",
              std::isfinite(loss) ? grad_norm : loss,
              "; the run stops without updating (train.on_nonfinite=skip skips such steps instead)");
  } else {
    ++state.skipped_steps;
    if (s.is_main) {
      s.reporter.warning(str_cat("step ", state.step + 1, ": loss ", loss, ", gradient norm ", grad_norm,
                                 ": not finite, update skipped (", state.skipped_steps, " skipped so far)"));
    }
  }
  ++state.step;
  state.consumed_samples += static_cast<std::uint64_t>(options.global_batch);
  state.consumed_tokens += static_cast<std::uint64_t>(s.tokens_per_step);

  StepReport report;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const Communicator* group : s.all_groups()) {
    if (group == nullptr) continue;
    const CommunicationTraffic& traffic = group->traffic();
    report.comm_bytes += traffic.total_bytes();
    report.comm_seconds += traffic.seconds;
    report.comm_traffic.all_reduce_bytes += traffic.all_reduce_bytes;
    report.comm_traffic.reduce_scatter_bytes += traffic.reduce_scatter_bytes;
    report.comm_traffic.all_gather_bytes += traffic.all_gather_bytes;
    report.comm_traffic.broadcast_bytes += traffic.broadcast_bytes;
    report.comm_traffic.point_to_point_bytes += traffic.point_to_point_bytes;
    report.comm_traffic.operations += traffic.operations;
    report.comm_traffic.seconds += traffic.seconds;
  }
  report.peak_rss_bytes = peak_resident_bytes();
  report.tokens_per_second = s.tokens_per_step / report.seconds;
  if (s.flops_per_token * report.tokens_per_second / s.world->size() > s.peak_flops) {
    s.peak_flops = std::max(s.peak_flops, measure_sgemm_peak_flops(0.2));
    DUFU_LOG_INFO("train", "sgemm peak re-measured: ", s.peak_flops / 1e9, " GFLOP/s");
  }
  report.mfu = s.flops_per_token * report.tokens_per_second / (s.peak_flops * s.world->size());
  report.step = state.step;
  report.steps = options.steps;
  report.loss = loss;
  report.lr = lr;
  report.grad_norm = grad_norm;
  report.consumed_samples = state.consumed_samples;
  report.consumed_tokens = state.consumed_tokens;
  report.skipped = !finite;
  report.world_size = s.world->size();
  report.log_due = state.step % options.log_interval == 0 || state.step == options.steps;

  if (s.is_main) {
    JsonWriter record;
    record.begin_object()
        .key("type").value("train")
        .key("step").value(report.step)
        .key("loss").value(report.loss)
        .key("lr").value(report.lr)
        .key("grad_norm").value(report.grad_norm)
        .key("tokens_per_second").value(report.tokens_per_second)
        .key("ms_per_step").value(report.seconds * 1e3)
        .key("mfu").value(report.mfu)
        .key("consumed_samples").value(report.consumed_samples)
        .key("consumed_tokens").value(report.consumed_tokens)
        .key("skipped").value(report.skipped)
        .key("comm_bytes").value(report.comm_bytes)
        .key("comm_seconds").value(report.comm_seconds)
        .key("comm_bytes_all_reduce").value(report.comm_traffic.all_reduce_bytes)
        .key("comm_bytes_reduce_scatter").value(report.comm_traffic.reduce_scatter_bytes)
        .key("comm_bytes_all_gather").value(report.comm_traffic.all_gather_bytes)
        .key("comm_bytes_broadcast").value(report.comm_traffic.broadcast_bytes)
        .key("comm_bytes_send_recv").value(report.comm_traffic.point_to_point_bytes)
        .key("peak_rss_bytes").value(report.peak_rss_bytes)
        .end_object();
    s.metrics->write(record);
    s.tensorboard->write(record);
    s.reporter.step(report);
  }
  return report;
}

bool Trainer::evaluation_due() const {
  const State& s = *s_;
  return s.valid_dataset && (s.state.step % s.options.eval_interval == 0 || s.state.step == s.options.steps);
}

EvalReport Trainer::evaluate() {
  State& s = *s_;
  DUFU_CHECK(s.ready && s.valid_dataset, "Trainer::evaluate without a successful setup() or with eval.interval 0");
  EvalReport report;
  report.step = s.state.step;
  report.val_loss = validation_loss(*s.model, *s.groups.pipeline, s.valid_dataset, s.options);
  report.val_perplexity = std::exp(report.val_loss);
  if (s.is_main) {
    JsonWriter record;
    record.begin_object()
        .key("type").value("eval")
        .key("step").value(report.step)
        .key("val_loss").value(report.val_loss)
        .key("val_perplexity").value(report.val_perplexity)
        .end_object();
    s.metrics->write(record);
    s.tensorboard->write(record);
    s.reporter.evaluation(report);
  }
  return report;
}

std::string Trainer::save() {
  State& s = *s_;
  DUFU_CHECK(s.ready, "Trainer::save without a successful setup()");
  s.state.train_loader_state = s.loader->state().to_string();
  // No checkpoint records shards that changed under the run (the identities are the
  // ones taken at the start).
  s.shard_watch.check();
  const std::string path = save_parallel_checkpoint(s.options.run_dir, *s.world, s.place, *s.model, *s.optimizer,
                                                    s.state, s.options.checkpoint_keep);
  if (s.is_main) s.reporter.checkpoint_saved(path);
  return path;
}

RunOutcome Trainer::run() {
  State& s = *s_;
  DUFU_CHECK(s.ready, "Trainer::run without a successful setup()");
  const TrainingOptions& options = s.options;
  RunOutcome outcome;
  while (s.state.step < options.steps) {
    outcome.last_loss = step().loss;
    if (evaluation_due()) evaluate();
    // Every rank must take the same decision, so a stop request seen by one stops all.
    const bool requested = s.stop_requested != nullptr && s.stop_requested->load();
    const bool signalled =
        s.world->all_reduce_value(static_cast<std::int32_t>(requested), ReduceOp::kMax) != 0;
    const bool exiting = s.state.step == options.exit_at_step;
    const bool stopping = signalled || exiting;
    if (s.state.step == options.steps || stopping ||
        (options.checkpoint_interval > 0 && s.state.step % options.checkpoint_interval == 0)) {
      save();
    }
    if (exiting) {
      if (s.is_main) s.reporter.stopped(StopReason::kExitAtStep, s.state.step);
      break;
    }
    if (stopping) {
      if (s.is_main) s.reporter.stopped(StopReason::kSignal, s.state.step);
      outcome.interrupted = true;
      break;
    }
  }
  s.world->barrier();
  outcome.step = s.state.step;
  return outcome;
}

}  // namespace dufu::trainer
