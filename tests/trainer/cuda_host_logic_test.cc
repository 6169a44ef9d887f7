// The CUDA backend's host logic, which runs on the CPU: the carver's 256-byte offsets,
// the alignment cuBLASLt is told, the cache of its algorithms, the scratch the device
// reports to the memory plan, the GEMM-rate timing loop, the stream wait that watches
// NCCL's errors, and the once-per-kind fallback notice. The GPU parts around them are
// kept thin (src/cuda/*.cu), so that what can go wrong in them is tested here.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_scratch.h"
#include "cuda/gemm_timing.h"
#include "cuda/lt_algorithm_choice.h"
#include "cuda/once_per_kind.h"
#include "cuda/shared_memory_limit.h"
#include "cuda/stream_wait.h"
#include "device/buffer_carver.h"
#include "device/cuda_module.h"
#include "device/adamw_segments.h"
#include "dufu/trainer/device/device.h"
#include "device/embedding_buckets.h"
#include "device/kernel_partition.h"

namespace dufu::trainer {
namespace {

TEST(BufferCarver, EveryTensorStartsOn256Bytes) {
  float* slots[4] = {};
  detail::BufferCarver<float> carver;
  carver.want(slots[0], 7);  // 28 bytes, as the LayerNorm statistics of 7 rows
  carver.want(slots[1], 64);
  carver.want(slots[2], 65);
  carver.want(slots[3], 1);
  // In floats: 64 per 256 bytes.
  EXPECT_EQ(carver.offsets(), (std::vector<std::size_t>{0, 64, 128, 256}));
  EXPECT_EQ(carver.total(), 320u);
  DeviceBuffer<float> memory;
  carver.allocate(cpu_device(), memory);
  for (float* slot : slots) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(slot) % kTensorAlignmentBytes, 0u);

