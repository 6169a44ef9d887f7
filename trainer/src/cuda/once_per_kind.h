// Says yes the first time each kind of event is seen and no after: a fused epilogue's
// fallback to separate kernels is logged once per kind, not on every call of every
// step. Host code, so the CPU tests check it.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>

namespace dufu::trainer::cuda {

// Why a matmul with a fused epilogue ran as a GEMM and a separate kernel instead.
enum class FusedFallback : std::size_t {
  kGeluForwardWidth,        // GELU epilogue: the output width is not a multiple of 8
  kGeluForwardNoAlgorithm,  // GELU epilogue: cuBLASLt has no algorithm for the product
  kDgeluWidth,              // DGELU epilogue: the input width is not a multiple of 8
  kDgeluNoAlgorithm,        // DGELU epilogue: cuBLASLt has no algorithm for the product
  kBf16OutputNoAlgorithm,   // bf16 output: cuBLASLt has no algorithm for the product
  kCount,
};

template <typename Kind>
class OncePerKind {
 public:
  // True for the first call with `kind`, false for every later one.
  bool first(Kind kind) {
    return !seen_[static_cast<std::size_t>(kind)].exchange(true, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<bool>, static_cast<std::size_t>(Kind::kCount)> seen_{};
};

}  // namespace dufu::trainer::cuda
