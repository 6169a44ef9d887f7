// GPT-2's initialisation, drawn the same way for every parallel layout.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

namespace {

// Standard normal draws from std::mt19937 by Box-Muller, so the sequence depends only
// on the seed (std::normal_distribution's algorithm is up to each standard library).
class NormalGenerator {
 public:
  explicit NormalGenerator(std::uint32_t seed) : engine_(seed) {}

  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = 2.0 * std::numbers::pi * uniform();
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  // In (0, 1), never 0, so the log above stays finite.
  double uniform() { return (static_cast<double>(engine_()) + 0.5) / 4294967296.0; }

  std::mt19937 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

bool is_layernorm(const std::string& name) { return name.find("ln_") != std::string::npos; }
// The projections into the residual stream (GPT-2's c_proj, Llama's o_proj and down_proj).
bool is_residual_projection(const std::string& name) {
  return name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.c_proj.weight") ||
         name.ends_with("attn.o_proj.weight") || name.ends_with("mlp.down_proj.weight");
}

// GPT-2's initialisation (GPT::init_gpt2) of a buffer in the full layout.
void init_gpt2_full(const GPTConfig& config, const std::vector<ParamTensor>& layout, std::span<float> buffer,
                    std::uint32_t seed) {
  NormalGenerator normal(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * config.n_layer);
  for (const ParamTensor& tensor : layout) {
    float* values = buffer.data() + tensor.offset;
    std::size_t drawn = tensor.size();
    if (tensor.name == "wte.weight" || tensor.name == "lm_head.weight") {
      // Only real tokens get weights; padding rows stay zero so their logits are 0.
      drawn = static_cast<std::size_t>(config.vocab_size) * tensor.shape[1];
    }
    if (is_layernorm(tensor.name)) {
      std::fill_n(values, tensor.size(), tensor.name.ends_with(".weight") ? 1.0f : 0.0f);
    } else if (!tensor.is_matrix) {
      std::fill_n(values, tensor.size(), 0.0f);
    } else {
      const double std_dev = is_residual_projection(tensor.name) ? residual_std : 0.02;
      for (std::size_t i = 0; i < drawn; ++i) values[i] = static_cast<float>(std_dev * normal.next());
      std::fill(values + drawn, values + tensor.size(), 0.0f);
    }
  }
}

}  // namespace

void GPT::init_gpt2(std::uint32_t seed) {
  // Drawn on the host, uploaded once.
  std::vector<float> host(num_parameters());
  const bool whole_model = stage_.num_stages == 1;
  if (tp_ == 1 && whole_model) {
    init_gpt2_full(config_, layout_, host, seed);
  } else {
    // The whole model's draws in buffer order, then this stage's tensors, then this
    // tensor-parallel rank's pieces.
    const std::vector<ParamTensor> serial = gpt_parameter_layout(config_);
    std::vector<float> full(gpt_layout_size(serial));
    init_gpt2_full(config_, serial, full, seed);
    if (!whole_model) {
      std::vector<float> staged(num_full_parameters());
      stage_gpt_buffer(config_, stage_, full, staged);
      full = std::move(staged);
    }
    shard_full(full, host);
  }
  upload_parameters(host);
}

}  // namespace dufu::trainer
