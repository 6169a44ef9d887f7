// What cuBLASLt's heuristic is asked about a product, and the answers kept: the key of
// a product (shape, layout, epilogue, types and the operands' alignment) and a small
// map from keys to the algorithm chosen, so the heuristic (tens of microseconds of
// host time) runs once per kind of product rather than on every call of every step.
// Host arithmetic only, with no CUDA header, so the CPU tests check it; the algorithm
// type is a parameter (cublasLtMatmulAlgo_t in the module).
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "dufu/trainer/device/device.h"

namespace dufu::trainer::cuda {

// What cuBLASLt is told of an operand's alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*
// _BYTES): the largest power of two that divides its address, at most
// kTensorAlignmentBytes (cuBLASLt's default assumption, which a tensor not so aligned
// would break with NOT_SUPPORTED or a misaligned address).
constexpr std::uint32_t operand_alignment_bytes(std::uintptr_t address) {
  if (address == 0) return kTensorAlignmentBytes;  // an absent operand constrains nothing
  const std::uintptr_t lowest_bit = address & (~address + 1);
  return lowest_bit >= kTensorAlignmentBytes ? static_cast<std::uint32_t>(kTensorAlignmentBytes)
                                             : static_cast<std::uint32_t>(lowest_bit);
}
inline std::uint32_t operand_alignment_bytes(const void* pointer) {
  return operand_alignment_bytes(reinterpret_cast<std::uintptr_t>(pointer));
}

// Everything the heuristic's answer depends on: cuBLASLt's A, B and D (out, also its
// C) by shape, transposition and type, the epilogue with its inputs, and alignment,
// the epilogue's bias and aux vectors' too (the heuristic sees their pointers; an
// answer for a 256-byte-aligned bias is not one for a bias a few floats into a buffer).
struct LtProductKey {
  int rows = 0, inner = 0, cols = 0;
  bool a_transposed = false, b_transposed = false;
  int input_type = 0, output_type = 0;  // cudaDataType_t
  int epilogue = 0;                     // cublasLtEpilogue_t
  std::uint32_t bias_alignment = 0, aux_alignment = 0;  // 0: no such input
  std::uint32_t a_alignment = 0, b_alignment = 0, out_alignment = 0;
  auto operator<=>(const LtProductKey&) const = default;
};

// The algorithm chosen for each key, or nullopt where the heuristic had none (asked
// once too: the caller's fallback then costs no heuristic either). One stream and one
// thread use the device's matmuls, so there is no lock.
template <typename Algorithm>
class LtAlgorithmCache {
 public:
  // The kept answer for `key`, or choose() asked once and its answer kept. An error
  // thrown by choose() keeps nothing.
  template <typename Choose>
  const std::optional<Algorithm>& find_or_choose(const LtProductKey& key, Choose&& choose) {
    const auto found = answers_.find(key);
    if (found != answers_.end()) return found->second;
    std::optional<Algorithm> answer = std::forward<Choose>(choose)();
    return answers_.emplace(key, std::move(answer)).first->second;
  }
  std::size_t size() const { return answers_.size(); }

 private:
  std::map<LtProductKey, std::optional<Algorithm>> answers_;
};

}  // namespace dufu::trainer::cuda
