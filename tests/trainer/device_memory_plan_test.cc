// The device memory plan (training_memory.h): a plan that does not fit the device's
// memory is refused naming what to change; the CPU device's capacity is the host's
// limit. Hand-computed sizes.
#include <gtest/gtest.h>

#include <string>

#include "dufu/common/error.h"
#include "dufu/trainer/device.h"
#include "dufu/trainer/training_memory.h"

namespace dufu::trainer {
namespace {

TEST(DeviceMemoryPlanTest, APlanThatDoesNotFitIsRefusedNamingTheKnobs) {
  // 1000 parameters: 4000 bytes each of weights and gradients, 8000 of moments, plus
  // 10000 of activations = 26000 bytes.
  const MemoryPlan plan = memory_plan(1000.0, 1, false, false, 10000.0);
  EXPECT_DOUBLE_EQ(plan.total(), 26000.0);
  EXPECT_NO_THROW(check_plan_fits_device(plan, 26000.0, "test device"));
  try {
    check_plan_fits_device(plan, 25999.0, "test device");
    FAIL() << "a plan of 26000 bytes fitted into 25999";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part : {"does not fit test device", "train.micro_batch", "model.seq_length", "dist.zero_stage",
                             "dist.tensor_parallel_size", "dist.pipeline_parallel_size"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(DeviceMemoryPlanTest, CpuCapacityIsTheHostLimit) {
  EXPECT_EQ(cpu_device().memory_capacity_bytes(), memory_limit_bytes());
  EXPECT_GT(cpu_device().memory_capacity_bytes(), 0.0);
}

}  // namespace
}  // namespace dufu::trainer
