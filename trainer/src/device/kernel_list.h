// The ops of the KernelTable (kernel_table.h), listed once for the backends: a
// backend's header includes this inside its namespace to declare one function per op
// with the table entry's exact type, and fills its table with DUFU_KERNEL_TABLE_ENTRIES,
// so an op added to the table is a compile error in every backend until each defines it.
#pragma once

#include <type_traits>

#include "dufu/common/error.h"
#include "dufu/trainer/device/kernel_table.h"

#define DUFU_KERNEL_OPS(X)                 \
  X(embedding_forward)                     \
  X(embedding_backward)                    \
  X(vocab_parallel_embedding_forward)      \
  X(vocab_parallel_embedding_backward)     \
  X(layernorm_forward)                     \
  X(residual_layernorm_forward)            \
  X(layernorm_backward)                    \
  X(matmul_forward)                        \
  X(matmul_backward)                       \
  X(bias_gelu_forward)                     \
  X(matmul_bias_gelu_forward)              \
  X(matmul_gelu_backward)                  \
  X(attention_forward)                     \
  X(attention_backward)                    \
  X(classifier_forward_backward)           \
  X(vocab_parallel_classifier_max)         \
  X(vocab_parallel_classifier_exp_sum)     \
  X(vocab_parallel_classifier_finish)      \
  X(sum_of_squares)                        \
  X(scale_in_place)                        \
  X(adamw_update)                          \
  X(add)                                   \
  X(masked_mean_loss)                      \
  X(round_to_bf16)                         \
  X(store_bf16)                            \
  X(load_bf16)                             \
  X(to_bf16)                               \
  X(rmsnorm_forward)                       \
  X(residual_rmsnorm_forward)              \
  X(rmsnorm_backward)                      \
  X(rotary_forward)                        \
  X(rotary_backward)                       \
  X(swiglu_forward)                        \
  X(swiglu_backward)

// One declaration: `void embedding_forward(float*, ...);` with the table entry's type.
#define DUFU_DECLARE_KERNEL(name) std::remove_pointer_t<decltype(::dufu::trainer::KernelTable::name)> name;
// One designated initializer: `.embedding_forward = embedding_forward,`.
#define DUFU_KERNEL_TABLE_ENTRY(name) .name = name,

namespace dufu::trainer {

// Whether an entry's TensorIn operands are bf16 (true) or fp32 (false), for a backend
// to read them the one way; a null operand takes the other's type, and a mix throws
// (kernel_table.h).
inline bool bf16_operands(const char* entry, TensorIn a, TensorIn b) {
  if (a.data == nullptr) return b.bf16();
  if (b.data != nullptr && a.type != b.type) {
    DUFU_FAIL(entry, ": operands of two element types, ", a.bf16() ? "bf16" : "fp32", " and ",
              b.bf16() ? "bf16" : "fp32");
  }
  return a.bf16();
}

}  // namespace dufu::trainer
