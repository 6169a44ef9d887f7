// The GPT parameter layout and the pipeline splits: shapes and offsets only.
#include "dufu/trainer/model/gpt_layout.h"

#include <climits>
#include <string>
#include <utility>

#include "dufu/common/error.h"

namespace dufu::trainer {

namespace {

// The layer a tensor name belongs to ("h.3.ln_1.weight" -> 3), or -1.
int layer_of(const std::string& name) {
  if (!name.starts_with("h.")) return -1;
  return std::stoi(name.substr(2));
}

bool stage_holds(const PipelineStage& stage, const std::string& name) {
  const int layer = layer_of(name);
  if (layer >= 0) return layer >= stage.first_layer && layer < stage.first_layer + stage.num_layers;
  if (name == "wte.weight") return stage.holds_wte();
  if (name == "wpe.weight") return stage.is_first();
  return stage.is_last();  // ln_f
}

void check_tensor_parallel_size(int tensor_parallel_size) {
  if (tensor_parallel_size < 1) DUFU_FAIL("tensor_parallel_size must be at least 1, got ", tensor_parallel_size);
}

void check_pipeline_stages(int stages) {
  if (stages < 1) DUFU_FAIL("pipeline_parallel_size must be at least 1, got ", stages);
}

}  // namespace

const char* architecture_name(Architecture arch) { return arch == Architecture::kLlama ? "llama" : "gpt2"; }

Architecture parse_architecture(std::string_view text, std::string_view knob) {
  if (text == "gpt2") return Architecture::kGpt2;
  if (text == "llama") return Architecture::kLlama;
  DUFU_FAIL(knob, " must be \"gpt2\" or \"llama\", got \"", text, "\"");
}

std::int64_t GPTConfig::mlp_hidden() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (!is_llama()) return 4LL * d_model;
  // Llama's rule (Touvron et al. 2023; Meta's reference code): int(2 * 4C / 3)
  // rounded up to a multiple of 256, which keeps SwiGLU's three matrices at the
  // parameter count of a 4C GELU MLP's two.
  const std::int64_t hidden = 2LL * 4 * d_model / 3;
  return (hidden + 255) / 256 * 256;
}

PipelineStage resolve_pipeline_stage(const GPTConfig& config, PipelineStage stage) {
  stage.tied_head = config.tie_embeddings;
  if (stage.num_stages < 1 || stage.stage < 0 || stage.stage >= stage.num_stages) {
    DUFU_FAIL("pipeline stage ", stage.stage, " of ", stage.num_stages, " is not a stage; HINT: stages are 0 to ",
              "num_stages - 1");
  }
  if (stage.num_layers < 0) stage.num_layers = config.n_layer - stage.first_layer;
  if (stage.first_layer < 0 || stage.num_layers < 1 || stage.first_layer + stage.num_layers > config.n_layer) {
    DUFU_FAIL("pipeline stage ", stage.stage, ": layers [", stage.first_layer, ", ",
              stage.first_layer + stage.num_layers, ") are not a non-empty range of the model's ", config.n_layer);
  }
  if (stage.is_first() && stage.first_layer != 0) {
    DUFU_FAIL("pipeline stage 0 must start at layer 0, not ", stage.first_layer);
  }
  if (stage.is_last() && stage.first_layer + stage.num_layers != config.n_layer) {
    DUFU_FAIL("the last pipeline stage must end at the last layer (", config.n_layer, "), not ",
              stage.first_layer + stage.num_layers);
  }
  return stage;
}

GPTConfig gpt2_small() {
  GPTConfig config;
  config.n_layer = 12;
  config.n_head = 12;
  config.d_model = 768;
  config.vocab_size = 50257;
  config.seq_length = 1024;
  return config;
}

int GPTConfig::padded_vocab_size(int tensor_parallel_size) const {
  check_tensor_parallel_size(tensor_parallel_size);
  const long long multiple = static_cast<long long>(vocab_multiple) * tensor_parallel_size;
  const long long padded = (vocab_size + multiple - 1) / multiple * multiple;
  if (padded > INT_MAX) {
    DUFU_FAIL("GPT config: vocab_size ", vocab_size, " padded to a multiple of ", vocab_multiple, " x ",
              tensor_parallel_size, " (tensor parallel ranks) overflows int");
  }
  return static_cast<int>(padded);
}

