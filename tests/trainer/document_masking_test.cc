// Document masking in the model (data.reset_position_ids, data.reset_attention_mask,
// data.eod_mask_loss) against tests/reference/gpt_torch_reference.py, which builds its
// masks, positions and loss mask from each row's own tokens with Megatron's
// _get_ltor_masks_and_position_ids and computes the loss and every gradient with a
// block-diagonal causal mask: GPT-2 and Llama (grouped K/V heads, untied head), fp32
// and bf16. The batch goes through the trainer's own path from a loader batch
// (dataprep's find_packed_documents, then split_batch), so the test covers what a run
// feeds the model. Off, the model is bitwise the unmasked one (no documents given).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/npy.h"
#include "dufu/dataprep/packed_documents.h"
#include "dufu/trainer/model/gpt.h"
#include "run/training_batches.h"
#include "support/float_compare.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::Difference;
using dufu::testing::relative_error;
using dufu::testing::tensor_difference;
using dufu::trainer::Architecture;
using dufu::trainer::DocumentMasking;
using dufu::trainer::GPT;
using dufu::trainer::GPTConfig;
using dufu::trainer::GPTRecipe;
using dufu::trainer::ModelBatch;
using dufu::trainer::ParamTensor;
using dufu::trainer::Precision;

constexpr int kB = 4;
constexpr int kT = 32;
constexpr std::int32_t kEod = 3;

GPTConfig model_config(Architecture arch) {
  GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = 2, .n_head = 4, .d_model = 64, .vocab_size = 500, .vocab_multiple = 128, .seq_length = kT});
  if (arch == Architecture::kLlama) {
    config.arch = Architecture::kLlama;
    config.n_kv_head = 2;
    config.ffn_hidden = 96;
    config.rope_theta = 10000.0f;
    config.norm_eps = 1e-5f;
    config.tie_embeddings = false;
  }
  config.validate();
  return config;
}

// A loader batch of kB samples of kT + 1 tokens with end-of-document tokens planted:
// row 0 one document; row 1 a document of the EOD alone (positions 5, 6) and one
// ending at 20; row 2 starting with an EOD and ending with one as its last input;
// row 3 an EOD every 7 tokens.
dufu::dataprep::Batch packed_batch(int vocab_size) {
  dufu::dataprep::Batch batch;
  batch.rows = kB;
  batch.columns = kT + 1;
  std::mt19937 rng(17);
  std::uniform_int_distribution<std::int32_t> token(kEod + 1, vocab_size - 1);
  for (std::size_t i = 0; i < batch.rows * batch.columns; ++i) batch.tokens.push_back(token(rng));
  const auto plant = [&](int row, int t) { batch.tokens[static_cast<std::size_t>(row) * batch.columns + t] = kEod; };
  for (const int t : {5, 6, 20}) plant(1, t);
  for (const int t : {0, kT - 1}) plant(2, t);
  for (int t = 6; t < kT; t += 7) plant(3, t);
  dufu::dataprep::PackedDocuments documents =
      dufu::dataprep::find_packed_documents(batch.tokens, batch.rows, batch.columns, kEod);
  batch.position_ids = std::move(documents.position_ids);
  batch.cu_seqlens = std::move(documents.cu_seqlens);
  return batch;
}

std::vector<float> read_floats(const std::string& path) {
  const dufu::NpyArray array = dufu::NpyArray::open(path);
  const auto values = array.view<float>();
  return {values.begin(), values.end()};
}

// The loss and gradients torch computes for `model`'s weights on `batch` under `masking`.
struct Reference {
  float loss = 0.0f;
  std::vector<std::vector<float>> grads;  // in model.parameter_tensors() order
};

Reference run_reference(const GPT& model, const dufu::dataprep::Batch& batch, const DocumentMasking& masking) {
  const dufu::testing::TempDir dir;
  std::filesystem::create_directories(dir.file("params"));
  const std::vector<float> params = model.download_parameters();
  for (const ParamTensor& tensor : model.parameter_tensors()) {
    std::vector<std::uint64_t> shape(tensor.shape.begin(), tensor.shape.end());
    dufu::write_npy(dir.file("params/" + tensor.name + ".npy"),
                    std::span<const float>(params).subspan(tensor.offset, tensor.size()), shape);
  }
  ModelBatch plain;  // the reference makes its own masks from the tokens
  dufu::trainer::split_batch(batch, plain);
  dufu::write_npy(dir.file("tokens.npy"), std::span<const std::int32_t>(plain.inputs), {kB, kT});
  dufu::write_npy(dir.file("targets.npy"), std::span<const std::int32_t>(plain.targets), {kB, kT});
  const GPTConfig& config = model.config();
  std::string command = dufu::str_cat(DUFU_REFERENCE_PYTHON, " ", DUFU_SOURCE_DIR,
                                      "/tests/reference/gpt_torch_reference.py --steps 0 --dir ",
                                      dufu::testing::shell_quote(dir.path()), " --n-head ", config.n_head,
                                      " --vocab-size ", config.vocab_size, " --eod-id ", kEod);
  if (config.is_llama()) {
    command += dufu::str_cat(" --arch llama --n-kv-head ", config.n_kv_head, " --rope-theta ", config.rope_theta,
                             " --norm-eps ", config.norm_eps);
  }
  if (masking.reset_position_ids) command += " --reset-position-ids";
  if (masking.reset_attention_mask) command += " --reset-attention-mask";
  if (masking.eod_mask_loss) command += " --eod-mask-loss";
  const dufu::testing::CommandResult result = dufu::testing::run_command(command);
  EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.output;
  Reference reference;
  if (result.exit_code != 0) return reference;
  reference.loss = read_floats(dir.file("out/loss.npy"))[0];
  for (const ParamTensor& tensor : model.parameter_tensors()) {
    reference.grads.push_back(read_floats(dir.file("out/grads/" + tensor.name + ".npy")));
  }
  return reference;
}

