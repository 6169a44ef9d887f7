// The tensor files of a checkpoint: weights and AdamW moments of one model piece.
// Reading trusts nothing (a checkpoint is what a crash, a full disk or a bad copy
// leaves behind): every tensor is checked for name, dtype and shape, and nothing is
// copied until all of them are.
#include "checkpoint_files.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string_view>

#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/mapped_file.h"
#include "dufu/trainer/checkpoint/safetensors.h"

namespace dufu::trainer::checkpoint_files {

namespace {

namespace fs = std::filesystem;

// AdamW's step count: an I64 scalar, as torch names it.
constexpr const char* kStepTensor = "step";


std::size_t layout_size(const std::vector<ParamTensor>& layout) {
  return layout.empty() ? 0 : layout.back().offset + layout.back().size();
}

// HF's Conv1D layers keep their weights [in, out], dufu's matmul [out, in].
bool is_conv1d_weight(std::string_view name) {
  for (const std::string_view suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

// The tensors with a row per token of the padded vocabulary: HF's have vocab_size rows.
bool has_padding_rows(const ParamTensor& tensor) {
  return tensor.name == "wte.weight" || tensor.name == "lm_head.weight";
}

std::vector<std::uint64_t> dufu_shape(const ParamTensor& tensor) { return {tensor.shape.begin(), tensor.shape.end()}; }

std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += str_cat(i > 0 ? ", " : "", shape[i]);
  return out + "]";
}

// dst [cols, rows] = src [rows, cols] transposed, in tiles so both sides stay in cache.
void transpose(const float* src, std::size_t rows, std::size_t cols, float* dst) {
  constexpr std::size_t kTile = 32;
  for (std::size_t r0 = 0; r0 < rows; r0 += kTile) {
    for (std::size_t c0 = 0; c0 < cols; c0 += kTile) {
      const std::size_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (std::size_t r = r0; r < r1; ++r) {
        for (std::size_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

// The named F32 tensor of `file` with exactly `shape`.
std::span<const float> checked_view(const safetensors::File& file, const std::string& name,
                                    const std::vector<std::uint64_t>& shape) {
  const safetensors::TensorView* tensor = file.find(name);
  if (tensor == nullptr) DUFU_FAIL(file.path(), ": missing tensor \"", name, "\"");
  if (tensor->shape != shape) {
    DUFU_FAIL(file.path(), ": tensor \"", name, "\" has shape ", shape_text(tensor->shape), ", expected ",
              shape_text(shape));
  }
  return file.view<float>(name);
}

void check_no_other_tensors(const safetensors::File& file, const std::set<std::string>& expected) {
  for (const safetensors::TensorView& tensor : file.tensors()) {
    if (!expected.contains(tensor.name)) DUFU_FAIL(file.path(), ": unexpected tensor \"", tensor.name, "\"");
  }
}

std::int64_t read_step_count(const safetensors::File& file) {
  const safetensors::TensorView* step = file.find(kStepTensor);
  if (step == nullptr) DUFU_FAIL(file.path(), ": missing tensor \"", kStepTensor, "\"");
  if (!step->shape.empty()) {
    DUFU_FAIL(file.path(), ": tensor \"", kStepTensor, "\" has shape ", shape_text(step->shape),
              ", expected a scalar []");
  }
  const std::int64_t step_count = file.view<std::int64_t>(kStepTensor)[0];
  if (step_count < 0) DUFU_FAIL(file.path(), ": the step count ", step_count, " is negative");
  return step_count;
}

// The metadata value `key` of `file` as a non-negative integer; `expected` when given
// must match.
std::uint64_t metadata_number(const safetensors::File& file, const std::string& key) {
  const auto it = file.metadata().find(key);
  if (it == file.metadata().end()) DUFU_FAIL(file.path(), ": metadata \"", key, "\" is missing");
  const std::string& text = it->second;
  std::uint64_t value = 0;
  const bool digits = !text.empty() && text.size() <= 19 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) DUFU_FAIL(file.path(), ": metadata \"", key, "\" is \"", text, "\", not a non-negative integer");
  for (const char c : text) value = value * 10 + static_cast<std::uint64_t>(c - '0');
  return value;
}

void check_metadata(const safetensors::File& file, const std::string& key, std::uint64_t expected) {
  const std::uint64_t value = metadata_number(file, key);
  if (value != expected) {
    DUFU_FAIL(file.path(), ": metadata \"", key, "\" is ", value, ", expected ", expected,
              " (a file of another piece or model?)");
  }
}

safetensors::Metadata piece_metadata(const Piece& piece, const char* format) {
  safetensors::Metadata metadata{{"format", format}};
  for (const ModelField& field : kModelFields) {
    if (writes_field(field, piece.config)) metadata[field.name] = field.text(piece.config);
  }
  metadata["tensor_parallel_rank"] = std::to_string(piece.tp_rank);
  metadata["tensor_parallel_size"] = std::to_string(piece.tp);
  metadata["pipeline_stage"] = std::to_string(piece.stage.stage);
  metadata["pipeline_parallel_size"] = std::to_string(piece.stage.num_stages);
  metadata["first_layer"] = std::to_string(piece.stage.first_layer);
  metadata["num_layers"] = std::to_string(piece.stage.num_layers);
  return metadata;
}

// A piece file names the piece it holds: a file copied under another piece's name is
// caught even though its tensors would fit.
void check_piece_metadata(const safetensors::File& file, const Piece& piece) {
  for (const ModelField& field : kModelFields) {
    const auto it = file.metadata().find(field.name);
    const bool present = it != file.metadata().end();
    if (!present && !writes_field(field, piece.config)) continue;
    if (!present || it->second != field.text(piece.config)) {
      DUFU_FAIL(file.path(), ": metadata \"", field.name, "\" is ", present ? "\"" + it->second + "\"" : "missing",
                ", expected \"", field.text(piece.config), "\" (a file of another piece or model?)");
    }
  }
  check_metadata(file, "tensor_parallel_rank", static_cast<std::uint64_t>(piece.tp_rank));
  check_metadata(file, "tensor_parallel_size", static_cast<std::uint64_t>(piece.tp));
  check_metadata(file, "pipeline_stage", static_cast<std::uint64_t>(piece.stage.stage));
  check_metadata(file, "pipeline_parallel_size", static_cast<std::uint64_t>(piece.stage.num_stages));
  check_metadata(file, "first_layer", static_cast<std::uint64_t>(piece.stage.first_layer));
  check_metadata(file, "num_layers", static_cast<std::uint64_t>(piece.stage.num_layers));
}

// No checkpoint holds a NaN or an infinity: resuming from it could only fail, and
// as the newest checkpoint it would hide the good ones before it.
void check_finite(const std::string& path, const char* what, std::span<const float> values,
                  const std::vector<ParamTensor>& layout) {
  const auto bad = [](float x) { return !std::isfinite(x); };
  const auto first = std::find_if(values.begin(), values.end(), bad);
  if (first == values.end()) return;
  const std::size_t index = static_cast<std::size_t>(first - values.begin());
  std::string where = str_cat("at index ", index);
  for (const ParamTensor& tensor : layout) {
    if (index >= tensor.offset && index < tensor.offset + tensor.size()) where = str_cat("in ", tensor.name);
  }
  DUFU_FAIL(fs::path(path).filename().string(), ": ", std::count_if(first, values.end(), bad), " of ", values.size(),
            " ", what, " are not finite (the first ", where, " is ", *first,
            "); a checkpoint with non-finite values is never published");
}

void check_size(const char* what, std::size_t got, std::size_t want) {
  if (got != want) DUFU_FAIL(what, ": a buffer of ", got, " floats for a piece of ", want);
}

}  // namespace

std::string hf_name(const ParamTensor& tensor, const GPTConfig& config) {
  const std::string& name = tensor.name;
  if (!config.is_llama()) return name;  // dufu's GPT-2 names are GPT2Model's
  if (name == "wte.weight") return "model.embed_tokens.weight";
  if (name == "ln_f.weight") return "model.norm.weight";
  if (name == "lm_head.weight") return name;
  // h.{i}.<part>: LlamaDecoderLayer i's tensors.
  const std::size_t layer_end = name.find('.', 2);
  DUFU_CHECK(name.starts_with("h.") && layer_end != std::string::npos, "hf_name: no HF name for \"", name, "\"");
  const std::string layer = "model.layers." + name.substr(2, layer_end - 2) + ".";
  const std::string_view part = std::string_view(name).substr(layer_end + 1);
  if (part == "ln_1.weight") return layer + "input_layernorm.weight";
  if (part == "ln_2.weight") return layer + "post_attention_layernorm.weight";
  if (part.starts_with("attn.")) return layer + "self_attn." + std::string(part.substr(5));
  DUFU_CHECK(part.starts_with("mlp."), "hf_name: no HF name for \"", name, "\"");
  return layer + std::string(part);
}

std::vector<std::uint64_t> hf_shape(const ParamTensor& tensor, const GPTConfig& config) {
  if (has_padding_rows(tensor)) {
    return {static_cast<std::uint64_t>(config.vocab_size), static_cast<std::uint64_t>(config.d_model)};
  }
  if (is_conv1d_weight(tensor.name)) return {tensor.shape[1], tensor.shape[0]};
  return {tensor.shape.begin(), tensor.shape.end()};
}

void place_hf_tensor(const ParamTensor& tensor, std::span<const float> src, float* dst) {
  if (is_conv1d_weight(tensor.name)) {
    transpose(src.data(), tensor.shape[1], tensor.shape[0], dst);
  } else {
    std::copy(src.begin(), src.end(), dst);
    std::fill(dst + src.size(), dst + tensor.size(), 0.0f);  // the padding rows, cut in HF's layout
  }
}

std::vector<ParamTensor> Piece::layout() const {
  return gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage);
}

Piece piece_of(const GPTConfig& config, const CheckpointLayout& layout, int tp_rank, int pp_rank) {
  Piece piece;
  piece.config = config;
  piece.tp = layout.tensor_parallel_size;
  piece.tp_rank = tp_rank;
  if (layout.pipeline_parallel_size > 1) {
    piece.stage = pipeline_stage(layout.pipeline_layers, pp_rank);
  } else {
    piece.stage.num_layers = config.n_layer;
  }
  return piece;
}

void write_model(const std::string& path, const Piece& piece, std::span<const float> params) {
  const std::vector<ParamTensor> layout = piece.layout();
  check_size("write_model", params.size(), layout_size(layout));
  check_finite(path, "weights", params, layout);
  if (!piece.is_serial()) {
    std::vector<safetensors::TensorRef> refs;
    for (const ParamTensor& tensor : layout) {
      refs.push_back({tensor.name, safetensors::Dtype::kF32, dufu_shape(tensor), params.data() + tensor.offset});
    }
    safetensors::write(path, refs, piece_metadata(piece, "dufu-piece"));
    return;
  }
  const GPTConfig& config = piece.config;
  const std::size_t real = static_cast<std::size_t>(config.vocab_size) * static_cast<std::size_t>(config.d_model);
  for (const ParamTensor& tensor : layout) {
    if (!has_padding_rows(tensor)) continue;
    // Cutting wte (and an untied lm_head) to the real vocabulary loses nothing only
    // while the padding rows are 0, which the model guarantees (no token selects them,
    // their logits are masked).
    const auto padding = params.subspan(tensor.offset + real, tensor.size() - real);
    DUFU_CHECK(std::all_of(padding.begin(), padding.end(), [](float x) { return x == 0.0f; }), "the padding rows of ",
               tensor.name, " are not 0; the checkpoint would drop them");
  }

  std::size_t transposed_size = 0;
  for (const ParamTensor& tensor : layout) {
    if (is_conv1d_weight(tensor.name)) transposed_size += tensor.size();
  }
  std::vector<float> transposed(transposed_size);
  std::vector<safetensors::TensorRef> refs;
  std::size_t used = 0;
  for (const ParamTensor& tensor : layout) {
    const float* data = params.data() + tensor.offset;
    if (is_conv1d_weight(tensor.name)) {
      transpose(data, tensor.shape[0], tensor.shape[1], transposed.data() + used);
      data = transposed.data() + used;
      used += tensor.size();
    }
    refs.push_back({hf_name(tensor, config), safetensors::Dtype::kF32, hf_shape(tensor, config), data});
  }
  safetensors::Metadata metadata{{"format", "pt"}};
  for (const ModelField& field : kModelFields) {
    if (writes_field(field, config)) metadata[field.name] = field.text(config);
  }
  safetensors::write(path, refs, metadata);
}

void read_model(const std::string& path, const Piece& piece, std::span<float> params) {
  const std::vector<ParamTensor> layout = piece.layout();
  check_size("read_model", params.size(), layout_size(layout));
  const safetensors::File file = safetensors::File::open(path);
  if (!piece.is_serial()) check_piece_metadata(file, piece);
  std::vector<std::span<const float>> views;
  std::set<std::string> expected;
  for (const ParamTensor& tensor : layout) {
    const std::string name = piece.is_serial() ? hf_name(tensor, piece.config) : tensor.name;
    views.push_back(checked_view(file, name, piece.is_serial() ? hf_shape(tensor, piece.config) : dufu_shape(tensor)));
    expected.insert(name);
  }
  check_no_other_tensors(file, expected);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const ParamTensor& tensor = layout[i];
    float* dst = params.data() + tensor.offset;
    if (piece.is_serial()) {
      place_hf_tensor(tensor, views[i], dst);
    } else {
      std::copy(views[i].begin(), views[i].end(), dst);
    }
  }
}

void write_optimizer(const std::string& path, const Piece& piece, std::span<const float> m,
                     std::span<const float> v, std::int64_t step_count) {
  const std::vector<ParamTensor> layout = piece.layout();
  check_size("write_optimizer", m.size(), layout_size(layout));
  check_size("write_optimizer", v.size(), layout_size(layout));
  check_finite(path, "AdamW first moments", m, layout);
  check_finite(path, "AdamW second moments", v, layout);
  std::vector<safetensors::TensorRef> refs;
  for (const ParamTensor& tensor : layout) {
    refs.push_back({"exp_avg." + tensor.name, safetensors::Dtype::kF32, dufu_shape(tensor), m.data() + tensor.offset});
    refs.push_back(
        {"exp_avg_sq." + tensor.name, safetensors::Dtype::kF32, dufu_shape(tensor), v.data() + tensor.offset});
  }
  refs.push_back({kStepTensor, safetensors::Dtype::kI64, {}, &step_count});
  safetensors::write(path, refs, piece.is_serial() ? safetensors::Metadata{{"format", "dufu-adamw"}}
                                                   : piece_metadata(piece, "dufu-adamw"));
}

std::int64_t read_optimizer(const std::string& path, const Piece& piece, std::span<float> m, std::span<float> v) {
  const std::vector<ParamTensor> layout = piece.layout();
  check_size("read_optimizer", m.size(), layout_size(layout));
  check_size("read_optimizer", v.size(), layout_size(layout));
  const safetensors::File file = safetensors::File::open(path);
  if (!piece.is_serial()) check_piece_metadata(file, piece);
  std::vector<std::span<const float>> m_views, v_views;
  std::set<std::string> expected = {kStepTensor};
  for (const ParamTensor& tensor : layout) {
    m_views.push_back(checked_view(file, "exp_avg." + tensor.name, dufu_shape(tensor)));
    v_views.push_back(checked_view(file, "exp_avg_sq." + tensor.name, dufu_shape(tensor)));
    expected.insert("exp_avg." + tensor.name);
    expected.insert("exp_avg_sq." + tensor.name);
  }
  check_no_other_tensors(file, expected);
  const std::int64_t step_count = read_step_count(file);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    std::copy(m_views[i].begin(), m_views[i].end(), m.data() + layout[i].offset);
    std::copy(v_views[i].begin(), v_views[i].end(), v.data() + layout[i].offset);
  }
  return step_count;
}

void write_optimizer_shard(const std::string& path, const Piece& piece, std::size_t begin,
                           std::span<const float> m, std::span<const float> v, std::int64_t step_count) {
  const std::size_t piece_parameters = layout_size(piece.layout());
  DUFU_CHECK(m.size() == v.size() && begin + m.size() <= piece_parameters, "write_optimizer_shard: shard [", begin,
             ", ", begin + m.size(), ") of a piece of ", piece_parameters);
  check_finite(path, "AdamW first moments", m, {});
  check_finite(path, "AdamW second moments", v, {});
  const std::vector<std::uint64_t> shape = {m.size()};
  const safetensors::TensorRef refs[] = {{"exp_avg", safetensors::Dtype::kF32, shape, m.data()},
                                         {"exp_avg_sq", safetensors::Dtype::kF32, shape, v.data()},
                                         {kStepTensor, safetensors::Dtype::kI64, {}, &step_count}};
  safetensors::Metadata metadata = piece_metadata(piece, "dufu-adamw-shard");
  metadata["shard_begin"] = std::to_string(begin);
  metadata["piece_parameters"] = std::to_string(piece_parameters);
  safetensors::write(path, refs, metadata);
}

std::int64_t read_optimizer_shard(const std::string& path, const Piece& piece, std::size_t begin, std::span<float> m,
                                  std::span<float> v) {
  const safetensors::File file = safetensors::File::open(path);
  check_piece_metadata(file, piece);
  check_metadata(file, "piece_parameters", layout_size(piece.layout()));
  check_metadata(file, "shard_begin", begin);
  const std::vector<std::uint64_t> shape = {m.size()};
  const std::span<const float> m_view = checked_view(file, "exp_avg", shape);
  const std::span<const float> v_view = checked_view(file, "exp_avg_sq", shape);
  check_no_other_tensors(file, {"exp_avg", "exp_avg_sq", kStepTensor});
  const std::int64_t step_count = read_step_count(file);
  std::copy(m_view.begin(), m_view.end(), m.begin());
  std::copy(v_view.begin(), v_view.end(), v.begin());
  return step_count;
}

FileRecord describe_file(const std::string& path) {
  const MappedFile file = MappedFile::open(path);
  return {file.size(), sha256_hex(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()))};
}

}  // namespace dufu::trainer::checkpoint_files
