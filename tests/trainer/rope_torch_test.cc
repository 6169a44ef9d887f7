// The rotary embedding kernels against HuggingFace Llama's formula run in torch
// (tests/reference/rope_reference.py: LlamaRotaryEmbedding and apply_rotary_pos_emb
// written out, float32): rotary_forward against its output, rotary_backward against
// autograd's gradient, with grouped-query heads (8 query heads over 2 K/V heads),
// hs = 64, Llama 2's theta and 300 positions, where a wrong pairing, frequency or
// sign is far outside the tolerance.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/npy.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/kernel_table.h"
#include "kernel_test_support.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::trainer {
namespace {

using testing::DeviceArgs;
using testing::kTestDevices;
using testing::TestDevice;
using testing::Tolerance;
using testing::widen;

constexpr int kB = 2, kT = 300, kNH = 8, kNKV = 2, kHs = 64;
constexpr float kTheta = 10000.0f;
constexpr std::size_t kWidth = static_cast<std::size_t>(kNH + 2 * kNKV) * kHs;
constexpr std::size_t kSize = static_cast<std::size_t>(kB) * kT * kWidth;
// Both sides form inv_freq and the angle in float with HF's roundings (llama_math.h),
// so only the last ulp of cos and sin may differ (2.4e-7 here); an inv_freq rounded
// differently moves the angle at t = 299 by ~1e-5 rad, about 100 times that.
constexpr Tolerance kTolerance{3e-6, 1e-6};

struct TorchRope {
  std::vector<float> qkv, w, rotated, grad;
  std::string error;
};

std::vector<float> read_floats(const std::string& path) {
  const NpyArray array = NpyArray::open(path);
  const auto values = array.view<float>();
  return {values.begin(), values.end()};
}

const TorchRope& torch_rope() {
  static const TorchRope result = [] {
    TorchRope r;
    r.qkv = testing::random_floats(kSize, 90, -2.0f, 2.0f);
    r.w = testing::random_floats(kSize, 91);
    dufu::testing::TempDir dir;
    // [B T, width]: npy.h writes two dimensions at most.
    const std::vector<std::uint64_t> shape{static_cast<std::uint64_t>(kB) * kT, kWidth};
    write_npy(dir.file("qkv.npy"), std::span<const float>(r.qkv), shape);
    write_npy(dir.file("w.npy"), std::span<const float>(r.w), shape);
    const std::string command =
        str_cat(DUFU_REFERENCE_PYTHON, " ", DUFU_SOURCE_DIR, "/tests/reference/rope_reference.py --dir ",
                dufu::testing::shell_quote(dir.path()), " --batch ", kB, " --n-head ", kNH, " --n-kv-head ", kNKV, " --head-size ", kHs,
                " --theta ", kTheta);
    const dufu::testing::CommandResult run = dufu::testing::run_command(command);
    if (run.exit_code != 0) {
      r.error = "reference failed: " + command + "\n" + run.output;
      return r;
    }
    r.rotated = read_floats(dir.file("rotated.npy"));
    r.grad = read_floats(dir.file("grad.npy"));
    return r;
  }();
  return result;
}

class RopeTorch : public ::testing::TestWithParam<TestDevice> {};

TEST_P(RopeTorch, ForwardAndBackwardMatchHuggingFaceLlama) {
  const DeviceAvailability availability = device_availability(GetParam().kind);
  if (!availability.available) GTEST_SKIP() << GetParam().name << " skipped: " << availability.reason;
  const TorchRope& want = torch_rope();
  ASSERT_TRUE(want.error.empty()) << want.error;
  ASSERT_EQ(want.rotated.size(), kSize);
  ASSERT_EQ(want.grad.size(), kSize);

  Device& device = device_of_kind(GetParam().kind);
  std::vector<float> rotated = want.qkv, grad = want.w;
  DeviceArgs d(device);
  device.kernels().rotary_forward(d.out(rotated), nullptr, kB, kT, kNH, kNKV, kHs, kTheta);
  device.kernels().rotary_backward(d.out(grad), nullptr, kB, kT, kNH, kNKV, kHs, kTheta);
  d.finish();
  const std::string name = GetParam().name;
  testing::report_close(name + " rotary_forward vs torch", widen(rotated), widen(want.rotated), kTolerance);
  testing::report_close(name + " rotary_backward vs torch autograd", widen(grad), widen(want.grad), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Devices, RopeTorch, ::testing::ValuesIn(kTestDevices),
                         [](const ::testing::TestParamInfo<TestDevice>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace dufu::trainer
