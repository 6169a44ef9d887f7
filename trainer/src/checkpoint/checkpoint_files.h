// The tensor files of a checkpoint (their formats are in checkpoint.h), between a
// model piece's buffers and safetensors files. Internal to the trainer library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer::checkpoint_files {

// The model shape, field by field: state.json, the metadata of model.safetensors,
// equality and the messages naming the first field that differs all walk this table.
// The sizes are integers (JSON numbers); the architecture's fields are text, written
// only for a model that is not GPT-2 (so a GPT-2 checkpoint is what it always was),
// and a checkpoint without them is GPT-2.
struct ModelField {
  const char* name;
  bool is_integer;     // a JSON number (state.json) and a decimal (metadata)
  bool always_written;  // false: only for model.arch other than gpt2
  std::string (*text)(const GPTConfig&);
  // Sets the field from its text; throws dufu::Error for text that is not a value.
  void (*parse)(GPTConfig&, const std::string&);
};
extern const std::span<const ModelField> kModelFields;

// Whether a checkpoint of this model carries `field`.
inline bool writes_field(const ModelField& field, const GPTConfig& config) {
  return field.always_written || config.arch != Architecture::kGpt2;
}

// The first field in which two model shapes differ; null when they are the same.
inline const ModelField* first_difference(const GPTConfig& a, const GPTConfig& b) {
  for (const ModelField& field : kModelFields) {
    if (field.text(a) != field.text(b)) return &field;
  }
  return nullptr;
}

// A piece of the model: tensor rank `tp_rank` of `tp` on `stage`, laid out as
// gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage). The serial
// model is the piece (tp 1, whole-model stage).
struct Piece {
  GPTConfig config;
  int tp = 1;
  int tp_rank = 0;
  PipelineStage stage;
  bool is_serial() const { return tp == 1 && stage.num_stages == 1; }
  std::vector<ParamTensor> layout() const;
};

// The piece of (tp_rank, pp_rank) in a checkpoint of `layout`.
Piece piece_of(const GPTConfig& config, const CheckpointLayout& layout, int tp_rank, int pp_rank);

// The weights: HF's layout for the serial piece (model.safetensors), dufu's for the
// others. read_model checks every tensor's name, dtype and shape (and that there are
// no others) before it writes `params`, so on an error `params` is unchanged.
void write_model(const std::string& path, const Piece& piece, std::span<const float> params);
void read_model(const std::string& path, const Piece& piece, std::span<float> params);

// The serial piece's tensors in HF's layout, one mapping for model.safetensors, import_hf
// and export_hf: a tensor's name there (gpt2: GPT2Model's, which are dufu's; llama:
// LlamaForCausalLM's, model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight,
// ..., model.norm.weight, lm_head.weight), its shape there (GPT-2's Conv1D weights
// [in, out], wte and lm_head cut to the real vocabulary), and the tensor's values
// placed into dufu's buffer at `dst` (Conv1D weights transposed back, padding rows 0).
std::string hf_name(const ParamTensor& tensor, const GPTConfig& config);
std::vector<std::uint64_t> hf_shape(const ParamTensor& tensor, const GPTConfig& config);
void place_hf_tensor(const ParamTensor& tensor, std::span<const float> src, float* dst);

// A piece's AdamW moments named per tensor (optimizer.safetensors); read_optimizer
// returns the step count and writes m and v only once everything checked out.
void write_optimizer(const std::string& path, const Piece& piece, std::span<const float> m,
                     std::span<const float> v, std::int64_t step_count);
std::int64_t read_optimizer(const std::string& path, const Piece& piece, std::span<float> m, std::span<float> v);

// A ZeRO-1 shard: the moments of [begin, begin + m.size()) of the piece's flattened
// buffer. read_optimizer_shard checks the file holds exactly that range.
void write_optimizer_shard(const std::string& path, const Piece& piece, std::size_t begin,
                           std::span<const float> m, std::span<const float> v, std::int64_t step_count);
std::int64_t read_optimizer_shard(const std::string& path, const Piece& piece, std::size_t begin, std::span<float> m,
                                  std::span<float> v);

// What state.json records of each .safetensors file.
struct FileRecord {
  std::uint64_t bytes = 0;
  std::string sha256;
};
FileRecord describe_file(const std::string& path);

}  // namespace dufu::trainer::checkpoint_files
