// The golden end-to-end test of the GPT model: a small GPT-2 gets the same weights and
// batch as the PyTorch model in tests/reference/gpt_torch_reference.py, and the loss,
// the logits, every parameter gradient and ten AdamW losses must agree. It is the
// test that catches a kernel wired to the wrong buffer, a missed accumulation or a
// transposed weight, which each kernel's own test cannot see. A few model-level
// checks (config errors, layout, initialisation) come first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/common/npy.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/float_compare.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::trainer::AdamW;
using dufu::trainer::AdamWOptions;
using dufu::trainer::GPT;
using dufu::trainer::GPTConfig;
using dufu::trainer::ParamTensor;

constexpr int kB = 4;
constexpr int kT = 32;

GPTConfig small_config() {
  // vocab_size 500 is padded to 512.
  return dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 4, .d_model = 64, .vocab_size = 500, .vocab_multiple = 128, .seq_length = kT});
}

// AdamW settings shared with the reference through its command line.
struct AdamWSettings {
  int steps = 10;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

using Batch = dufu::testing::TokenBatch;

// Targets are the next token, as in language modelling, with some positions ignored
// (-1) so the test covers the mean over non-ignored targets: the first five of row 1
// and the last of row 3.
Batch make_batch(int vocab_size) {
  return dufu::testing::next_token_batch(kB, kT, vocab_size, 7, {kT, kT + 1, kT + 2, kT + 3, kT + 4, 4 * kT - 1});
}

std::vector<float> read_floats(const std::string& path, std::size_t expected_size) {
  const dufu::NpyArray array = dufu::NpyArray::open(path);
  const auto values = array.view<float>();
  if (values.size() != expected_size) {
    ADD_FAILURE() << path << " holds " << values.size() << " floats, expected " << expected_size;
  }
  return {values.begin(), values.end()};
}

void write_int32(const std::string& path, const std::vector<std::int32_t>& values) {
  dufu::write_npy(path, std::span<const std::int32_t>(values), {kB, kT});
}

using dufu::testing::Difference;
using dufu::testing::relative_error;
using dufu::testing::tensor_difference;

// fp32 tolerances. Both sides sum the same terms in different orders; on the
// reference machine the errors were ~1e-7 (loss, logits, AdamW losses) and at most
// ~6e-7 of each gradient tensor's scale, so these leave a margin of 20-100x while a
// wiring mistake is off by orders of magnitude more, and weight decay 1.5x too
// strong already moves the tenth AdamW loss by 8e-5.
constexpr double kLossRelTolerance = 1e-5;
constexpr double kLogitsScaledTolerance = 1e-5;
constexpr double kGradScaledTolerance = 2e-5;
constexpr double kAdamWLossRelTolerance = 1e-5;

// The reference run, shared by the tests: weights, batch and torch's results.
class GPTTorchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<dufu::testing::TempDir>();
    model_ = std::make_unique<GPT>(small_config());
    model_->init_gpt2(1234);
    batch_ = make_batch(small_config().vocab_size);

    std::filesystem::create_directories(dir_->file("params"));
    for (const ParamTensor& tensor : model_->parameter_tensors()) {
      std::vector<std::uint64_t> shape(tensor.shape.begin(), tensor.shape.end());
      dufu::write_npy(dir_->file("params/" + tensor.name + ".npy"),
                      std::span<const float>(model_->params().subspan(tensor.offset, tensor.size())), shape);
    }
    write_int32(dir_->file("tokens.npy"), batch_.tokens);
    write_int32(dir_->file("targets.npy"), batch_.targets);

