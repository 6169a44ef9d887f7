// A HuggingFace directory as a dufu checkpoint (see hf_import.h): the architecture's
// entry reads config.json into the model shape and the tensors into the serial
// model's buffer (through checkpoint_files' HF mapping, the one model.safetensors and
// export_hf use); the pieces of the chosen layout are cut from it with
// shard_gpt_piece and written by the checkpoint's own piece writers, then published
// like a merged checkpoint.
#include "dufu/trainer/checkpoint/hf_import.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <map>
#include <set>
#include <string_view>
#include <system_error>

#include "checkpoint_directory.h"
#include "checkpoint_files.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/data_loader.h"
#include "dufu/dataprep/tokenizer.h"
#include "dufu/dataprep/tokenizer_record.h"
#include "dufu/trainer/checkpoint/run_tokenizer.h"
#include "device/kernel_math.h"
#include "dufu/trainer/model/gpt_pieces.h"
#include "hf_import_llama.h"
#include "hf_weights.h"

namespace dufu::trainer {

namespace {

namespace fs = std::filesystem;
using checkpoint_directory::path_in;
using hf_weights::HfConfig;
using hf_weights::HfWeights;

// ---- GPT2LMHeadModel ----

// Each key whose value dufu's GPT-2 cannot compute is refused by name; keys that only
// matter to transformers (dropout, generation, ids) are ignored: dufu fine-tunes
// without dropout.
GPTConfig gpt2_config(const HfConfig& hf, int vocab_multiple) {
  const auto refuse = [&](const std::string& key, const std::string& value, const std::string& dufu) {
    DUFU_FAIL(hf.path(), ": \"", key, "\" is ", value, "; dufu's GPT-2 supports only ", dufu);
  };
  // gelu_pytorch_tanh is the same tanh approximation as gelu_new, which dufu computes.
  const std::string activation = hf.string_or("activation_function", "gelu_new");
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    refuse("activation_function", '"' + activation + '"', "\"gelu_new\" (GELU's tanh approximation)");
  }
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"}) {
    if (hf.boolean_or(key, false)) refuse(key, "true", "false");
  }
  if (!hf.boolean_or("scale_attn_weights", true)) refuse("scale_attn_weights", "false", "true");
  if (!hf.boolean_or("tie_word_embeddings", true)) refuse("tie_word_embeddings", "false", "a head tied to wte");
  static_assert(kLayerNormEps == 1e-5f);
  const double epsilon = hf.number_or("layer_norm_epsilon", 1e-5);
  if (static_cast<float>(epsilon) != kLayerNormEps) refuse("layer_norm_epsilon", str_cat(epsilon), "1e-05");

  GPTConfig config;
  config.n_layer = hf.positive_int("n_layer");
  config.n_head = hf.positive_int("n_head");
  config.d_model = hf.positive_int("n_embd");
  config.vocab_size = hf.positive_int("vocab_size");
  config.seq_length = hf.positive_int("n_positions");
  config.vocab_multiple = vocab_multiple;
  if (hf.has("n_inner") && hf.integer("n_inner") != 4 * static_cast<std::int64_t>(config.d_model)) {
    refuse("n_inner", str_cat(hf.integer("n_inner")), str_cat("null or 4 x n_embd = ", 4 * config.d_model));
  }
  if (config.d_model % config.n_head != 0) {
    DUFU_FAIL(hf.path(), ": \"n_head\" ", config.n_head, " does not divide \"n_embd\" ", config.d_model);
  }
  config.validate();
  return config;
}

