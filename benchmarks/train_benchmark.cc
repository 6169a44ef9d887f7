// Training throughput of dufu's trainer on one GPT shape (GPT-2's, or Llama's under
// --arch llama: RMSNorm, rotary positions, SwiGLU, grouped K/V heads, untied head): a
// real training step (forward with targets, backward, gradient clipping at 1.0, AdamW,
// zero_grad) on a random batch, warmup steps then timed steps, reported as tokens/s, ms/step and
// model FLOP utilization (MFU) against a GEMM rate measured in the same process just
// before the timed steps: on the CPU OpenBLAS's sgemm through the model's own matmul
// kernel; on a GPU (--device cuda) cuBLASLt's bf16 GEMM on the model's largest product
// ([B·T, C] x [C, 4C]), the rate mixed-precision training is judged by (its sgemm rate
// is printed too). benchmarks/reference/torch_train_benchmark.py runs the same step in
// PyTorch; benchmarks/train_benchmark.sh runs both and compares (on the CPU).
//
// The batch is the same every step (tokens [B, T+1] drawn once: inputs are the first
// T, targets the last T), so the loss must fall: the program checks that the first
// loss is close to ln(vocab) (what GPT-2's initialisation gives) and that the loss
// after the last step is lower, i.e. the step really trains, before it reports.
//
// On a GPU it also prints the memory plan the trainer checks before it allocates
// beside what the device's free memory fell by from before the model to after the
// timed steps, and, given --nominal-peak-tflops, MFU against that datasheet figure.
// --save-initial DIR writes the weights before the first update as a checkpoint under
// DIR (what `train export-hf` reads) and, after the first step, DIR/first_batch.json
// with the batch and the loss dufu computed on it: the GPU runner's loss-parity check
// hands both to transformers.
//
// Threads: OpenMP's (OMP_NUM_THREADS). The last line is machine-readable:
//   train_benchmark impl=dufu ... tokens_per_s=X ms_per_step=Y mfu=Z ...
// Exit status: 0 measured, 1 error, 77 the device is not available here.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/flops.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "dufu/trainer/run/training_memory.h"