  std::uint16_t* bits[2] = {};
  detail::BufferCarver<std::uint16_t> bf16_carver;
  bf16_carver.want(bits[0], 5 * 16);  // an odd prompt's 5 rows of 16 channels: 160 bytes
  bf16_carver.want(bits[1], 3);
  EXPECT_EQ(bf16_carver.offsets(), (std::vector<std::size_t>{0, 128}));
  EXPECT_EQ(bf16_carver.total(), 256u);
}

TEST(LtAlignment, TheLargestPowerOfTwoDividingTheAddressUpTo256) {
  using cuda::operand_alignment_bytes;
  EXPECT_EQ(operand_alignment_bytes(std::uintptr_t{0x7f0000001000}), 256u);
  EXPECT_EQ(operand_alignment_bytes(std::uintptr_t{0x7f0000001100}), 256u);
  EXPECT_EQ(operand_alignment_bytes(std::uintptr_t{0x7f0000001080}), 128u);
  EXPECT_EQ(operand_alignment_bytes(std::uintptr_t{0x7f0000001010}), 16u);
  EXPECT_EQ(operand_alignment_bytes(std::uintptr_t{0x7f000000101c}), 4u);  // a float 7 floats in
  EXPECT_EQ(operand_alignment_bytes(std::uintptr_t{0x7f0000001002}), 2u);  // a bf16 one element in
  EXPECT_EQ(operand_alignment_bytes(std::uintptr_t{0}), 256u);             // no operand: no constraint
  alignas(256) static float buffer[8];
  EXPECT_EQ(operand_alignment_bytes(buffer + 1), 4u);
}

TEST(LtAlgorithmCache, AsksOncePerKeyAndKeysTheAlignment) {
  cuda::LtAlgorithmCache<int> cache;
  int asked = 0;
  const auto choose = [&] { return std::optional<int>(++asked); };
  cuda::LtProductKey key{.rows = 7, .inner = 16, .cols = 48, .a_alignment = 256, .b_alignment = 256,
                         .out_alignment = 256};
  EXPECT_EQ(cache.find_or_choose(key, choose), 1);
  EXPECT_EQ(cache.find_or_choose(key, choose), 1);  // kept: the heuristic is not asked again
  cuda::LtProductKey misaligned = key;
  misaligned.a_alignment = 4;
  EXPECT_EQ(cache.find_or_choose(misaligned, choose), 2);
  cuda::LtProductKey other_epilogue = key;
  other_epilogue.epilogue = 1;
  other_epilogue.bias_alignment = 256;
  EXPECT_EQ(cache.find_or_choose(other_epilogue, choose), 3);
  cuda::LtProductKey misaligned_bias = other_epilogue;  // a bias one float into its buffer
  misaligned_bias.bias_alignment = 4;
  EXPECT_EQ(cache.find_or_choose(misaligned_bias, choose), 4);
  EXPECT_EQ(asked, 4);
  // "No algorithm" is an answer too, kept so the fallback costs no heuristic either.
  cuda::LtProductKey unsupported = key;
  unsupported.cols = 49;
  EXPECT_FALSE(cache.find_or_choose(unsupported, [&] { ++asked; return std::optional<int>(); }).has_value());
  EXPECT_FALSE(cache.find_or_choose(unsupported, choose).has_value());
  EXPECT_EQ(asked, 5);
  // A heuristic that failed keeps nothing: the next call asks again.
  cuda::LtProductKey failing = key;
  failing.rows = 8;
  EXPECT_THROW(cache.find_or_choose(failing, []() -> std::optional<int> { throw std::runtime_error("failed"); }),
               std::runtime_error);
  EXPECT_EQ(cache.find_or_choose(failing, choose), 6);
  EXPECT_EQ(cache.size(), 6u);
}

TEST(CudaScratch, TheLargestRequestAndTheWorkspaceAreInThePlan) {
  // GPT-2 124M's last stage at B 4, T 1024: N 4096 rows, C 768, vocabulary 50304.
  const std::int64_t N = 4096, C = 768, V = 50304;
  StepShapes shapes{.matmuls = {{N, C, 3 * C, true}, {N, C, C, true}, {N, C, 4 * C, true}, {N, 4 * C, C, true},
                                {N, C, V, false}},
                    .rows = N,
                    .width = C,
                    .parameters = 124'000'000,
                    .bf16_operands = true};
  // The largest is the embedding backward's sort (four arrays of N 32-bit keys or
  // positions and cub's storage), above the MLP-up bias's partial sums (32 chunks x 4C
  // doubles); under bf16 too, where the backward GEMMs read the bits the model kept of
  // their dout (the LM head's, N x V x 2 bytes, was the largest request when it was
  // copied into the scratch).
  const std::size_t sort_bytes = static_cast<std::size_t>(4 * N * 4) + (std::size_t{1} << 20);
  EXPECT_EQ(cuda::step_scratch_bytes(shapes), sort_bytes);
  EXPECT_DOUBLE_EQ(cuda::device_scratch_bytes(shapes), 32.0 * 1024 * 1024 + static_cast<double>(sort_bytes));
  shapes.bf16_operands = false;
  EXPECT_EQ(cuda::step_scratch_bytes(shapes), sort_bytes);
  EXPECT_GT(sort_bytes, static_cast<std::size_t>(32 * 4 * C * 8));
  // The bf16 attention backward's D per row and head: at 12 heads 196 KB, below the
  // sort; at 1 x 32768 tokens of 64 heads, 8 MiB, above it.
  shapes.attention_row_heads = N * 12;
  EXPECT_EQ(cuda::step_scratch_bytes(shapes), sort_bytes);
  StepShapes long_context{.rows = 32768, .width = 4096, .parameters = 1000, .attention_row_heads = 32768 * 64};
  EXPECT_EQ(cuda::step_scratch_bytes(long_context), std::size_t{32768} * 64 * sizeof(float));
  // An odd copy rounds up to 256 bytes, as the scratch asks.
  EXPECT_EQ(cuda::bf16_copy_scratch_bytes(7), 256u);
  // Few rows: as many chunks as rows.
  EXPECT_EQ(cuda::layernorm_scratch_bytes(5, 16), static_cast<std::size_t>(2 * 5 * 16 * 8));
  EXPECT_EQ(cuda::sum_of_squares_scratch_bytes((std::size_t{1} << 16) + 1), 3 * sizeof(double));
}

// The bias-gradient column sums of GPT-2 124M's four linears (B = 16, T = 1024): at
// least two blocks per SM of an H100 (132 SMs) and every column in exactly one tile.
// (The sums themselves: kernels_test's CUDA matmul_backward rows, against the CPU.)
TEST(ColumnSums, TheBiasGradientGridFillsAnH100) {
  constexpr int kRows = 16 * 1024, kSms = 132;
  for (const int C : {768, 3 * 768, 4 * 768}) {
    EXPECT_GE(column_sum_blocks(kRows, C), 2u * kSms) << C;
    EXPECT_GE(column_sum_tiles(C) * kColumnSumTile, static_cast<unsigned>(C)) << C;
    EXPECT_LT((column_sum_tiles(C) - 1) * kColumnSumTile, static_cast<unsigned>(C)) << C;
  }
  EXPECT_EQ(column_sum_tiles(0), 0u);
}

// The CUDA embedding backward's buckets (embedding.cu: keys, cub's stable radix sort,
// one bucket per block) replayed with std::stable_sort: dwte gets the bits of the plain
// loop over positions (the CPU device's), with skewed tokens, a vocab-parallel range,
// and dwte accumulating onto non-zero values.
TEST(EmbeddingBuckets, SortedBucketsGiveTheBitsOfThePlainLoop) {
  constexpr int N = 700, C = 5, V = 40;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::int32_t> tokens(N);
  for (auto& token : tokens) token = rng() % 3 == 0 ? 11 : static_cast<std::int32_t>(rng() % V);  // 11: a third
  std::vector<float> dout(static_cast<std::size_t>(N) * C);
  for (auto& x : dout) x = value(rng);
  for (const auto& [vocab_begin, vocab_end] : {std::pair{0, 0x7fffffff}, std::pair{10, 25}}) {
    const int rows = std::min(vocab_end, V) - vocab_begin;
    std::vector<float> start(static_cast<std::size_t>(rows) * C);
    for (auto& x : start) x = value(rng);
    std::vector<float> plain = start;
    for (int n = 0; n < N; ++n) {
      if (tokens[n] < vocab_begin || tokens[n] >= vocab_end) continue;
      for (int c = 0; c < C; ++c) plain[(tokens[n] - vocab_begin) * C + c] += dout[n * C + c];
    }
    std::vector<std::int32_t> keys(N), positions(N);
    for (int n = 0; n < N; ++n) keys[n] = embedding_bucket_key(tokens[n], vocab_begin, vocab_end);
    std::iota(positions.begin(), positions.end(), 0);
    std::stable_sort(positions.begin(), positions.end(), [&](int a, int b) { return keys[a] < keys[b]; });
    std::vector<std::int32_t> sorted_keys(N);
    for (int i = 0; i < N; ++i) sorted_keys[i] = keys[positions[i]];
    const auto bucketed = [&](const std::vector<std::int32_t>& order) {
      std::vector<float> dwte = start;
      int buckets = 0;
      for (int i = 0; i < N; ++i) {
        if (!opens_bucket(sorted_keys.data(), i)) continue;
        ++buckets;
        for (int c = 0; c < C; ++c) {
          float& g = dwte[static_cast<std::size_t>(sorted_keys[i]) * C + c];
          g = sum_bucket_channel(g, dout.data(), sorted_keys.data(), order.data(), i, N, C, c);
        }
      }
      EXPECT_LE(buckets, rows);
      return dwte;
    };
    const std::vector<float> dwte = bucketed(positions);
    EXPECT_EQ(std::memcmp(dwte.data(), plain.data(), dwte.size() * sizeof(float)), 0) << vocab_begin;
    // The order matters: token 11's positions summed backwards give other bits.
    std::vector<std::int32_t> reversed = positions;
    for (int i = 0; i < N;) {
      int j = i;
      while (j < N && sorted_keys[j] == sorted_keys[i]) ++j;
      std::reverse(reversed.begin() + i, reversed.begin() + j);
      i = j;
    }
    const std::vector<float> backwards = bucketed(reversed);
    EXPECT_NE(std::memcmp(backwards.data(), plain.data(), backwards.size() * sizeof(float)), 0) << vocab_begin;
  }
  EXPECT_EQ(embedding_bucket_key(-1, 0, 0x7fffffff), kNoBucket);
  EXPECT_EQ(embedding_bucket_key(25, 10, 25), kNoBucket);
  EXPECT_EQ(embedding_bucket_key(24, 10, 25), 14);
}

// The CUDA AdamW's segment tables (elementwise.cu: one launch per table, each thread
// finding its segment by binary search) replayed on the CPU: against one update per
// segment (the launches they replace), bit for bit, with empty and repeated segment
// ends and more segments than one table holds.
TEST(AdamWSegments, TablesGiveEveryParameterItsSegmentsDecay) {
  std::mt19937 rng(3);
  std::vector<AdamWSegment> segments;
  std::size_t end = 0;
  for (int s = 0; s < 2 * kAdamWTableSegments + 17; ++s) {
    end += rng() % 4 == 0 ? 0 : 1 + rng() % 9;  // a quarter empty
    segments.push_back({end, (s % 3 == 0) ? 0.0f : 0.1f * static_cast<float>(1 + s % 5)});
  }
  const float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  const int t = 7;
  const auto tables = adamw_segment_tables(segments, lr, beta1, beta2, eps, t);
  ASSERT_GE(tables.size(), 2u);
  std::size_t covered = 0;
  for (const AdamWSegmentTable& table : tables) {
    ASSERT_GE(table.count, 1);
    ASSERT_LE(table.count, kAdamWTableSegments);
    EXPECT_EQ(table.begin, covered);
    covered = table.end[table.count - 1];
  }
  EXPECT_EQ(covered, end);

  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> params(end), grads(end), m(end), v(end);
  for (std::size_t i = 0; i < end; ++i) {
    params[i] = value(rng), grads[i] = value(rng), m[i] = value(rng) * 0.1f, v[i] = std::abs(value(rng)) * 0.01f;
  }
  auto per_segment = params, per_segment_m = m, per_segment_v = v;
  std::size_t begin = 0;
  for (const AdamWSegment& segment : segments) {  // the launch per segment it replaces
    const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, segment.weight_decay, t);
    for (std::size_t i = begin; i < segment.end; ++i) {
      adamw_element(per_segment[i], grads[i], per_segment_m[i], per_segment_v[i], step);
    }
    begin = std::max(begin, segment.end);
  }
  AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, 0.0f, t);
  for (const AdamWSegmentTable& table : tables) {  // adamw_kernel's threads
    for (std::size_t i = table.begin; i < table.end[table.count - 1]; ++i) {
      const int found = adamw_segment_of(table, i);
      ASSERT_TRUE(table.end[found] > i && (found == 0 ? table.begin : table.end[found - 1]) <= i) << i;
      step.decay = table.decay[found];
      adamw_element(params[i], grads[i], m[i], v[i], step);
    }
  }
  EXPECT_EQ(std::memcmp(params.data(), per_segment.data(), end * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(m.data(), per_segment_m.data(), end * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(v.data(), per_segment_v.data(), end * sizeof(float)), 0);
  // A table's parameters fit the 4 KiB a kernel's parameters may take everywhere.
  EXPECT_LE(sizeof(AdamWSegmentTable) + sizeof(AdamWStep) + 4 * sizeof(float*) + sizeof(float), 4096u);
}

TEST(GemmTiming, TheEventsBracketTwentyLaunchesAndNothingElse) {
  std::string trace;
  int ticks = 0;
  const double rate = cuda::best_flops_per_second(
      1e9, [&] { trace += 'L'; }, [&] { trace += '['; },
      [&] {
        trace += ']';
        return 0.5 * (++ticks);  // 0.5 s, then 1 s, 1.5 s: the first timing is the best
      },
      [] { return false; });
  const std::string timing = "[" + std::string(cuda::kLaunchesPerTiming, 'L') + "]";
  EXPECT_EQ(trace, timing + timing + timing);  // at least three timings, launches only inside
  EXPECT_GE(cuda::kLaunchesPerTiming, 20);
  EXPECT_DOUBLE_EQ(rate, 1e9 * cuda::kLaunchesPerTiming / 0.5);
}

TEST(StreamWait, ChecksBetweenPollsAndStopsWhenTheCheckThrows) {
  int polls = 0;
  int checks = 0;
  cuda::wait_checking([&] { return ++polls > 3; }, [&] { ++checks; });
  EXPECT_EQ(polls, 4);
  EXPECT_EQ(checks, 3);
  // A stream that never drains (NCCL waiting for a dead peer) ends with the check's error.
  checks = 0;
  EXPECT_THROW(cuda::wait_checking([] { return false; },
                                   [&] {
                                     if (++checks == 5) throw std::runtime_error("peer died");
                                   }),
               std::runtime_error);
  EXPECT_EQ(checks, 5);
}

// A peer that is alive but silent raises no error: only the clock ends the wait, with
// the bound's own error, not before the timeout and not long after it.
TEST(StreamWait, EndsAtTheTimeoutWhenNothingElseDoes) {
  int checks = 0;
  double waited_at_the_end = -1;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(cuda::wait_checking([] { return false; }, [&] { ++checks; }, 0.05,
                                   [&](double waited) {
                                     waited_at_the_end = waited;
                                     throw std::runtime_error("timed out");
                                   }),
               std::runtime_error);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited_at_the_end, 0.05);
  EXPECT_GE(elapsed, 0.05);
  EXPECT_LT(elapsed, 5.0);
  EXPECT_GT(checks, 1);  // the asynchronous errors were still checked until then
  // A wait that ends in time never calls it; a timeout of 0 is no bound.
  int polls = 0;
  cuda::wait_checking([&] { return ++polls > 3; }, [] {}, 10.0, [](double) { FAIL() << "timed out early"; });
  EXPECT_EQ(polls, 4);
  polls = 0;
  cuda::wait_checking([&] { return ++polls > 3; }, [] {}, 0.0, [](double) { FAIL() << "a timeout of 0 bound it"; });
}