// Tensors of GPT-2 checkpoints that hold no weights: the causal mask buffers older
// transformers saved with every attention layer.
bool is_mask_buffer(std::string_view name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// The serial buffer from GPT2LMHeadModel's tensors ("transformer."-prefixed as
// save_pretrained writes them, or bare as GPT2Model's and dufu's model.safetensors).
void gpt2_weights(const HfWeights& weights, const GPTConfig& config, std::span<float> params) {
  const std::string prefix = weights.contains("transformer.wte.weight") ? "transformer." : "";
  std::set<std::string> used;
  for (const ParamTensor& tensor : gpt_parameter_layout(config)) {
    const std::string name = prefix + tensor.name;
    const std::vector<float> values = weights.to_float(name, checkpoint_files::hf_shape(tensor, config));
    checkpoint_files::place_hf_tensor(tensor, values, params.data() + tensor.offset);
    used.insert(name);
  }
  // A saved lm_head must be wte itself: dufu's GPT-2 has no separate head.
  if (weights.contains("lm_head.weight")) {
    const std::vector<std::uint64_t> shape = {static_cast<std::uint64_t>(config.vocab_size),
                                              static_cast<std::uint64_t>(config.d_model)};
    const std::vector<float> head = weights.to_float("lm_head.weight", shape);
    const std::size_t wte_offset = gpt_parameter_layout(config).front().offset;
    if (!std::equal(head.begin(), head.end(), params.begin() + static_cast<std::ptrdiff_t>(wte_offset))) {
      DUFU_FAIL("tensor \"lm_head.weight\" differs from \"", prefix,
                "wte.weight\": an untied head, which dufu's GPT-2 does not have");
    }
    used.insert("lm_head.weight");
  }
  for (const std::string& name : weights.names()) {
    if (!used.contains(name) && !is_mask_buffer(name)) {
      DUFU_FAIL("unexpected tensor \"", name, "\": GPT2LMHeadModel of this config has no such weight");
    }
  }
}

// ---- the architectures ----

struct HfArchitecture {
  const char* name;        // in config.json's "architectures"
  const char* model_type;  // config.json's "model_type"
  GPTConfig (*config)(const HfConfig&, int vocab_multiple);
  void (*weights)(const HfWeights&, const GPTConfig&, std::span<float>);
};

constexpr HfArchitecture kArchitectures[] = {
    {"GPT2LMHeadModel", "gpt2", gpt2_config, gpt2_weights},
    {"LlamaForCausalLM", "llama", hf_import_llama::config, hf_import_llama::weights},
    // Mistral's tensors and config keys are Llama's; its sliding window is refused
    // unless it spans the whole context.
    {"MistralForCausalLM", "mistral", hf_import_llama::config, hf_import_llama::weights},
};

// Relatives of Llama that dufu's llama does not compute, refused with the reason.
struct Refused {
  const char* name;
  const char* model_type;
  const char* reason;
};
constexpr Refused kRefused[] = {
    {"Qwen2ForCausalLM", "qwen2", "its q, k and v projections have biases, which dufu's llama does not"},
};

const HfArchitecture& architecture_of(const HfConfig& hf) {
  const std::vector<std::string> names = hf.strings("architectures");
  const std::string model_type = hf.string_or("model_type", "");
  const auto named = [&](const char* name, const char* type) {
    return std::find(names.begin(), names.end(), name) != names.end() || (names.empty() && model_type == type);
  };
  for (const Refused& refused : kRefused) {
    if (named(refused.name, refused.model_type)) {
      DUFU_FAIL(hf.path(), ": \"architectures\" is ", refused.name, ", which dufu does not import: ", refused.reason);
    }
  }
  for (const HfArchitecture& architecture : kArchitectures) {
    if (named(architecture.name, architecture.model_type)) return architecture;
  }
  DUFU_FAIL(hf.path(), ": \"architectures\" is ",
            names.empty() ? str_cat("missing and \"model_type\" is \"", model_type, '"') : '"' + names.front() + '"',
            "; dufu imports GPT2LMHeadModel and LlamaForCausalLM");
}

// ---- the checkpoint ----

// The directory's tokenizer: sentencepiece first (what dufu encodes fastest), then
// the HF tokenizer.json, then GPT-2's vocab.json + merges.txt; nullopt for none.
std::optional<dataprep::TokenizerSpec> find_tokenizer(const std::string& dir) {
  std::error_code error;
  const auto present = [&](const char* name) { return fs::exists(path_in(dir, name), error); };
  dataprep::TokenizerSpec spec;
  if (present("tokenizer.model")) {
    spec.model = path_in(dir, "tokenizer.model");
  } else if (present("tokenizer.json")) {
    spec.model = path_in(dir, "tokenizer.json");
  } else if (present("vocab.json") && present("merges.txt")) {
    spec.model = path_in(dir, "vocab.json");
    spec.merges = path_in(dir, "merges.txt");
  } else {
    return std::nullopt;
  }
  return spec;
}

// config.toml of the checkpoint: the model knobs, so `train --resume CHECKPOINT`
// without a config file trains this model (on data.blend given as an override).
std::string config_toml(const GPTConfig& model, const std::string& hf_dir, const std::string& architecture) {
  std::string toml = str_cat("# imported by `train import-hf` from ", hf_dir, " (", architecture, ")\n[model]\n",
                             "n_layer = ", model.n_layer, "\nn_head = ", model.n_head, "\nd_model = ", model.d_model,
                             "\nvocab_size = ", model.vocab_size, "\nvocab_multiple = ", model.vocab_multiple,
                             "\nseq_length = ", model.seq_length, "\n");
  if (!model.is_llama()) return toml;
  // The floats as the shortest text that reads back as the same float (a whole number
  // as one: rope_theta = 500000, not 5e+05).
  const auto float_text = [](float value) {
    if (value == std::floor(value) && std::fabs(value) < 1e9f) return std::to_string(static_cast<long long>(value));
    char buffer[32];
    return std::string(buffer, std::to_chars(buffer, buffer + sizeof buffer, value).ptr);
  };
  return str_cat(toml, "arch = \"llama\"\nn_kv_head = ", model.kv_heads(), "\nffn_hidden = ", model.mlp_hidden(),
                 "\nrope_theta = ", float_text(model.rope_theta), "\nnorm_eps = ", float_text(model.norm_eps),
                 "\ntie_embeddings = \"", model.tie_embeddings ? "true" : "false", "\"\n");
}

// The piece files of every (tp rank, stage) into `partial`, cut from the serial buffer.
std::map<std::string, checkpoint_files::FileRecord> write_pieces(const std::string& partial, const GPTConfig& config,
                                                                 const CheckpointLayout& layout,
                                                                 std::span<const float> serial) {
  std::map<std::string, checkpoint_files::FileRecord> files;
  for (int p = 0; p < layout.pipeline_parallel_size; ++p) {
    for (int t = 0; t < layout.tensor_parallel_size; ++t) {
      const checkpoint_files::Piece piece = checkpoint_files::piece_of(config, layout, t, p);
      std::size_t size = 0;
      for (const ParamTensor& tensor : piece.layout()) size = std::max(size, tensor.offset + tensor.size());
      std::vector<float> params(size);
      shard_gpt_piece(config, piece.tp, t, piece.stage, serial, params);
      const std::vector<float> zeros(size, 0.0f);  // fresh AdamW moments
      const std::string model_name = model_file_name(layout, t, p);
      const std::string optimizer_name = optimizer_file_name(layout, t, p, 0);
      checkpoint_files::write_model(path_in(partial, model_name), piece, params);
      checkpoint_files::write_optimizer(path_in(partial, optimizer_name), piece, zeros, zeros, 0);
      for (const std::string& name : {model_name, optimizer_name}) {
        files[name] = checkpoint_files::describe_file(path_in(partial, name));
      }
    }
  }
  return files;
}

}  // namespace

