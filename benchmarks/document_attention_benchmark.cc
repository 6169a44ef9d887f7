// Attention's forward and backward under document masking on the CPU device, against
// the same kernels on the same batch without it, in the same process, interleaved:
// the time of causal attention over whole rows, then over rows packed with documents
// of a given mean length (random lengths from 1 to twice the mean), and the ratio.
// Masking skips the key tiles before each query block's first document, so packed
// rows should cost less than whole ones, by at most the share of causal work that
// lies outside the documents. Prints the median of --repeats runs of each.
// Threads: OpenMP's (OMP_NUM_THREADS).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "dufu/trainer/device/device.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Where each token's document starts, rows of documents of random lengths in
// [1, 2 mean - 1].
std::vector<std::int32_t> packed_starts(int B, int T, int mean, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(1, std::max(1, 2 * mean - 1));
  std::vector<std::int32_t> starts;
  for (int b = 0; b < B; ++b) {
    int start = 0, next = length(rng);
    for (int t = 0; t < T; ++t) {
      if (t == next) {
        start = t;
        next = t + length(rng);
      }
      starts.push_back(start);
    }
  }
  return starts;
}

}  // namespace

int main(int argc, char** argv) {
  int B = 2, T = 2048, heads = 12, head_size = 64, mean = 256, repeats = 5;
  CLI::App app{"Attention forward + backward with document masking against whole causal rows (CPU)"};
  app.add_option("--batch", B, "rows")->capture_default_str();
  app.add_option("--seq", T, "tokens per row")->capture_default_str();
  app.add_option("--heads", heads, "attention heads")->capture_default_str();
  app.add_option("--head-size", head_size, "channels per head")->capture_default_str();
  app.add_option("--mean-document", mean, "mean document length in tokens")->capture_default_str();
  app.add_option("--repeats", repeats, "timed runs of each")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const dufu::trainer::KernelTable& k = dufu::trainer::cpu_device().kernels();
  const std::size_t rows = static_cast<std::size_t>(B) * T;
  const std::size_t qkv_width = static_cast<std::size_t>(3 * heads) * head_size;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> qkv(rows * qkv_width), dout(rows * heads * head_size);
  for (float& v : qkv) v = value(rng);
  for (float& v : dout) v = value(rng);
  std::vector<float> out(dout.size()), lse(rows * heads), dqkv(qkv.size());
  const std::vector<std::int32_t> starts = packed_starts(B, T, mean, 2);
  const auto run = [&](const std::int32_t* document_starts) {
    const auto begin = Clock::now();
    k.attention_forward(out.data(), lse.data(), qkv.data(), document_starts, B, T, heads, heads, head_size);
    k.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), document_starts, B, T, heads,
                         heads, head_size);
    return std::chrono::duration<double>(Clock::now() - begin).count();
  };
  run(nullptr);  // warm up both
  run(starts.data());
  std::vector<double> whole, packed;
  for (int i = 0; i < repeats; ++i) {
    whole.push_back(run(nullptr));
    packed.push_back(run(starts.data()));
  }
  std::printf("attention forward + backward, B=%d T=%d heads=%d head_size=%d, CPU\n", B, T, heads, head_size);
  std::printf("  whole causal rows:                      %8.1f ms (median of %d)\n", 1e3 * median(whole), repeats);
  std::printf("  documents of mean %4d tokens (masked): %8.1f ms\n", mean, 1e3 * median(packed));
  std::printf("  ratio masked / whole: %.3f\n", median(packed) / median(whole));
  return 0;
}