// The model's loss and gradient on the batch through the trainer's path, with the
// documents `masking` asks for (none when it is off).
float train_once(GPT& model, const dufu::dataprep::Batch& batch, const DocumentMasking& masking) {
  ModelBatch micro;
  dufu::trainer::split_batch(batch, micro, masking);
  const auto counted = dufu::trainer::counted_targets(micro.targets);
  model.zero_grad();
  const float loss =
      model.forward(micro.inputs, micro.targets, kB, kT, 1.0f / static_cast<float>(counted), micro.documents());
  model.backward();
  return loss;
}

// The largest gradient difference of any tensor, scaled by that tensor's largest value.
double worst_gradient(const GPT& model, const Reference& reference, bool print) {
  double worst = 0.0;
  const auto& tensors = model.parameter_tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Difference diff = tensor_difference(model.grads().subspan(tensors[i].offset, tensors[i].size()),
                                              reference.grads[i]);
    if (print) std::printf("  %-26s scaled err %.3e\n", tensors[i].name.c_str(), diff.scaled());
    worst = std::max(worst, diff.scaled());
  }
  return worst;
}

struct MaskingCase {
  const char* name;
  Architecture arch;
  Precision precision;
  DocumentMasking masking;
  // fp32: the summation-order noise of two float32 programs (measured ~1e-7 on the
  // loss, below 1e-6 on the gradients). bf16 against torch's fp32: bf16's rounding
  // (measured 2e-5 on the loss, 1e-2 on the gradients). Without the documents the
  // loss moves by 8e-4 or more and the gradients by more than 0.8.
  double loss_tolerance, gradient_tolerance;
};

DocumentMasking all_switches() {
  DocumentMasking masking;
  masking.reset_position_ids = masking.reset_attention_mask = masking.eod_mask_loss = true;
  masking.eod_id = kEod;
  return masking;
}
DocumentMasking attention_only() {
  DocumentMasking masking;
  masking.reset_attention_mask = true;
  masking.eod_id = kEod;
  return masking;
}

class DocumentMaskingTest : public ::testing::TestWithParam<MaskingCase> {};

TEST_P(DocumentMaskingTest, LossAndGradientsAreTheReferences) {
  const MaskingCase& c = GetParam();
  const GPTConfig config = model_config(c.arch);
  GPT model(config, nullptr, {}, nullptr,
            GPTRecipe{.precision = c.precision, .attention_products = c.precision});
  model.init_gpt2(1234);
  const dufu::dataprep::Batch batch = packed_batch(config.vocab_size);
  const Reference reference = run_reference(model, batch, c.masking);
  ASSERT_EQ(reference.grads.size(), model.parameter_tensors().size());

  const float loss = train_once(model, batch, c.masking);
  const double loss_error = relative_error(loss, reference.loss);
  std::printf("%s: loss dufu %.7f torch %.7f (rel %.2e)\n", c.name, loss, reference.loss, loss_error);
  EXPECT_LE(loss_error, c.loss_tolerance);
  EXPECT_LE(worst_gradient(model, reference, true), c.gradient_tolerance);

  // The test can fail: the same model without the documents is far from the masked
  // reference, beyond both tolerances.
  const float unmasked = train_once(model, batch, {});
  const double unmasked_gradient = worst_gradient(model, reference, false);
  std::printf("%s without the documents: loss rel %.2e, gradient %.2e\n", c.name,
              relative_error(unmasked, reference.loss), unmasked_gradient);
  EXPECT_GT(unmasked_gradient, 10 * c.gradient_tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    Models, DocumentMaskingTest,
    ::testing::Values(
        MaskingCase{"Gpt2Fp32", Architecture::kGpt2, Precision::kFp32, all_switches(), 1e-5, 2e-5},
        MaskingCase{"Gpt2Fp32AttentionOnly", Architecture::kGpt2, Precision::kFp32, attention_only(), 1e-5, 2e-5},
        MaskingCase{"Gpt2Bf16", Architecture::kGpt2, Precision::kBf16, all_switches(), 3e-4, 3e-2},
        MaskingCase{"LlamaFp32", Architecture::kLlama, Precision::kFp32, all_switches(), 1e-5, 2e-5},
        MaskingCase{"LlamaBf16", Architecture::kLlama, Precision::kBf16, all_switches(), 3e-4, 3e-2}),
    [](const ::testing::TestParamInfo<MaskingCase>& info) { return std::string(info.param.name); });

// Without documents, the masked code paths are not taken: a forward and backward with
// empty documents give the bits of one without the argument.
TEST(DocumentMaskingOff, IsBitwiseTheUnmaskedModel) {
  const GPTConfig config = model_config(Architecture::kLlama);
  GPT model(config);
  model.init_gpt2(1234);
  const dufu::dataprep::Batch batch = packed_batch(config.vocab_size);
  ModelBatch plain;
  dufu::trainer::split_batch(batch, plain);
  model.zero_grad();
  const float loss = model.forward(plain.inputs, plain.targets, kB, kT);
  model.backward();
  const std::vector<float> grads(model.grads().begin(), model.grads().end());
  EXPECT_EQ(train_once(model, batch, {}), loss);
  EXPECT_TRUE(std::equal(grads.begin(), grads.end(), model.grads().begin()));
}

}  // namespace
