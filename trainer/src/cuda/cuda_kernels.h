// The CUDA backend's kernels: the implementations behind the CUDA device's
// KernelTable (kernel_table.h documents each op). Every pointer is device memory of
// the current device; every function enqueues its work on the device's stream and
// returns (download() and synchronize() wait). Launch geometry and the order of every
// reduction are fixed by the sizes alone (kernel_partition.h), and no reduction uses
// floating-point atomics, so a run repeated gives the same bits. Checks of targets and
// token ids are the caller's (GPT checks them on the host before any kernel).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "device/kernel_list.h"
#include "dufu/common/log.h"
#include "dufu/trainer/device/kernel_table.h"
#include "lt_object.h"
#include "once_per_kind.h"

namespace dufu::trainer::cuda {

// One function per op of the table, with the entry's type (kernel_list.h).
DUFU_KERNEL_OPS(DUFU_DECLARE_KERNEL)

const KernelTable& kernel_table();

// An fp32 result already in out.values kept as TensorOut says: under bf16 rounded in
// place, its bits stored when asked for (one pass, store_bf16's); fp32 untouched.
void keep(TensorOut out, std::size_t count);

// The stream and the cuBLAS(Lt) handles every kernel of this backend uses (created on
// first use, on the current device).
cudaStream_t stream();
void* cublaslt_handle();  // cublasLtHandle_t
void* cublas_handle();    // cublasHandle_t
// Scratch for cuBLASLt and cuBLAS (cuda_scratch.h's kMatmulWorkspaceBytes, allocated
// once with the handles).
void* matmul_workspace();

// Returns when the stream's work is done: cudaStreamSynchronize, or, while a watcher
// is set (NCCL communicators exist), stream_wait.h's polling with the watcher as the
// check, so a communicator's asynchronous error ends the wait instead of a hang.
void wait_for_stream();
// The check a wait runs between polls (throws on a failure), or nullptr for none.
void set_stream_watcher(void (*check)());
// Bounds every watched wait: after `seconds` (> 0) of waiting, timed_out(the seconds
// waited) runs instead of another poll, and throws.
void set_stream_wait_bound(double seconds, void (*timed_out)(double waited_seconds));

// A line in this process's log (device.cc hands the module its log when it loads it;
// before that, nothing is written).
void log_line(LogLevel level, const std::string& message);
void set_log(void (*log)(LogLevel level, const char* subsystem, const char* message));
// Logs `message` as a warning the first time `kind` happens in this process.
void note_fallback(FusedFallback kind, const std::string& message);

// The most dynamic shared memory a block may opt into on this process's GPU
// (cudaDevAttrMaxSharedMemoryPerBlockOptin, asked once); and the check of a launch
// against it (shared_memory_limit.h; head_size as the kernel pads it), throwing
// dufu::Error in words.
int shared_memory_per_block_limit();
void require_shared_memory(const char* kernel, int head_size, int bytes);

// Bytes the grow-only scratch (block_reduce.cuh) holds now.
std::size_t scratch_capacity();

void fill(float* destination, float value, std::size_t count);

// One product through cuBLASLt, in row-major terms: out [rows, cols] = op(a) [rows, inner]
// · op(b) [inner, cols], a stored [rows, inner] or, transposed, [inner, rows]; b stored
// [inner, cols] or, transposed, [cols, inner]. matmul_forward's is a = x, b = weight
// transposed; the dx of a backward is a = dout, b = weight. a and b are of input_type,
// out of output_type (CUDA_R_32F or CUDA_R_16BF each); out is overwritten.
struct LtProduct {
  void* out;
  const void* a;
  const void* b;
  int rows, inner, cols;
  bool a_transposed = false;
  bool b_transposed = false;
  cudaDataType_t input_type = CUDA_R_32F;
  cudaDataType_t output_type = CUDA_R_32F;
  // DEFAULT; BIAS adding bias [cols] (of the output's type, as cuBLASLt wants it);
  // GELU_AUX_BIAS also writing the pre-activation to aux; DGELU multiplying the
  // product by gelu'(aux) (the backward through a GELU whose input aux is). aux is
  // [rows, cols] of the output's type and cols a multiple of 8 for both.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
};

// `product` made ready for cuBLASLt: its descriptors, and the algorithm chosen for
// its key (lt_algorithm_choice.h: shape, layout, epilogue, types and the operands'
// real alignment, which cuBLASLt is told), from the device's cache or asked of the
// heuristic once, accumulated in fp32 without split-K reductions so every sum keeps
// one order. A heuristic that fails (any status but success or NOT_SUPPORTED, or an
// answer not in state success) throws with the status's name; one that has no
// algorithm leaves has_algorithm() false and says why in no_algorithm_reason().
class LtCall {
 public:
  explicit LtCall(const LtProduct& product);
  bool has_algorithm() const { return algorithm_.has_value(); }
  const std::string& no_algorithm_reason() const { return no_algorithm_reason_; }
  // Enqueues the product (only when has_algorithm()); again for every launch wanted.
  void launch() const;

