// Naming devices and finding out which can run here.
#include "dufu/trainer/device.h"

#include "dufu/common/error.h"

namespace dufu::trainer {

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
    case DeviceKind::kCuda:
      return {false, "this build of dufu has no CUDA backend (the CPU is its only device)"};
  }
  return {false, "unknown device kind"};
}

Device& device_of_kind(DeviceKind kind) {
  const DeviceAvailability availability = device_availability(kind);
  if (!availability.available) DUFU_FAIL("device ", device_kind_name(kind), " is not available: ", availability.reason);
  return cpu_device();
}

}  // namespace dufu::trainer
