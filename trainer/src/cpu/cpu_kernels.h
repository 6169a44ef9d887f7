// The CPU backend's kernels: the implementations behind the CPU device's KernelTable
// (kernel_table.h documents each op), one file per op family in this folder, and the
// decisions they share.
//
// Threading: every kernel runs on OpenMP's threads (omp_get_max_threads(), i.e.
// OMP_NUM_THREADS or omp_set_num_threads). matmul sets OpenBLAS to one thread on first
// use and splits each product across the OpenMP threads itself, so the two thread
// pools never compete for the cores; don't call these kernels from inside an OpenMP
// parallel region. Except for matmul (OpenBLAS picks kernels by block size), results
// are also bitwise identical across thread counts. AdamW runs as one parallel region
// with the elements split evenly over the threads, whatever the segments: a fork/join
// per tensor costs more than the update of a small tensor, and far more when another
// process holds a core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "device/kernel_list.h"
#include "device/bf16.h"
#include "dufu/trainer/device/kernel_table.h"

namespace dufu::trainer::cpu {

// One function per op of the table, with the entry's type (kernel_list.h).
DUFU_KERNEL_OPS(DUFU_DECLARE_KERNEL)

const KernelTable& kernel_table();

// The CPU kernels call sgemm from inside their own OpenMP threads (matmul splits its
// products, attention runs one head per thread), so OpenBLAS itself must stay
// single-threaded: its pthread pool would oversubscribe the cores and fight OpenMP's
// spinning workers. Sets OpenBLAS to one thread the first time it is called (cheap
// afterwards); call it before any sgemm.
void use_single_threaded_blas();

// Floats of the kept scratch bf16 operands x [N, C] and weight [OC, C] widen into.
constexpr std::size_t widened_operand_floats(std::size_t N, std::size_t C, std::size_t OC) { return (N + OC) * C; }

// A matmul's x [N, C] and weight [OC, C] as floats (float_operands.cc): fp32 operands as
// they are, bf16 ones widened into a scratch kept for the next product.
struct FloatOperands {
  const float* x;
  const float* weight;
  FloatOperands(const char* entry, TensorIn x_in, TensorIn weight_in, int N, int C, int OC);
};

// The C values of `out` from `offset` as the recipe keeps them: rounded to bf16 (and
// their bits written) when out is bf16, untouched when fp32.
inline void keep_row(TensorOut out, std::size_t offset, int C) {
  if (!out.bf16()) return;
  float* values = out.values + offset;
  std::uint16_t* bits = out.bits == nullptr ? nullptr : out.bits + offset;
  for (int c = 0; c < C; ++c) values[c] = store_as_bf16(values[c], bits == nullptr ? nullptr : bits + c);
}

}  // namespace dufu::trainer::cpu

// The build targets baseline x86-64 (SSE2), where a vectorized exp or GELU runs at a
// third of the speed AVX2 gives. Kernels marked with this are compiled twice, for
// x86-64-v3 (AVX2, FMA) and for the baseline, and the dynamic loader picks the copy
// the machine supports (GCC target_clones). Results may then differ in rounding
// between machines, never between runs or thread counts on one machine.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DUFU_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DUFU_CPU_CLONES
#endif