void GPTConfig::validate() const {
  const std::pair<const char*, int> sizes[] = {{"n_layer", n_layer},
                                               {"n_head", n_head},
                                               {"d_model", d_model},
                                               {"vocab_size", vocab_size},
                                               {"vocab_multiple", vocab_multiple},
                                               {"seq_length", seq_length}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) DUFU_FAIL("GPT config: ", field, " must be positive, got ", value);
  }
  if (d_model % n_head != 0) {
    DUFU_FAIL("GPT config: d_model ", d_model, " is not divisible by n_head ", n_head,
              "; HINT: each head gets d_model / n_head channels");
  }
  if (vocab_size > INT_MAX - vocab_multiple) {
    DUFU_FAIL("GPT config: vocab_size ", vocab_size, " padded to a multiple of ", vocab_multiple, " overflows int");
  }
  if (mlp_hidden() > INT_MAX) DUFU_FAIL("GPT config: the MLP's hidden width ", mlp_hidden(), " overflows int");
  if (n_kv_head < 0 || ffn_hidden < 0) {
    DUFU_FAIL("GPT config: n_kv_head (", n_kv_head, ") and ffn_hidden (", ffn_hidden,
              ") must not be negative; HINT: 0 picks the architecture's default");
  }
  if (!is_llama()) {
    // GPT-2's kernels have these fixed: LayerNorm's 1e-5, 4C, every head its own K/V.
    if (kv_heads() != n_head) DUFU_FAIL("GPT config: n_kv_head ", n_kv_head, " needs model.arch = \"llama\"");
    if (mlp_hidden() != 4LL * d_model) {
      DUFU_FAIL("GPT config: ffn_hidden ", ffn_hidden, " needs model.arch = \"llama\" (GPT-2's MLP is 4 x d_model)");
    }
    if (!tie_embeddings) DUFU_FAIL("GPT config: an untied LM head (tie_embeddings false) needs model.arch = \"llama\"");
    if (norm_eps != 1e-5f) DUFU_FAIL("GPT config: norm_eps ", norm_eps, " needs model.arch = \"llama\" (GPT-2's LayerNorm uses 1e-5)");
    return;
  }
  if (n_head % kv_heads() != 0) {
    DUFU_FAIL("GPT config: n_head ", n_head, " is not a multiple of n_kv_head ", n_kv_head,
              "; HINT: grouped-query attention gives each K/V head n_head / n_kv_head query heads");
  }
  if (head_size() % 2 != 0) {
    DUFU_FAIL("GPT config: head size d_model / n_head = ", head_size(),
              " is odd; the rotary embedding turns pairs of channels");
  }
  if (!(rope_theta > 0.0f) || !(norm_eps > 0.0f)) {
    DUFU_FAIL("GPT config: rope_theta (", rope_theta, ") and norm_eps (", norm_eps, ") must be positive");
  }
}

std::size_t ParamTensor::size() const {
  std::size_t count = 1;
  for (const std::size_t extent : shape) count *= extent;
  return count;
}