    const AdamWSettings adamw;
    const std::string command = dufu::str_cat(
        DUFU_REFERENCE_PYTHON, " ", DUFU_SOURCE_DIR, "/tests/reference/gpt_torch_reference.py --dir ",
        dufu::testing::shell_quote(dir_->path()), " --n-head ", small_config().n_head, " --vocab-size ",
        small_config().vocab_size, " --steps ", adamw.steps, " --lr ", adamw.lr, " --beta1 ", adamw.beta1,
        " --beta2 ", adamw.beta2, " --eps ", adamw.eps, " --weight-decay ", adamw.weight_decay);
    const dufu::testing::CommandResult result = dufu::testing::run_command(command);
    reference_error_ = result.exit_code == 0 ? "" : "reference failed: " + command + "\n" + result.output;
  }

  static void TearDownTestSuite() {
    model_.reset();
    dir_.reset();
  }

  void SetUp() override {
    ASSERT_TRUE(reference_error_.empty()) << reference_error_;
    // Each test starts from the weights the reference got.
    model_->init_gpt2(1234);
    model_->zero_grad();
  }

  static std::string out(const std::string& name) { return dir_->file("out/" + name); }
  static std::size_t rows() { return static_cast<std::size_t>(kB * kT); }

  // Every parameter gradient against torch's, one line per tensor.
  static void expect_gradients_match(const GPT& model, const char* label) {
    std::printf("%-28s %12s %12s %12s %12s  [%s]\n", "gradient", "max|ref|", "max abs err", "scaled err",
                "max rel err", label);
    for (const ParamTensor& tensor : model.parameter_tensors()) {
      const std::vector<float> want = read_floats(out("grads/" + tensor.name + ".npy"), tensor.size());
      const Difference diff = tensor_difference(model.grads().subspan(tensor.offset, tensor.size()), want);
      std::printf("%-28s %12.3e %12.3e %12.3e %12.3e\n", tensor.name.c_str(), diff.scale, diff.max_abs,
                  diff.scaled(), diff.max_rel);
      EXPECT_LE(diff.scaled(), kGradScaledTolerance) << tensor.name << ": max abs error " << diff.max_abs
                                                      << " against max |grad| " << diff.scale;
    }
  }

  static std::unique_ptr<dufu::testing::TempDir> dir_;
  static std::unique_ptr<GPT> model_;
  static Batch batch_;
  static std::string reference_error_;
};

std::unique_ptr<dufu::testing::TempDir> GPTTorchTest::dir_;
std::unique_ptr<GPT> GPTTorchTest::model_;
Batch GPTTorchTest::batch_;
std::string GPTTorchTest::reference_error_;

TEST_F(GPTTorchTest, LossAndLogitsMatch) {
  GPT& model = *model_;
  EXPECT_TRUE(std::isnan(model.forward(batch_.tokens, {}, kB, kT)));
  const std::size_t Vp = static_cast<std::size_t>(small_config().padded_vocab_size());
  const Difference logits = tensor_difference(model.logits(), read_floats(out("logits.npy"), rows() * Vp));
  std::printf("logits: max|ref| %.3e max abs err %.3e scaled %.3e max rel %.3e\n", logits.scale, logits.max_abs,
              logits.scaled(), logits.max_rel);
  EXPECT_LE(logits.scaled(), kLogitsScaledTolerance);
  for (std::size_t row = 0; row < rows(); ++row) {
    for (std::size_t col = static_cast<std::size_t>(small_config().vocab_size); col < Vp; ++col) {
      ASSERT_EQ(model.logits()[row * Vp + col], 0.0f) << "padding logit at row " << row << " column " << col;
    }
  }

  const float want = read_floats(out("loss.npy"), 1)[0];
  const float loss = model.forward(batch_.tokens, batch_.targets, kB, kT);
  std::printf("loss: dufu %.8f torch %.8f rel err %.3e\n", loss, want, relative_error(loss, want));
  EXPECT_RELATIVE_NEAR(loss, want, kLossRelTolerance);
  EXPECT_THROW(model.logits(), dufu::Error);  // they are gradients now
}

TEST_F(GPTTorchTest, GradientsMatch) {
  GPT& model = *model_;
  model.forward(batch_.tokens, batch_.targets, kB, kT);
  model.backward();
  expect_gradients_match(model, "one batch");
  EXPECT_THROW(model.backward(), dufu::Error);  // one backward per forward
}

