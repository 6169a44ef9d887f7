// The device memory plan (training_memory.h): a plan that does not fit the device's
// memory is refused naming what to change; the CPU device's capacity is the host's
// limit; the plan holds the scratch the device says a step needs. Hand-computed sizes.
#include <gtest/gtest.h>

#include <string>

#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/run/training_memory.h"
#include "support/forwarding_cpu_device.h"
#include "support/gpt_fixture.h"

namespace dufu::trainer {
namespace {

TEST(DeviceMemoryPlanTest, APlanThatDoesNotFitIsRefusedNamingTheKnobs) {
  // 1000 parameters: 4000 bytes each of weights and gradients, 8000 of moments, plus
  // 10000 of activations = 26000 bytes.
  const MemoryPlan plan = memory_plan(1000.0, 1, 0, false, 10000.0);
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

// A device whose own scratch is a fixed size, which notes what it was asked about.
class ScratchReportingDevice final : public dufu::testing::ForwardingCpuDevice {
 public:
  explicit ScratchReportingDevice(double scratch) : scratch_(scratch) {}
  double scratch_bytes(const StepShapes& shapes) const override {
    asked_ = shapes;
    return scratch_;
  }
  const StepShapes& asked() const { return asked_; }

 private:
  double scratch_;
  mutable StepShapes asked_;
};

GPTConfig plan_model() {
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 100, .vocab_multiple = 16, .seq_length = 8});
}

TEST(DeviceMemoryPlanTest, ThePlanHoldsTheScratchTheDeviceReports) {
  ScratchReportingDevice device(1e6);
  const MemoryPlan plan = rank_memory_plan(plan_model(), 4, 8, 2, 1, {}, 1, 0, Precision::kBf16, 0, device);
  EXPECT_DOUBLE_EQ(plan.scratch, 1e6);
  EXPECT_DOUBLE_EQ(plan.total(), plan.model() + plan.activations + 1e6 + plan.save_staging);  // a host device
  EXPECT_NE(plan.describe(1e9).find(", device scratch 1.00 MB: "), std::string::npos) << plan.describe(1e9);
  // What the device was asked: tensor parallel 2 over 32 channels, 32 rows, this
  // rank's 64 of the 128 padded vocabulary ids (a multiple of 16 x 2 ranks).
  const StepShapes& asked = device.asked();
  EXPECT_EQ(asked.rows, 32);
  EXPECT_EQ(asked.width, 32);
  EXPECT_EQ(asked.parameters, static_cast<std::int64_t>(rank_parameter_count(plan_model(), 2, {})));
  EXPECT_TRUE(asked.bf16_operands);
  EXPECT_EQ(asked.attention_row_heads, 32) << "32 rows x this rank's 1 of 2 heads";
  ASSERT_EQ(asked.matmuls.size(), 5u);
  const MatmulShape expected[] = {{32, 32, 48, true}, {32, 16, 32, true}, {32, 32, 64, true}, {32, 64, 32, true},
                                  {32, 32, 64, false}};
  for (std::size_t i = 0; i < asked.matmuls.size(); ++i) {
    EXPECT_EQ(asked.matmuls[i].rows, expected[i].rows) << i;
    EXPECT_EQ(asked.matmuls[i].inputs, expected[i].inputs) << i;
    EXPECT_EQ(asked.matmuls[i].outputs, expected[i].outputs) << i;
    EXPECT_EQ(asked.matmuls[i].bias, expected[i].bias) << i;
  }
  // A plan that fits without the scratch but not with it is refused, naming it.
  try {
    check_plan_fits_device(plan, plan.total() - 1.0, "test device");
    FAIL() << "the scratch was left out of the check";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device scratch"), std::string::npos) << e.what();
  }
}

TEST(DeviceMemoryPlanTest, CpuScratchIsTheLargestWidenedProductUnderBf16) {
  // The CPU's bf16 matmuls widen x [N, C] and weight [OC, C] to floats: the MLP's down
  // projection, x [32, 128] and weight [32, 128], is the largest at tensor parallel 1
  // (the LM head's x [32, 32] and weight [112, 32] are 4608 floats).
  const StepShapes shapes = training_step_shapes(plan_model(), 4, 8, 1, {}, Precision::kBf16, 1000.0);
  EXPECT_DOUBLE_EQ(cpu_device().scratch_bytes(shapes), 4.0 * (32 + 32) * 128);
  const StepShapes fp32 = training_step_shapes(plan_model(), 4, 8, 1, {}, Precision::kFp32, 1000.0);
  EXPECT_DOUBLE_EQ(cpu_device().scratch_bytes(fp32), 0.0);
}

}  // namespace
}  // namespace dufu::trainer