std::vector<ParamTensor> gpt_parameter_layout(const GPTConfig& config, int tensor_parallel_size) {
  config.validate();
  const int tp = tensor_parallel_size;
  check_tensor_parallel_size(tp);
  if (config.n_head % tp != 0) {
    DUFU_FAIL("GPT config: n_head ", config.n_head, " is not divisible by the tensor parallel size ", tp,
              "; HINT: each tensor-parallel rank computes n_head / tp whole heads, so choose a tp that divides n_head");
  }
  // Megatron-LM replicates K/V heads when tp exceeds them; dufu splits whole K/V heads
  // only, so every rank's query heads find their K/V head on the same rank.
  if (config.kv_heads() % tp != 0) {
    DUFU_FAIL("GPT config: n_kv_head ", config.kv_heads(), " is not divisible by the tensor parallel size ", tp,
              "; HINT: each tensor-parallel rank holds n_kv_head / tp whole K/V heads (their query groups with ",
              "them), so choose a tp that divides n_kv_head");
  }
  if (config.mlp_hidden() % tp != 0) {
    DUFU_FAIL("GPT config: the MLP's hidden width ", config.mlp_hidden(), " is not divisible by the tensor parallel ",
              "size ", tp, "; HINT: choose a tp that divides model.ffn_hidden");
  }
  const std::size_t C = static_cast<std::size_t>(config.d_model);
  const std::size_t ranks = static_cast<std::size_t>(tp);
  std::vector<ParamTensor> layout;
  std::size_t offset = 0;
  const auto add = [&](std::string name, std::vector<std::size_t> shape, TensorSplit split = TensorSplit::kReplicated,
                       int blocks = 1) {
    const std::size_t dim = split == TensorSplit::kColumns ? 1 : 0;
    if (split != TensorSplit::kReplicated) shape[dim] /= ranks;
    ParamTensor tensor{std::move(name), offset, std::move(shape), false, split, blocks};
    tensor.is_matrix = tensor.shape.size() == 2;
    offset += tensor.size();
    layout.push_back(std::move(tensor));
  };
  const auto rows = TensorSplit::kRows;
  const auto columns = TensorSplit::kColumns;
  const std::size_t padded_vocab = static_cast<std::size_t>(config.padded_vocab_size(tp));
  add("wte.weight", {padded_vocab, C}, rows);
  if (config.is_llama()) {
    const std::size_t q_width = static_cast<std::size_t>(config.n_head * config.head_size());
    const std::size_t kv_width = static_cast<std::size_t>(config.kv_heads() * config.head_size());
    const std::size_t F = static_cast<std::size_t>(config.mlp_hidden());
    for (int layer = 0; layer < config.n_layer; ++layer) {
      const std::string prefix = str_cat("h.", layer, ".");
      add(prefix + "ln_1.weight", {C});
      add(prefix + "attn.q_proj.weight", {q_width, C}, rows);
      add(prefix + "attn.k_proj.weight", {kv_width, C}, rows);
      add(prefix + "attn.v_proj.weight", {kv_width, C}, rows);
      add(prefix + "attn.o_proj.weight", {C, q_width}, columns);
      add(prefix + "ln_2.weight", {C});
      add(prefix + "mlp.gate_proj.weight", {F, C}, rows);
      add(prefix + "mlp.up_proj.weight", {F, C}, rows);
      add(prefix + "mlp.down_proj.weight", {C, F}, columns);
    }
    add("ln_f.weight", {C});
    if (!config.tie_embeddings) add("lm_head.weight", {padded_vocab, C}, rows);
    return layout;
  }
  add("wpe.weight", {static_cast<std::size_t>(config.seq_length), C});
  for (int layer = 0; layer < config.n_layer; ++layer) {
    const std::string prefix = str_cat("h.", layer, ".");
    add(prefix + "ln_1.weight", {C});
    add(prefix + "ln_1.bias", {C});
    add(prefix + "attn.c_attn.weight", {3 * C, C}, rows, 3);
    add(prefix + "attn.c_attn.bias", {3 * C}, rows, 3);
    add(prefix + "attn.c_proj.weight", {C, C}, columns);
    add(prefix + "attn.c_proj.bias", {C});
    add(prefix + "ln_2.weight", {C});
    add(prefix + "ln_2.bias", {C});
    add(prefix + "mlp.c_fc.weight", {4 * C, C}, rows);
    add(prefix + "mlp.c_fc.bias", {4 * C}, rows);
    add(prefix + "mlp.c_proj.weight", {C, 4 * C}, columns);
    add(prefix + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return layout;
}

std::vector<int> pipeline_layer_split(int n_layer, int stages, std::span<const int> pipeline_num_layers) {
  check_pipeline_stages(stages);
  if (n_layer < stages) {
    DUFU_FAIL("pipeline_parallel_size ", stages, " is more stages than the model's ", n_layer,
              " layers; HINT: every stage needs at least one layer, so use at most n_layer stages");
  }
  if (pipeline_num_layers.empty()) {
    std::vector<int> split(static_cast<std::size_t>(stages), n_layer / stages);
    for (int s = 0; s < n_layer % stages; ++s) ++split[static_cast<std::size_t>(s)];
    return split;
  }
  if (pipeline_num_layers.size() != static_cast<std::size_t>(stages)) {
    DUFU_FAIL("pipeline_num_layers has ", pipeline_num_layers.size(), " entries for ", stages,
              " pipeline stages; HINT: give one layer count per stage");
  }
  long long sum = 0;
  for (std::size_t s = 0; s < pipeline_num_layers.size(); ++s) {
    if (pipeline_num_layers[s] < 1) {
      DUFU_FAIL("pipeline_num_layers gives stage ", s, " ", pipeline_num_layers[s],
                " layers; every stage needs at least one");
    }
    sum += pipeline_num_layers[s];
  }
  if (sum != n_layer) {
    DUFU_FAIL("pipeline_num_layers sums to ", sum, " layers, the model has n_layer ", n_layer,
              "; HINT: the layers per stage must add up to n_layer");
  }
  return {pipeline_num_layers.begin(), pipeline_num_layers.end()};
}

std::vector<int> pipeline_layer_split_from_stage_ids(int n_layer, int stages, std::span<const int> stage_of_layer) {
  check_pipeline_stages(stages);
  if (stage_of_layer.size() != static_cast<std::size_t>(n_layer)) {
    DUFU_FAIL("pipeline stage ids: ", stage_of_layer.size(), " ids for n_layer ", n_layer,
              " layers; HINT: give every layer its stage");
  }
  std::vector<int> split(static_cast<std::size_t>(stages), 0);
  int previous = 0;
  for (std::size_t layer = 0; layer < stage_of_layer.size(); ++layer) {
    const int id = stage_of_layer[layer];
    if (id < 0 || id >= stages || id < previous || id > previous + 1 || (layer == 0 && id != 0)) {
      DUFU_FAIL("pipeline stage ids: layer ", layer, " has stage ", id, " after stage ", previous,
                "; HINT: the ids must run 0, ..., ", stages - 1, " in order, each stage a contiguous run of layers");
    }
    ++split[static_cast<std::size_t>(id)];
    previous = id;
  }
  if (previous != stages - 1) {
    DUFU_FAIL("pipeline stage ids end at stage ", previous, " of ", stages, "; HINT: every stage needs a layer");
  }
  return split;
}

PipelineStage pipeline_stage(std::span<const int> layers_per_stage, int stage) {
  if (stage < 0 || static_cast<std::size_t>(stage) >= layers_per_stage.size()) {
    DUFU_FAIL("pipeline stage ", stage, " is not in a split of ", layers_per_stage.size(), " stages");
  }
  PipelineStage result;
  result.stage = stage;
  result.num_stages = static_cast<int>(layers_per_stage.size());
  for (int s = 0; s < stage; ++s) result.first_layer += layers_per_stage[static_cast<std::size_t>(s)];
  result.num_layers = layers_per_stage[static_cast<std::size_t>(stage)];
  if (result.num_layers < 1) DUFU_FAIL("pipeline stage ", stage, " has ", result.num_layers, " layers");
  return result;
}

std::vector<ParamTensor> gpt_stage_layout(const GPTConfig& config, const std::vector<ParamTensor>& layout,
                                          const PipelineStage& stage) {
  const PipelineStage resolved = resolve_pipeline_stage(config, stage);
  std::vector<ParamTensor> staged;
  std::size_t offset = 0;
  for (const ParamTensor& tensor : layout) {
    if (!stage_holds(resolved, tensor.name)) continue;
    staged.push_back(tensor);
    staged.back().offset = offset;
    offset += tensor.size();
  }
  return staged;
}

std::size_t gpt_layout_size(const std::vector<ParamTensor>& layout) {
  return layout.empty() ? 0 : layout.back().offset + layout.back().size();
}

}  // namespace dufu::trainer