TEST(ChooseGpu, OneGpuPerRankOrTheLaunchersPartition) {
  EXPECT_EQ(choose_gpu(0, 1, false).ordinal, 0);
  EXPECT_EQ(choose_gpu(3, 4, false).ordinal, 3);
  // Two ranks on a one-GPU machine would share it: refused in words, with the way out.
  const GpuChoice shared = choose_gpu(1, 1, false);
  EXPECT_EQ(shared.ordinal, -1);
  for (const char* part : {"local rank 1", "1 GPU;", "HINT", "CUDA_VISIBLE_DEVICES"}) {
    EXPECT_NE(shared.refusal.find(part), std::string::npos) << part << " not in: " << shared.refusal;
  }
  // CUDA_VISIBLE_DEVICES set by the launcher: local rank 1 sees its own GPU as 0.
  EXPECT_EQ(choose_gpu(1, 1, true).ordinal, 0);
  EXPECT_EQ(choose_gpu(5, 2, true).ordinal, 1);
  EXPECT_EQ(choose_gpu(0, 0, true).ordinal, -1);
  EXPECT_EQ(choose_gpu(0, 0, false).refusal, "this process sees no GPU");
}

// The module opens NCCL with dlopen and finds every function it calls (no GPU needed):
// where libnccl.so.2 is installed (as in this repository's toolkit) it loads; where it
// is not, the one reason names it.
TEST(NcclLibrary, OpensByDlopenWithEveryFunctionOrNamesTheLibrary) {
  std::string reason;
  const CudaModule* module = loaded_cuda_module(&reason);
  if (module == nullptr) GTEST_SKIP() << "no CUDA module: " << reason;
  if (module->nccl == nullptr) GTEST_SKIP() << "the CUDA module was built without nccl.h";
  const DeviceAvailability library = module->nccl->library();
  if (!library.available) {
    EXPECT_NE(library.reason.find("libnccl.so.2"), std::string::npos) << library.reason;
    EXPECT_EQ(library.reason.find('\n'), std::string::npos) << library.reason;
  }
  EXPECT_EQ(module->nccl->library().available, library.available);  // loaded once, the same answer
}

