// The ops the kernels test runs (kernels_test.cc): for each, a runner that calls it on
// a device (or computes the double-precision reference when the device is null) and
// the tolerances and contracts it is held to. The runners are split by family:
// kernel_cases_layers.cc (embedding, LayerNorm, matmul, GELU, attention),
// kernel_cases_vocabulary.cc (the classifier and the vocabulary-parallel pieces),
// kernel_cases_step.cc (the glue between layers, the gradient's norm and scaling,
// AdamW), kernel_cases_bf16.cc (the bf16 conversions) and kernel_cases_llama.cc
// (RMSNorm, rotary embedding, SwiGLU), kernel_cases_kept.cc (outputs kept in bf16 by
// the kernel that computes them).
//
// Adding an op to every device:
//  1. its entry in KernelTable (trainer/include/dufu/trainer/device/kernel_table.h),
//     with its contract (which outputs it overwrites, which it accumulates into), and
//     its name in DUFU_KERNEL_OPS (trainer/src/device/kernel_list.h), which makes it a
//     compile error in each backend until that backend defines it;
//  2. the CPU kernel, in trainer/src/cpu/ (declared by cpu_kernels.h from the list);
//  3. the CUDA kernel, in trainer/src/cuda/ (declared by cuda_kernels.h from the list);
//     per-element math both share goes in device/kernel_math.h, written once;
//  4. the double-precision reference, in kernel_reference.h;
//  5. a runner and a row (name, tolerances, contracts) in the kernel_cases_*.cc of its
//     family, which runs it on every device and shape against the reference. The
//     runner hands every buffer of every kernel call to one DeviceArgs
//     (kernel_test_support.h): in() for what the op only reads, out() for what it
//     writes (in place included), then finish(); never device memory of its own. That
//     puts sentinels before and after each buffer and holds inputs unchanged, so a
//     kernel that writes one element past (or before) a buffer, or into an input,
//     fails its rows naming the buffer and the element;
//  6. for a backward, a GradCase in kernels_gradcheck_test.cc (kGradCases), which holds
//     its gradients against finite differences of the reference forward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "device/bf16.h"
#include "dufu/trainer/device/device.h"
#include "kernel_test_support.h"

namespace dufu::trainer::testing {

struct Output {
  std::string name;
  Vec values;
};
using Outputs = std::vector<Output>;

// Runs the op on `device`, or its reference when device is null. `calls` is how many
// times a backward kernel runs on the same buffers: the reference answer is init +
// calls * gradient for accumulated outputs and the gradient alone for overwritten
// ones, which tests the accumulate/overwrite contract of kernel_table.h.
using RunFn = Outputs (*)(const Shape&, Device* device, int calls);

struct OpCase {
  const char* name;
  RunFn run;
  Tolerance tol;
  bool repeatable_calls;                // false for the in-place classifier, which consumes its input
  bool same_bits_for_any_thread_count;  // all but matmul, whose OpenBLAS kernel depends on the block size
};

inline void PrintTo(const OpCase& op, std::ostream* os) { *os << op.name; }

// init + calls * grad, for a gradient the reference computed from zero.
inline Vec accumulated(const std::vector<float>& init, const Vec& grad, int calls) {
  Vec out = widen(init);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] += calls * grad[i];
  return out;
}

// The inputs of the embedding forwards (serial and vocab-parallel).
struct EmbeddingInputs {
  std::vector<std::int32_t> tokens;
  std::vector<float> wte, wpe;
  explicit EmbeddingInputs(const Shape& s)
      : tokens(random_tokens(s.N(), s.V, 1)),
        wte(random_floats(static_cast<std::size_t>(s.Vp) * s.C, 2)),
        wpe(random_floats(static_cast<std::size_t>(s.T) * s.C, 3)) {}
};

// The inputs of the embedding backwards: a small vocabulary makes positions share
// tokens, so the dwte scatter collides.
struct EmbeddingGradInputs {
  std::vector<std::int32_t> tokens;
  std::vector<float> dout, dwte0, dwpe0;
  explicit EmbeddingGradInputs(const Shape& s)
      : tokens(random_tokens(s.N(), std::min(s.V, 4), 4)),
        dout(random_floats(static_cast<std::size_t>(s.N()) * s.C, 5)),
        dwte0(random_floats(static_cast<std::size_t>(s.Vp) * s.C, 6)),
        dwpe0(random_floats(static_cast<std::size_t>(s.T) * s.C, 7)) {}
};

// The bf16 rows (the *_bf16 entries, train.precision = bf16) take weights and inputs
// on the bf16 grid: the values the reference computes with, and their bits, which the
// device reads (an exact copy).
enum class Operands { kFp32, kBf16 };
template <Operands kOperands>
std::vector<float> on_grid(std::vector<float> values) {
  if constexpr (kOperands == Operands::kBf16) {
    for (float& value : values) value = round_to_bf16(value);
  }
  return values;
}
inline std::vector<std::uint16_t> bf16_bits(const std::vector<float>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16_bits(values[i]);
  return bits;
}

// Tolerances are set from the fp32 error each kernel can accumulate (sums of up to
// 4C = 800 products for matmul, exp/tanh rounding elsewhere), with about 10x margin
// over the errors the harness prints.

// The Llama-family sizes a test shape stands for: head size hs = C / NH made even
// (rotary pairs its halves; c20's 5 becomes 6), NKV the largest proper divisor of NH
// (grouped-query attention: 4 heads share 2 K/V heads, 3 and 2 share 1 as in
// multi-query attention; NH = 1 keeps 1), and a SwiGLU width H = 3C/2 + 1, odd for
// most shapes.
struct LlamaDims {
  int NH, NKV, hs, H;
  int qkv_width() const { return (NH + 2 * NKV) * hs; }
};
inline LlamaDims llama_dims(const Shape& s) {
  const int hs = s.C / s.NH + (s.C / s.NH) % 2;
  int NKV = 1;
  for (int d = s.NH / 2; d > 1; --d) {
    if (s.NH % d == 0) {
      NKV = d;
      break;
    }
  }
  return {s.NH, NKV, hs, s.C + s.C / 2 + 1};
}

// The rows of each family, in the order the test lists them.
std::vector<OpCase> layer_op_cases();
std::vector<OpCase> vocabulary_op_cases();
std::vector<OpCase> step_op_cases();
std::vector<OpCase> bf16_op_cases();
std::vector<OpCase> llama_op_cases();
std::vector<OpCase> kept_op_cases();
std::vector<OpCase> kept_rowwise_op_cases();

}  // namespace dufu::trainer::testing