// Two micro-batches of B/2 rows, each scaled by 1 / (non-ignored targets of the
// whole batch), must accumulate to the gradient of the whole batch.
TEST_F(GPTTorchTest, GradientAccumulationMatches) {
  GPT& model = *model_;
  const std::size_t half = rows() / 2;
  const auto valid = std::count_if(batch_.targets.begin(), batch_.targets.end(), [](int t) { return t != -1; });
  double loss_sum = 0;
  for (int micro = 0; micro < 2; ++micro) {
    const auto tokens = std::span<const std::int32_t>(batch_.tokens).subspan(micro * half, half);
    const auto targets = std::span<const std::int32_t>(batch_.targets).subspan(micro * half, half);
    const auto micro_valid = std::count_if(targets.begin(), targets.end(), [](int t) { return t != -1; });
    const float mean = model.forward(tokens, targets, kB / 2, kT, 1.0f / static_cast<float>(valid));
    loss_sum += static_cast<double>(mean) * static_cast<double>(micro_valid);
    model.backward();
  }
  const double want = read_floats(out("loss.npy"), 1)[0];
  EXPECT_RELATIVE_NEAR(loss_sum / static_cast<double>(valid), want, kLossRelTolerance);
  expect_gradients_match(model, "two accumulated micro-batches");
}

TEST_F(GPTTorchTest, AdamWLossesMatch) {
  GPT& model = *model_;
  const AdamWSettings adamw;
  // Weight decay on matrices only, as the reference's parameter groups.
  AdamW optimizer(model, AdamWOptions{.beta1 = adamw.beta1, .beta2 = adamw.beta2, .eps = adamw.eps,
                                      .weight_decay = adamw.weight_decay});
  const std::vector<float> want = read_floats(out("adamw_losses.npy"), static_cast<std::size_t>(adamw.steps));
  std::printf("%-6s %12s %12s %12s\n", "step", "dufu", "torch", "rel err");
  for (int step = 1; step <= adamw.steps; ++step) {
    model.zero_grad();
    const float loss = model.forward(batch_.tokens, batch_.targets, kB, kT);
    model.backward();
    optimizer.step(model.params(), model.grads(), adamw.lr);
    const float expected = want[static_cast<std::size_t>(step - 1)];
    const double rel = relative_error(loss, expected);
    std::printf("%-6d %12.8f %12.8f %12.3e\n", step, loss, expected, rel);
    EXPECT_LE(rel, kAdamWLossRelTolerance) << "step " << step;
  }
  EXPECT_LT(want.back(), want.front()) << "the reference did not learn; the comparison would prove little";
}

// The tolerances are tight enough to see a small real difference: nudging one weight
// by a tenth of its typical size must break the agreement.
TEST_F(GPTTorchTest, ComparisonDetectsAPerturbedWeight) {
  GPT& model = *model_;
  const ParamTensor& tensor = model.tensor("h.1.mlp.c_fc.weight");
  model.params()[tensor.offset + 3] += 0.002f;
  model.forward(batch_.tokens, batch_.targets, kB, kT);
  model.backward();
  const std::vector<float> want = read_floats(out("grads/" + tensor.name + ".npy"), tensor.size());
  const Difference diff = tensor_difference(model.grads().subspan(tensor.offset, tensor.size()), want);
  std::printf("%s after the nudge: scaled err %.3e (tolerance %.1e)\n", tensor.name.c_str(), diff.scaled(),
              kGradScaledTolerance);
  EXPECT_GT(diff.scaled(), kGradScaledTolerance);
}

TEST(GPTModel, ConfigErrorsNameTheField) {
  GPTConfig config = small_config();
  config.n_head = 3;
  try {
    GPT model(config);
    FAIL() << "d_model 64 with 3 heads was accepted";
  } catch (const dufu::Error& error) {
    EXPECT_NE(std::string(error.what()).find("n_head"), std::string::npos) << error.what();
  }
  config = small_config();
  config.seq_length = 0;
  try {
    GPT model(config);
    FAIL() << "seq_length 0 was accepted";
  } catch (const dufu::Error& error) {
    EXPECT_NE(std::string(error.what()).find("seq_length"), std::string::npos) << error.what();
  }
}