HfImport import_hf(const std::string& hf_dir, const std::string& destination, const HfImportOptions& options) {
  std::error_code error;
  if (!fs::is_directory(hf_dir, error)) DUFU_FAIL(hf_dir, ": not a directory (expected a HuggingFace model)");
  if (fs::exists(fs::symlink_status(destination, error))) {
    DUFU_FAIL(destination, ": already exists; HINT: name a new directory for the imported checkpoint");
  }
  const HfConfig hf = HfConfig::read(path_in(hf_dir, "config.json"));
  const HfArchitecture& architecture = architecture_of(hf);
  const GPTConfig config = architecture.config(hf, options.vocab_multiple);

  CheckpointLayout layout;
  layout.tensor_parallel_size = options.tensor_parallel_size;
  layout.pipeline_parallel_size = options.pipeline_parallel_size;
  layout.pipeline_layers = options.pipeline_layers;  // checked against the stages by validate
  layout.validate(config);
  // As a run records it: the split of every stage, none for one stage.
  layout.pipeline_layers.clear();
  if (layout.pipeline_parallel_size > 1) {
    layout.pipeline_layers = pipeline_layer_split(config.n_layer, layout.pipeline_parallel_size,
                                                  options.pipeline_layers);
  }

  const HfWeights weights = HfWeights::open(hf_dir);
  std::size_t serial_size = 0;
  for (const ParamTensor& tensor : gpt_parameter_layout(config)) serial_size += tensor.size();
  std::vector<float> serial(serial_size, 0.0f);
  architecture.weights(weights, config, serial);

  std::optional<dataprep::TokenizerSpec> tokenizer;
  if (options.with_tokenizer) tokenizer = find_tokenizer(hf_dir);
  if (tokenizer) {
    // A tokenizer that dufu cannot read or whose ids do not fit the model would make
    // every later generate and export fail; refusing it now names the cause.
    try {
      const std::int64_t pieces = dataprep::Tokenizer::load(*tokenizer).vocab_size();
      if (pieces > config.vocab_size) {
        DUFU_FAIL("it has ", pieces, " pieces, more than the model's vocab_size ", config.vocab_size);
      }
    } catch (const Error& e) {
      DUFU_FAIL("the tokenizer '", tokenizer->model, "': ", e.what(), "; HINT: --no-tokenizer imports without it");
    }
  }

  TrainingState state;
  state.model = config;
  state.layout = layout;
  state.train_loader_state = dataprep::LoaderState{}.to_string();
  state.config_toml = config_toml(config, hf_dir, architecture.name);

  const std::string target = fs::absolute(destination).lexically_normal().string();
  std::string final_dir = target;
  if (!final_dir.empty() && final_dir.back() == '/') final_dir.pop_back();  // "out/" is "out"
  const fs::path parent = fs::path(final_dir).parent_path();
  fs::create_directories(parent, error);
  if (error) DUFU_FAIL("cannot create directory '", parent.string(), "': ", error.message());
  checkpoint_directory::remove_dead_partials(final_dir);
  const std::string partial = checkpoint_directory::create_partial(final_dir, ::getpid());
  std::map<std::string, checkpoint_files::FileRecord> files;
  try {
    files = write_pieces(partial, config, layout, serial);
    if (tokenizer) {
      const dataprep::RecordedTokenizer recorded{dataprep::record_tokenizer(*tokenizer), hf.path(), tokenizer->model,
                                                 tokenizer->merges};
      // Into partial/tokenizer/ now, so a tokenizer that changes while it is copied
      // fails before publish; publish then finds the files already in place (its copy
      // from tokenizer_dir into the checkpoint re-verifies them).
      state.tokenizer = install_run_tokenizer(partial, recorded);
      state.tokenizer_dir = partial;
    }
  } catch (...) {
    checkpoint_directory::abandon(partial);
    throw;
  }
  checkpoint_directory::publish(partial, final_dir, state, files, checkpoint_directory::Existing::kRefuse);

  HfImport result;
  result.checkpoint = final_dir;
  result.architecture = architecture.name;
  result.model = config;
  result.layout = layout;
  result.weight_files = weights.files();
  if (tokenizer) result.tokenizer = tokenizer->model;
  return result;
}

}  // namespace dufu::trainer
