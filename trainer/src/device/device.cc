// Naming devices, finding out which can run here, and loading the CUDA device's
// module when one is asked for.
#include "dufu/trainer/device/device.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "cuda_module.h"
#include "dufu/common/error.h"
#include "dufu/common/launch_environment.h"
#include "dufu/common/log.h"

namespace dufu::trainer {

namespace {

#if defined(DUFU_CUDA_MODULE)
// The module's lines (a fused epilogue's fallback, ...) go to this process's log: the
// module does not link dufu_common, so it is handed this function when it loads.
void log_for_module(LogLevel level, const char* subsystem, const char* message) {
  if (log_enabled(level)) log_message(level, subsystem, message);
}
#endif

// The CUDA device's module, loaded once: its entry points, or why there are none.
struct CudaModuleLoad {
  const CudaModule* module = nullptr;
  std::string reason;
};

const CudaModuleLoad& cuda_module() {
  static const CudaModuleLoad load = [] {
    CudaModuleLoad result;
#if defined(DUFU_CUDA_MODULE)
    const char* override_path = std::getenv("DUFU_CUDA_MODULE");
    const std::string path = override_path != nullptr && *override_path != '\0' ? override_path : DUFU_CUDA_MODULE;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      result.reason = str_cat("cannot load the CUDA device module '", path, "': ", ::dlerror());
      return result;
    }
    const auto entry = reinterpret_cast<CudaModuleEntry>(::dlsym(handle, kCudaModuleEntry));
    if (entry == nullptr) {
      result.reason = str_cat("'", path, "' is not dufu's CUDA device module (no ", kCudaModuleEntry, ")");
      return result;
    }
    result.module = entry();
    result.module->set_log(log_for_module);
#else
    result.reason = "this build of dufu has no CUDA backend (configured without a CUDA compiler, or DUFU_CUDA=OFF)";
#endif
    return result;
  }();
  return load;
}

#if defined(DUFU_CUDA_MODULE)
// The CUDA runtime reaches a GPU only through the driver's libcuda.so.1, which it
// loads by this name: where that cannot be loaded no GPU can be used, which is found
// out without mapping the module and the cuBLAS it links (tens of milliseconds, paid by
// every GPU test that skips on a machine without one). Empty when the driver loads.
std::string missing_cuda_driver() {
  static const std::string reason = [] {
    void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver != nullptr) {
      ::dlclose(driver);
      return std::string();
    }
    return str_cat("no CUDA driver on this machine (", ::dlerror(), ")");
  }();
  return reason;
}
#endif

}  // namespace

const CudaModule* loaded_cuda_module(std::string* reason) {
  const CudaModuleLoad& load = cuda_module();
  if (load.module == nullptr && reason != nullptr) *reason = load.reason;
  return load.module;
}

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda";
  }
  return "unknown";
}

DeviceKind parse_device_kind(std::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  DUFU_FAIL("unknown device '", name, "'; HINT: the devices are cpu and cuda");
}

DeviceAvailability device_availability(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu: return {true, ""};
    case DeviceKind::kCuda: {
#if defined(DUFU_CUDA_MODULE)
      if (const std::string missing = missing_cuda_driver(); !missing.empty()) return {false, missing};
#endif
      const CudaModuleLoad& load = cuda_module();
      if (load.module == nullptr) return {false, load.reason};
      return load.module->availability();
    }
  }
  return {false, "unknown device kind"};
}

Device& device_of_kind(DeviceKind kind) {
  const DeviceAvailability availability = device_availability(kind);
  if (!availability.available) DUFU_FAIL("device ", device_kind_name(kind), " is not available: ", availability.reason);
  if (kind == DeviceKind::kCuda) {
    const GpuChoice gpu = gpu_for_this_process();
    if (gpu.ordinal < 0) DUFU_FAIL("device cuda: ", gpu.refusal);
    const CudaModule& module = *cuda_module().module;
    module.select_device(gpu.ordinal);
    return module.device();
  }
  return cpu_device();
}

GpuChoice choose_gpu(int local_rank, int visible_gpus, bool visible_devices_set) {
  if (visible_gpus < 1) return {-1, "this process sees no GPU"};
  // A launcher that hands each rank its own GPU through CUDA_VISIBLE_DEVICES (Slurm's
  // --gpus-per-task, a wrapper script) leaves local rank 3 seeing one GPU, ordinal 0.
  if (visible_devices_set) return {local_rank % visible_gpus, ""};
  // NCCL refuses two ranks of one communicator on the same GPU, so more ranks on a
  // machine than GPUs is refused here, in words, rather than deep inside NCCL.
  if (local_rank < visible_gpus) return {local_rank, ""};
  return {-1, str_cat("one GPU per rank: this process is local rank ", local_rank, " of its machine, which has ",
                      visible_gpus, " GPU", visible_gpus == 1 ? "" : "s",
                      "; HINT: start at most as many ranks per machine as it has GPUs, or give each rank its own "
                      "GPU through CUDA_VISIBLE_DEVICES")};
}

GpuChoice gpu_for_this_process() {
  const DeviceAvailability cuda = device_availability(DeviceKind::kCuda);
  if (!cuda.available) return {-1, cuda.reason};
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return choose_gpu(detect_launch_environment().local_rank, cuda_module().module->device_count(), visible != nullptr);
}

DeviceAvailability agree_on_availability(Communicator& ranks, const DeviceAvailability& own) {
  // The lowest rank that cannot, or size() when every rank can; then its reason.
  const int size = ranks.size();
  const int failing = ranks.all_reduce_value<std::int32_t>(own.available ? -size : -ranks.rank(), ReduceOp::kMax);
  if (failing == -size) return {true, ""};
  const int first = -failing;
  std::int64_t length = first == ranks.rank() ? static_cast<std::int64_t>(own.reason.size()) : 0;
  ranks.broadcast(std::span<std::int64_t>(&length, 1), first);
  std::vector<std::uint8_t> reason(static_cast<std::size_t>(length));
  if (first == ranks.rank()) reason.assign(own.reason.begin(), own.reason.end());
  ranks.broadcast(reason, first);
  const std::string text(reason.begin(), reason.end());
  return {false, size == 1 ? text : str_cat("rank ", first, " of ", size, ": ", text)};
}

double measure_cuda_bf16_gemm_flops(int rows, int inner, int cols, double seconds) {
  device_of_kind(DeviceKind::kCuda);  // throws the reason when there is no CUDA device
  return cuda_module().module->bf16_gemm_flops(rows, inner, cols, seconds);
}

}  // namespace dufu::trainer