TEST(GPTModel, LayoutOfGPT2Small) {
  const GPTConfig config = dufu::trainer::gpt2_small();
  EXPECT_EQ(config.padded_vocab_size(), 50304);
  const std::vector<ParamTensor> layout = dufu::trainer::gpt_parameter_layout(config);
  ASSERT_EQ(layout.size(), 2u + 12u * 12u + 2u);
  // llm.c's count for GPT-2 small with the vocabulary padded to 50304.
  EXPECT_EQ(layout.back().offset + layout.back().size(), 124475904u);
  std::size_t offset = 0;
  for (const ParamTensor& tensor : layout) {
    EXPECT_EQ(tensor.offset, offset) << tensor.name;
    EXPECT_EQ(tensor.is_matrix, tensor.shape.size() == 2) << tensor.name;
    offset += tensor.size();
  }
  EXPECT_EQ(layout[2].name, "h.0.ln_1.weight");
  EXPECT_EQ(layout[4].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(layout[4].shape, (std::vector<std::size_t>{3 * 768, 768}));
  EXPECT_EQ(layout[12].name, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(layout[12].shape, (std::vector<std::size_t>{768, 4 * 768}));
  EXPECT_EQ(layout.back().name, "ln_f.bias");
}

double standard_deviation(std::span<const float> values) {
  double sum = 0, squares = 0;
  for (const float x : values) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double mean = sum / static_cast<double>(values.size());
  return std::sqrt(squares / static_cast<double>(values.size()) - mean * mean);
}

TEST(GPTModel, InitialisationFollowsGPT2) {
  GPTConfig config = small_config();
  config.d_model = 128;
  GPT model(config);
  model.init_gpt2(42);
  const auto view = [&](const std::string& name) {
    const ParamTensor& tensor = model.tensor(name);
    return std::span<const float>(model.params().subspan(tensor.offset, tensor.size()));
  };
  const auto wte = view("wte.weight");
  const std::size_t real = static_cast<std::size_t>(config.vocab_size) * 128;
  EXPECT_NEAR(standard_deviation(wte.first(real)), 0.02, 0.001);
  EXPECT_TRUE(std::all_of(wte.begin() + static_cast<std::ptrdiff_t>(real), wte.end(), [](float x) { return x == 0; }));
  EXPECT_NEAR(standard_deviation(view("h.1.mlp.c_fc.weight")), 0.02, 0.001);
  EXPECT_NEAR(standard_deviation(view("h.1.mlp.c_proj.weight")), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_NEAR(standard_deviation(view("h.0.attn.c_proj.weight")), 0.02 / std::sqrt(4.0), 0.001);
  const auto ones = view("h.0.ln_2.weight");
  EXPECT_TRUE(std::all_of(ones.begin(), ones.end(), [](float x) { return x == 1; }));
  const auto zeros = view("h.0.attn.c_attn.bias");
  EXPECT_TRUE(std::all_of(zeros.begin(), zeros.end(), [](float x) { return x == 0; }));

  GPT same(config);
  same.init_gpt2(42);
  EXPECT_TRUE(std::equal(model.params().begin(), model.params().end(), same.params().begin()));
  same.init_gpt2(43);
  EXPECT_FALSE(std::equal(model.params().begin(), model.params().end(), same.params().begin()));
}

TEST(GPTModel, ForwardRejectsBadInput) {
  GPT model(small_config());
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(kB * kT), 1);
  std::vector<std::int32_t> targets = tokens;
  tokens[5] = small_config().vocab_size;
  EXPECT_THROW(model.forward(tokens, targets, kB, kT), dufu::Error);
  tokens[5] = 1;
  targets[7] = -2;
  EXPECT_THROW(model.forward(tokens, targets, kB, kT), dufu::Error);
  targets[7] = -1;
  EXPECT_THROW(model.forward(tokens, targets, 2 * kB, kT / 2 + 1), dufu::Error);  // size mismatch
  std::vector<std::int32_t> long_row(static_cast<std::size_t>(kT + 1), 1);
  EXPECT_THROW(model.forward(long_row, {}, 1, kT + 1), dufu::Error);  // beyond seq_length
  EXPECT_THROW(model.backward(), dufu::Error);  // no forward yet
}

}  // namespace
