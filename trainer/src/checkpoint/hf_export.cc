// A checkpoint as a HuggingFace GPT-2 or Llama directory (see hf_export.h): the weights through
// the checkpoint reader (so any layout is assembled into the serial model), the
// tokenizer through hf_tokenizer_files, and the two JSON files transformers reads
// before it builds the model. Everything goes into a partial directory that is renamed
// into place at the end.
#include "dufu/trainer/checkpoint/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>

#include "checkpoint_directory.h"
#include "checkpoint_files.h"
#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/run_tokenizer.h"
#include "device/kernel_math.h"
#include "dufu/trainer/model/gpt.h"
#include "hf_tokenizer_files.h"
#include "host_staging.h"

namespace dufu::trainer {

namespace fs = std::filesystem;

namespace {

using checkpoint_directory::path_in;

void write_file(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

// An id of config.json: null when the tokenizer has none.
void token_id(JsonWriter& json, const char* key, std::int32_t id) {
  json.key(key);
  if (id >= 0) {
    json.value(static_cast<std::int64_t>(id));
  } else {
    json.null();
  }
}

// A float knob as the JSON number of its shortest text (1e-05, not 9.99999974738e-06):
// torch casts it back to the same float.
double float_knob(float value) {
  char buffer[32];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
  double number = 0.0;
  std::from_chars(buffer, end, number);
  return number;
}

// LlamaConfig of the model, every field that would otherwise take a default written
// out, as config_json does for GPT-2.
std::string llama_config_json(const GPTConfig& model, const hf_tokenizer_files::TokenizerFiles& tokenizer) {
  JsonWriter json;
  json.begin_object();
  json.key("architectures").begin_array().value("LlamaForCausalLM").end_array();
  json.key("model_type").value("llama");
  json.key("vocab_size").value(model.vocab_size);  // embed_tokens and lm_head as saved: without padding rows
  json.key("hidden_size").value(model.d_model);
  json.key("intermediate_size").value(model.mlp_hidden());
  json.key("num_hidden_layers").value(model.n_layer);
  json.key("num_attention_heads").value(model.n_head);
  json.key("num_key_value_heads").value(model.kv_heads());
  json.key("head_dim").value(model.head_size());
  json.key("max_position_embeddings").value(model.seq_length);
  json.key("hidden_act").value("silu");
  json.key("rms_norm_eps").value(float_knob(model.norm_eps));
  json.key("rope_theta").value(float_knob(model.rope_theta));
  json.key("rope_scaling").null();
  json.key("attention_bias").value(false);
  json.key("mlp_bias").value(false);
  json.key("attention_dropout").value(0.0);  // dufu trains without dropout
  json.key("pretraining_tp").value(1);
  json.key("initializer_range").value(0.02);
  json.key("tie_word_embeddings").value(model.tie_embeddings);
  json.key("use_cache").value(true);
  token_id(json, "bos_token_id", tokenizer.bos_id);
  token_id(json, "eos_token_id", tokenizer.eos_id);
  // LlamaModel makes pad_token_id its embedding's padding_idx, whose row then gets no
  // gradient: with GPT-2's pad = eos a fine-tune in transformers would freeze eos.
  // Padding is generation_config's business.
  json.key("pad_token_id").null();
  json.key("torch_dtype").value("float32");
  json.end_object();
  return json.str() + "\n";
}

// GPT2Config of the model, with every field that would otherwise take a default
// written out, so the file says what dufu trained rather than what GPT-2 was.
std::string config_json(const GPTConfig& model, const hf_tokenizer_files::TokenizerFiles& tokenizer) {
  if (model.is_llama()) return llama_config_json(model, tokenizer);
  JsonWriter json;
  json.begin_object();
  json.key("architectures").begin_array().value("GPT2LMHeadModel").end_array();
  json.key("model_type").value("gpt2");
  json.key("vocab_size").value(model.vocab_size);  // wte as saved: without dufu's padding rows
  json.key("n_positions").value(model.seq_length);
  json.key("n_embd").value(model.d_model);
  json.key("n_layer").value(model.n_layer);
  json.key("n_head").value(model.n_head);
  json.key("n_inner").null();  // 4 n_embd, dufu's MLP width
  // dufu's GELU is the tanh approximation, which transformers calls gelu_new.
  json.key("activation_function").value("gelu_new");
  // torch computes a float LayerNorm with eps cast to float: 1e-5 gives dufu's eps.
  static_assert(kLayerNormEps == 1e-5f);
  json.key("layer_norm_epsilon").value(1e-5);
  // dufu trains without dropout; a fine-tune in transformers continues the same way.
  json.key("resid_pdrop").value(0.0);
  json.key("embd_pdrop").value(0.0);
  json.key("attn_pdrop").value(0.0);
  json.key("initializer_range").value(0.02);
  json.key("scale_attn_weights").value(true);  // scores / sqrt(head size)
  json.key("scale_attn_by_inverse_layer_idx").value(false);
  json.key("reorder_and_upcast_attn").value(false);
  json.key("tie_word_embeddings").value(true);  // the LM head is wte
  json.key("use_cache").value(true);
  token_id(json, "bos_token_id", tokenizer.bos_id);
  token_id(json, "eos_token_id", tokenizer.eos_id);
  token_id(json, "pad_token_id", tokenizer.pad_id);
  json.key("torch_dtype").value("float32");
  json.end_object();
  return json.str() + "\n";
}

// Without eos_token_id here, generate() never stops at the end of a document.
std::string generation_config_json(const hf_tokenizer_files::TokenizerFiles& tokenizer) {
  JsonWriter json;
  json.begin_object();
  token_id(json, "bos_token_id", tokenizer.bos_id);
  token_id(json, "eos_token_id", tokenizer.eos_id);
  token_id(json, "pad_token_id", tokenizer.pad_id);
  json.end_object();
  return json.str() + "\n";
}

// Renames the finished directory to `target`, refusing to replace anything there.
void rename_into_place(const std::string& partial, const std::string& target) {
  if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
    const int error = errno;
    if (error == EEXIST) DUFU_FAIL(target, ": already exists; HINT: name a new directory for the export");
    DUFU_FAIL("cannot rename '", partial, "' to '", target, "': ", errno_message(error));
  }
  sync_directory(fs::path(target).parent_path().string());
}

}  // namespace

HfExport export_hf(const std::string& checkpoint, const std::string& destination,
                   const dataprep::TokenizerSpec& given_tokenizer, Device* device, ExportTokenizer with_tokenizer) {
  const bool omit_tokenizer = with_tokenizer == ExportTokenizer::kOmit;
  if (omit_tokenizer && !given_tokenizer.model.empty()) {
    DUFU_FAIL("--no-tokenizer and --tokenizer '", given_tokenizer.model, "' were both given; HINT: give one");
  }
  std::error_code error;
  if (fs::exists(fs::symlink_status(destination, error))) {
    DUFU_FAIL(destination, ": already exists; HINT: name a new directory for the export");
  }
  if (!given_tokenizer.model.empty()) hf_tokenizer_files::check_exportable(given_tokenizer);
  const auto found = find_usable_checkpoint(checkpoint);
  if (!found) {
    DUFU_FAIL("no checkpoint in '", checkpoint, "': it has no checkpoints/step_<N> directory; HINT: give a run ",
              "directory with checkpoints or one of its checkpoints/step_<N> directories");
  }
  // find_usable_checkpoint verified every file's digest just now.
  const TrainingState state = read_checkpoint_state(*found, FileCheck::kTrust);
  std::optional<dataprep::TokenizerSpec> tokenizer_spec;
  std::optional<dataprep::Tokenizer> tokenizer;
  if (!omit_tokenizer) {
    const std::optional<dataprep::RecordedTokenizer> recorded = checkpoint_tokenizer(*found, state);
    if (!recorded && given_tokenizer.model.empty()) {
      DUFU_FAIL("checkpoint '", *found, "' records no tokenizer (its run's shards had no sidecar, or it was written ",
                "before dufu recorded tokenizers): give --tokenizer FILE, or --no-tokenizer to export the weights ",
                "and config.json alone");
    }
    tokenizer_spec = dataprep::choose_tokenizer(given_tokenizer, recorded, str_cat("checkpoint '", *found, "'"),
                                                "its run's shards had no sidecar");
    hf_tokenizer_files::check_exportable(*tokenizer_spec);
    tokenizer.emplace(dataprep::Tokenizer::load(*tokenizer_spec));
    // The exported tokenizer's ids must be the model's, as for `train generate`; a
    // larger model vocabulary is padding, and config.json's vocab_size is the model's,
    // as in HuggingFace models with padded vocabularies.
    if (tokenizer->vocab_size() > state.model.vocab_size) {
      DUFU_FAIL("the tokenizer '", tokenizer_spec->model, "' has ", tokenizer->vocab_size(),
                " pieces but the model in '", *found, "' has vocab_size ", state.model.vocab_size,
                ", too few for its ids; HINT: use the tokenizer the run's data was tokenized with");
    }
  }
  GPT model(state.model, nullptr, {}, device);
  load_checkpoint(*found, model, nullptr);

  fs::path target_path = fs::absolute(destination).lexically_normal();
  if (!target_path.has_filename()) target_path = target_path.parent_path();  // "out/" is "out"
  const std::string target = target_path.string();
  const fs::path parent = target_path.parent_path();
  fs::create_directories(parent, error);
  if (error) DUFU_FAIL("cannot create directory '", parent.string(), "': ", error.message());
  // An export killed earlier left its partial directory; nothing else would remove it.
  checkpoint_directory::remove_dead_partials(target);
  const std::string partial = checkpoint_directory::create_partial(target, ::getpid());
  HfExport result;
  try {
    const checkpoint_files::Piece whole = checkpoint_files::piece_of(state.model, CheckpointLayout{}, 0, 0);
    const host_staging::StagedState staged(model, nullptr);
    checkpoint_files::write_model(path_in(partial, "model.safetensors"), whole, staged.params());
    const hf_tokenizer_files::TokenizerFiles tokenizer_files =
        tokenizer ? hf_tokenizer_files::write(partial, *tokenizer_spec, *tokenizer, state.model.seq_length)
                  : hf_tokenizer_files::TokenizerFiles{};
    write_file(path_in(partial, "config.json"), config_json(state.model, tokenizer_files));
    write_file(path_in(partial, "generation_config.json"), generation_config_json(tokenizer_files));
    sync_directory(partial);
    rename_into_place(partial, target);

    result.files = tokenizer_files.files;
    for (const char* name : {"config.json", "generation_config.json", "model.safetensors"})
      result.files.push_back(name);
    std::sort(result.files.begin(), result.files.end());
    result.tokenizer_class = tokenizer_files.tokenizer_class;
    result.bos_token_id = tokenizer_files.bos_id;
    result.eos_token_id = tokenizer_files.eos_id;
    result.pad_token_id = tokenizer_files.pad_id;
  } catch (...) {
    checkpoint_directory::abandon(partial);
    throw;
  }
  result.directory = target;
  result.checkpoint = *found;
  result.step = state.step;
  result.model = state.model;
  return result;
}

}  // namespace dufu::trainer
