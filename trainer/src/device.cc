// Naming devices, finding out which can run here, and loading the CUDA device's
// module when one is asked for.
#include "dufu/trainer/device.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "cuda/cuda_module.h"
#include "dufu/common/error.h"
#include "dufu/common/launch_environment.h"
#include "dufu/trainer/flops.h"

namespace dufu::trainer {

namespace {

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
#else
    result.reason = "this build of dufu has no CUDA backend (configured without a CUDA compiler, or DUFU_CUDA=OFF)";
#endif
    return result;
  }();
  return load;
}

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
    // One GPU per process: the launcher's local rank picks it among this machine's GPUs.
    // NCCL refuses two ranks of one communicator on the same GPU, so more ranks on a
    // machine than GPUs is refused here, in words, rather than deep inside NCCL.
    const CudaModule& module = *cuda_module().module;
    const int local_rank = detect_launch_environment().local_rank;
    const int gpus = module.device_count();
    if (local_rank >= gpus) {
      DUFU_FAIL("device cuda needs one GPU per rank: this process is local rank ", local_rank,
                " of its machine, which has ", gpus, " GPU", gpus == 1 ? "" : "s",
                "; HINT: start at most as many ranks per machine as it has GPUs");
    }
    module.select_device(local_rank);
    return module.device();
  }
  return cpu_device();
}

double measure_cuda_bf16_gemm_flops(int rows, int inner, int cols, double seconds) {
  device_of_kind(DeviceKind::kCuda);  // throws the reason when there is no CUDA device
  return cuda_module().module->bf16_gemm_flops(rows, inner, cols, seconds);
}

}  // namespace dufu::trainer