 private:
  LtProduct product_;
  LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> operation_;
  LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> lt_a_, lt_b_, d_;
  std::optional<cublasLtMatmulAlgo_t> algorithm_;
  std::string no_algorithm_reason_;
};

// LtCall(product).launch(); false when cuBLASLt has no algorithm (nothing launched),
// with the reason in `reason` unless it is null.
bool lt_matmul(const LtProduct& product, std::string* reason = nullptr);

// "bf16 x bf16 -> fp32 [N, C] x [C, OC]^T with epilogue BIAS, alignment 4/256/256
// bytes": the product for messages.
std::string describe_lt_product(const LtProduct& product);

// The linear layers' cuBLASLt products, for fp32 or bf16 operands (input_type; fp32
// outputs). linear_product: out [N, OC] = x [N, C] · weight [OC, C]^T, plus bias unless
// null; throws naming the product and cuBLASLt's answer when it has no algorithm.
// linear_gelu_product: the same with the bias and the GELU epilogue: pre = that sum
// and out = gelu(pre). gelu_input_grad_product: dpre [N, C] = gelu'(pre) ⊙ (dout
// [N, OC] · weight [OC, C]), the DGELU epilogue. The two epilogues return false when
// the width is not a multiple of 8 or cuBLASLt has no algorithm: the caller then runs
// the unfused kernels, and the first fallback of each kind is logged.
void linear_product(float* out, const void* x, const void* weight, const float* bias, int N, int C, int OC,
                    cudaDataType_t input_type);
bool linear_gelu_product(float* out, float* pre, const void* x, const void* weight, const float* bias, int N, int C,
                         int OC, cudaDataType_t input_type);
bool gelu_input_grad_product(float* dpre, const void* dout, const void* weight, const float* pre, int N, int C, int OC,
                             cudaDataType_t input_type);

// bits[i] = bf16.h's float_to_bf16_bits(values[i]): the bf16 copy of values the recipe
// has already rounded (exact for them), for the matmuls that take bf16 operands.
void to_bf16_bits(std::uint16_t* bits, const float* values, std::size_t n);

// d[i] *= gelu'(pre[i]) for i < n: the GELU's backward where no epilogue fused it.
void multiply_by_gelu_grad(float* d, const float* pre, std::size_t n);

// FLOP/s of a bf16 cuBLASLt GEMM [rows, inner] x [inner, cols] (fp32 accumulation),
// best of repeated runs over about `seconds` (gemm_rate.cu).
double bf16_gemm_flops(int rows, int inner, int cols, double seconds);

}  // namespace dufu::trainer::cuda

#include "dufu/trainer/device/device.h"

namespace dufu::trainer::cuda {
// Whether a CUDA device can be used here (the driver answers and has a device), and
// the process's CUDA device.
DeviceAvailability availability();
Device& device();
}  // namespace dufu::trainer::cuda
