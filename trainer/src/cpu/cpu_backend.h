// Decisions shared by all CPU kernels: how OpenBLAS threads, and which instruction
// sets the element-wise loops are compiled for. Private to src/cpu/.
#pragma once

namespace dufu::trainer::cpu {

// The CPU kernels call sgemm from inside their own OpenMP threads (matmul splits its
// products, attention runs one head per thread), so OpenBLAS itself must stay
// single-threaded: its pthread pool would oversubscribe the cores and fight OpenMP's
// spinning workers. Sets OpenBLAS to one thread the first time it is called (cheap
// afterwards); call it before any sgemm.
void use_single_threaded_blas();

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
