// The CUDA device's module (libdufu_cuda.so) loads in a build that has it: with no GPU
// here the reason must be the driver's answer, never a module that failed to load (an
// undefined symbol, such as the type information of a Device with an out-of-line key
// function, would make every machine, GPUs included, report "cannot load").
#include <gtest/gtest.h>

#include <string>

#include "dufu/trainer/device/device.h"

namespace dufu::trainer {
namespace {

TEST(CudaModuleTest, LoadsInABuildWithTheCudaBackend) {
#if DUFU_TEST_CUDA_BUILT
  const DeviceAvailability cuda = device_availability(DeviceKind::kCuda);
  if (cuda.available) return;
  EXPECT_EQ(cuda.reason.find("cannot load"), std::string::npos) << cuda.reason;
  EXPECT_EQ(cuda.reason.find("not dufu's CUDA device module"), std::string::npos) << cuda.reason;
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

}  // namespace
}  // namespace dufu::trainer