namespace {

using Clock = std::chrono::steady_clock;
using dufu::trainer::AdamW;
using dufu::trainer::AdamWOptions;
using dufu::trainer::Device;
using dufu::trainer::DeviceKind;
using dufu::trainer::GPT;
using dufu::trainer::GPTConfig;

struct Options {
  GPTConfig config = dufu::trainer::gpt2_small();  // the defaults: GPT-2 small
  std::string arch = "gpt2";
  int seq = 256;
  int micro_batch = 8;
  int steps = 10;
  int warmup = 2;
  float lr = 1e-4f;
  std::uint32_t seed = 1337;
  double sgemm_seconds = 1.0;
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string attention_products = "fp32";
  double nominal_peak_tflops = 0.0;  // 0: no MFU against a datasheet figure
  std::string save_initial;
};

// Seconds spent in each part of the step, summed over the timed steps.
struct PhaseTimes {
  double forward = 0, backward = 0, clip = 0, adamw = 0, zero_grad = 0;
  double total() const { return forward + backward + clip + adamw + zero_grad; }
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string save_initial_weights(const std::string& dir, const GPT& model, const AdamW& optimizer,
                                 std::uint32_t seed) {
  dufu::trainer::TrainingState state;
  state.init_seed = seed;
  state.model = model.config();
  return dufu::trainer::save_checkpoint(dir, model, optimizer, state, 1);
}

void write_first_batch(const std::string& path, const std::vector<std::int32_t>& tokens,
                       const std::vector<std::int32_t>& targets, int B, int T, const std::string& precision,
                       float loss) {
  dufu::JsonWriter json;
  json.begin_object();
  json.key("micro_batch").value(B);
  json.key("seq").value(T);
  json.key("precision").value(precision);
  json.key("loss").value(static_cast<double>(loss));
  json.key("tokens").begin_array();
  for (const std::int32_t token : tokens) json.value(token);
  json.end_array();
  json.key("targets").begin_array();
  for (const std::int32_t target : targets) json.value(target);
  json.end_array();
  json.end_object();
  dufu::AtomicFile file(path);
  const std::string text = json.str() + "\n";
  file.write(text.data(), text.size());
  file.commit();
}

int run(const Options& options) {
  GPTConfig config = options.config;
  config.arch = dufu::trainer::parse_architecture(options.arch, "--arch");
  config.tie_embeddings = !config.is_llama();
  config.seq_length = options.seq;
  config.validate();
  const int B = options.micro_batch;
  const int T = options.seq;
  const int threads = omp_get_max_threads();
  Device& device = dufu::trainer::device_of_kind(dufu::trainer::parse_device_kind(options.device));
  const bool on_gpu = device.kind() != DeviceKind::kCpu;
  const auto precision = dufu::trainer::parse_precision(options.precision, "--precision");
  const auto attention_products = dufu::trainer::parse_precision(options.attention_products, "--attention-products");
  if (attention_products == dufu::trainer::Precision::kBf16 && precision != dufu::trainer::Precision::kBf16) {
    std::fprintf(stderr, "train_benchmark: --attention-products bf16 needs --precision bf16\n");
    return 2;
  }
  const double free_before_model = device.memory_capacity_bytes();

  GPT model(config, nullptr, {}, &device, {.precision = precision, .attention_products = attention_products});
  model.init_gpt2(options.seed);
  AdamW optimizer(model, AdamWOptions{});  // GPT-2's betas (0.9, 0.95), eps 1e-8, decay 0.1 on matrices
  std::string initial_checkpoint;
  if (!options.save_initial.empty()) {
    initial_checkpoint = save_initial_weights(options.save_initial, model, optimizer, options.seed);
  }

  std::mt19937 rng(options.seed);
  std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
  std::vector<std::int32_t> tokens, targets;
  for (int b = 0; b < B; ++b) {
    std::int32_t current = token(rng);
    for (int t = 0; t < T; ++t) {
      const std::int32_t next = token(rng);
      tokens.push_back(current);
      targets.push_back(next);
      current = next;
    }
  }

  std::vector<float> losses;
  PhaseTimes phases;
  double grad_norm = 0;
  auto step = [&](PhaseTimes* times) {
    auto t0 = Clock::now();
    const float loss = model.forward(tokens, targets, B, T);
    auto t1 = Clock::now();
    // Each phase ends with a synchronize: a GPU runs asynchronously, and the phase
    // times would otherwise land wherever the host next waits.
    model.backward();
    device.synchronize();
    auto t2 = Clock::now();
    grad_norm = dufu::trainer::clip_gradient_norm(model.grads(), 1.0, device);
    auto t3 = Clock::now();
    optimizer.step(model.params(), model.grads(), options.lr);
    device.synchronize();
    auto t4 = Clock::now();
    model.zero_grad();
    device.synchronize();
    auto t5 = Clock::now();
    losses.push_back(loss);
    if (times != nullptr) {
      using D = std::chrono::duration<double>;
      times->forward += D(t1 - t0).count();
      times->backward += D(t2 - t1).count();
      times->clip += D(t3 - t2).count();
      times->adamw += D(t4 - t3).count();
      times->zero_grad += D(t5 - t4).count();
    }
  };

  const auto warmup_start = Clock::now();
  if (!options.save_initial.empty()) {
    step(nullptr);
    write_first_batch(options.save_initial + "/first_batch.json", tokens, targets, B, T, options.precision,
                      losses.front());
    std::printf("initial weights in %s, first batch and loss in %s/first_batch.json\n", initial_checkpoint.c_str(),
                options.save_initial.c_str());
  }
  for (int i = losses.size(); i < options.warmup; ++i) step(nullptr);
  const double warmup_seconds = seconds_since(warmup_start);

  // The peak right before the timed steps, so both see the same machine state.
  const double sgemm = dufu::trainer::measure_sgemm_peak_flops(options.sgemm_seconds, device);
  const double peak = on_gpu ? dufu::trainer::measure_cuda_bf16_gemm_flops(B * T, config.d_model, 4 * config.d_model,
                                                                           options.sgemm_seconds)
                             : sgemm;
  const char* peak_kind = on_gpu ? "bf16 cuBLASLt GEMM" : "sgemm";

  const auto start = Clock::now();
  for (int i = 0; i < options.steps; ++i) step(&phases);
  const double seconds = seconds_since(start);
  const double held_after_steps = free_before_model - device.memory_capacity_bytes();
  // One more forward gives the loss after the last update.
  const float final_loss = model.forward(tokens, targets, B, T);

  // Correctness before the figures: the step must train.
  const double expected_first = std::log(static_cast<double>(config.vocab_size));
  if (!std::isfinite(losses.front()) || std::abs(losses.front() - expected_first) > 0.5) {
    DUFU_FAIL("first loss ", losses.front(), " is not close to ln(vocab) = ", expected_first,
              "; HINT: the model or its initialisation is broken (run the trainer tests)");
  }
  if (!std::isfinite(final_loss) || !(final_loss < losses.front())) {
    DUFU_FAIL("loss did not fall on a repeated batch: ", losses.front(), " -> ", final_loss,
              "; HINT: the backward or the optimizer is broken (run the trainer tests)");
  }

  const double tokens_per_step = static_cast<double>(B) * T;
  const double tokens_per_s = tokens_per_step * options.steps / seconds;
  const double ms_per_step = 1e3 * seconds / options.steps;
  const double flops_per_token = dufu::trainer::gpt_training_flops_per_token(config, T);
  const double mfu = flops_per_token * tokens_per_s / peak;
  const double nominal_peak = options.nominal_peak_tflops * 1e12;
  const double mfu_nominal = nominal_peak > 0 ? flops_per_token * tokens_per_s / nominal_peak : 0.0;
  const dufu::trainer::MemoryPlan plan =
      dufu::trainer::rank_memory_plan(config, B, T, 1, 1, {}, 1, 0, precision, false, device);

  const int hidden = static_cast<int>(config.mlp_hidden());  // validated: fits an int
  std::printf("dufu train step: %s, n_layer %d, d_model %d, n_head %d, n_kv_head %d, MLP %d, vocab %d (padded %d), "
              "%zu parameters\n",
              options.arch.c_str(), config.n_layer, config.d_model, config.n_head, config.kv_heads(),
              hidden, config.vocab_size, config.padded_vocab_size(), model.num_parameters());
  std::printf("  device %s, precision %s\n", device.describe().c_str(), options.precision.c_str());
  std::printf("  batch %d x %d = %.0f tokens/step, %d threads, %d warmup steps (%.2f s), %d timed steps (%.2f s)\n", B,
              T, tokens_per_step, threads, options.warmup, warmup_seconds, options.steps, seconds);
  std::printf("  loss %.4f (ln V = %.4f) -> %.4f after %zu steps; last gradient norm %.3f\n", losses.front(),
              expected_first, final_loss, losses.size(), grad_norm);
  const double n = options.steps;
  std::printf("  ms/step: forward %.1f, backward %.1f, clip %.1f, adamw %.1f, zero_grad %.1f, total %.1f\n",
              1e3 * phases.forward / n, 1e3 * phases.backward / n, 1e3 * phases.clip / n, 1e3 * phases.adamw / n,
              1e3 * phases.zero_grad / n, 1e3 * phases.total() / n);
  std::printf(
      "  %.1f tokens/s; %.3f GFLOP/token -> %.2f GFLOP/s; sgemm %.2f GFLOP/s; MFU %.3f of the %s rate %.2f GFLOP/s\n",
      tokens_per_s, flops_per_token / 1e9, flops_per_token * tokens_per_s / 1e9, sgemm / 1e9, mfu, peak_kind,
      peak / 1e9);
  if (nominal_peak > 0) std::printf("  MFU %.3f of the nominal %.0f TFLOP/s\n", mfu_nominal, options.nominal_peak_tflops);
  if (on_gpu) {
    std::printf("  memory plan: %s; the device's free memory fell by %.2f GB from before the model to after the "
                "timed steps\n",
                plan.describe(free_before_model).c_str(), held_after_steps / 1e9);
  }
  std::printf(
      "train_benchmark impl=dufu device=%s precision=%s attention_products=%s arch=%s n_layer=%d d_model=%d n_head=%d n_kv_head=%d "
      "ffn_hidden=%d vocab=%d seq=%d "
      "micro_batch=%d threads=%d warmup=%d steps=%d seconds=%.3f tokens_per_s=%.2f ms_per_step=%.1f forward_ms=%.1f "
      "backward_ms=%.1f clip_ms=%.1f adamw_ms=%.1f zero_grad_ms=%.1f flops_per_token=%.6g sgemm_gflops=%.2f "
      "peak_gflops=%.2f mfu=%.4f mfu_nominal=%.4f plan_gb=%.3f held_gb=%.3f loss_first=%.4f loss_final=%.4f\n",
      options.device.c_str(), options.precision.c_str(), options.attention_products.c_str(), options.arch.c_str(),
      config.n_layer, config.d_model,
      config.n_head, config.kv_heads(), hidden, config.vocab_size, T, B, threads, options.warmup,
      options.steps, seconds, tokens_per_s, ms_per_step,
      1e3 * phases.forward / n, 1e3 * phases.backward / n, 1e3 * phases.clip / n, 1e3 * phases.adamw / n,
      1e3 * phases.zero_grad / n, flops_per_token, sgemm / 1e9, peak / 1e9, mfu, mfu_nominal, plan.total() / 1e9,
      on_gpu ? held_after_steps / 1e9 : 0.0, losses.front(), final_loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dufu training throughput (tokens/s, MFU) on one GPT shape"};
  Options options;
  app.add_option("--n-layer", options.config.n_layer, "Transformer blocks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--d-model", options.config.d_model, "Channels")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--n-head", options.config.n_head, "Attention heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--arch", options.arch, "gpt2, or llama (RMSNorm, rotary, SwiGLU, untied head)")
      ->check(CLI::IsMember({"gpt2", "llama"}))
      ->capture_default_str();
  app.add_option("--n-kv-head", options.config.n_kv_head, "llama: key/value heads (0: --n-head)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--ffn-hidden", options.config.ffn_hidden, "llama: SwiGLU width (0: Llama's 8/3 rule)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--vocab", options.config.vocab_size, "Vocabulary size (padded to a multiple of 128 inside)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seq", options.seq, "Positions per sequence (T)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--micro-batch", options.micro_batch, "Sequences per step (B)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", options.steps, "Timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", options.warmup, "Untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--lr", options.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--seed", options.seed, "Weights and tokens")->capture_default_str();
  app.add_option("--device", options.device,
                 "cpu, or cuda (GPT-2 124M at T=1024: --n-layer 12 --d-model 768 --n-head 12 --vocab 50257 --seq 1024)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--precision", options.precision, "fp32, or bf16 (the mixed-precision recipe)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--attention-products", options.attention_products,
                 "fp32, or bf16 (with --precision bf16): attention's products on bf16 operands (train.attention_products)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--sgemm-seconds", options.sgemm_seconds, "How long to measure each GEMM rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--nominal-peak-tflops", options.nominal_peak_tflops,
                 "Also report MFU against this datasheet rate (989 for an H100 SXM's dense bf16)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--save-initial", options.save_initial,
                 "Write the weights before the first update as a checkpoint under DIR, and the batch with its loss "
                 "as DIR/first_batch.json");
  CLI11_PARSE(app, argc, argv);
  // Exit status 77 (the "skipped" of automake and ctest's SKIP_RETURN_CODE) when the
  // device cannot run here, so the GPU smoke test is reported skipped, not failed.
  const auto availability = dufu::trainer::device_availability(dufu::trainer::parse_device_kind(options.device));
  if (!availability.available) {
    std::fprintf(stderr, "train_benchmark: device %s is not available: %s\n", options.device.c_str(),
                 availability.reason.c_str());
    return 77;
  }
  try {
    return run(options);
  } catch (const dufu::Error& error) {
    std::fprintf(stderr, "train_benchmark: %s\n", error.what());
    return 1;
  } catch (const dufu::InternalError& bug) {  // a failed DUFU_CHECK: a bug in dufu
    std::fprintf(stderr, "train_benchmark: internal error: %s\n", bug.what());
    return 3;
  }
}