TEST(OncePerKind, EachKindOfFallbackIsNotedOnce) {
  cuda::OncePerKind<cuda::FusedFallback> noted;
  EXPECT_TRUE(noted.first(cuda::FusedFallback::kGeluForwardWidth));
  EXPECT_FALSE(noted.first(cuda::FusedFallback::kGeluForwardWidth));
  EXPECT_TRUE(noted.first(cuda::FusedFallback::kDgeluNoAlgorithm));
  EXPECT_FALSE(noted.first(cuda::FusedFallback::kDgeluNoAlgorithm));
  EXPECT_FALSE(noted.first(cuda::FusedFallback::kGeluForwardWidth));
}

// The bf16 attention's dk/dv kernel at head size 128 asks 107,008 bytes: an H100's
// 232,448 take it, an L4's (sm_89) 101,376 do not, and the refusal says so in words.
TEST(SharedMemoryLimit, ALaunchOverTheGpusLimitIsRefusedInWords) {
  EXPECT_EQ(cuda::shared_memory_refusal("the bf16 attention backward (dk, dv)", 128, 107008, 232448), "");
  EXPECT_EQ(cuda::shared_memory_refusal("k", 64, 101376, 101376), "") << "exactly the limit fits";
  const std::string refusal = cuda::shared_memory_refusal("the bf16 attention backward (dk, dv)", 128, 107008, 101376);
  EXPECT_NE(refusal.find("the bf16 attention backward (dk, dv) for a head size padded to 128 needs 107008 bytes"),
            std::string::npos)
      << refusal;
  EXPECT_NE(refusal.find("allows 101376"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("HINT: "), std::string::npos) << refusal;
}

// One block row per sequence and head: 65,535 rows launch, one more is refused in words.
TEST(GridRowsLimit, MoreSequenceHeadsThanCudaGridRowsAreRefusedInWords) {
  EXPECT_EQ(cuda::grid_rows_refusal("the fp32 attention forward", 16 * 12), "");
  EXPECT_EQ(cuda::grid_rows_refusal("the fp32 attention forward", 65535), "") << "exactly the limit fits";
  const std::string refusal = cuda::grid_rows_refusal("the fp32 attention forward", 2048LL * 32);
  EXPECT_NE(refusal.find("the fp32 attention forward launches one block row per sequence and head: 65536 rows, "
                         "over CUDA's 65535"),
            std::string::npos)
      << refusal;
  EXPECT_NE(refusal.find("HINT: "), std::string::npos) << refusal;
}

}  // namespace
}  // namespace dufu::trainer
