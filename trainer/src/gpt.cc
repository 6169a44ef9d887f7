// GPT-2 on the CPU kernels: parameter layout, initialisation, forward and backward,
// serial or tensor parallel. The forward and backward are deliberately one flat
// sequence of kernel calls per layer, so each line can be matched against the PyTorch
// reference module; tensor parallelism only changes the sizes the kernels get (this
// rank's heads, hidden units and vocabulary) and adds the all-reduces between them.
// A pipeline stage runs the same sequence over its own layers, starting from the
// previous stage's output instead of the embedding and stopping before ln_f unless it
// is the last stage.
#include "dufu/trainer/gpt.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <utility>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/trainer/kernels.h"

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

// Carves one float buffer into tensors: each want() reserves a slot, allocate()
// sizes the buffer once and points every slot into it.
class BufferCarver {
 public:
  void want(float*& slot, std::size_t count) { slots_.emplace_back(&slot, count); }
  void allocate(std::vector<float>& memory) {
    std::size_t total = 0;
    for (const auto& slot : slots_) total += slot.second;
    // Release the old buffer first so growing does not briefly need both.
    memory = std::vector<float>();
    memory.assign(total, 0.0f);
    float* next = memory.data();
    for (const auto& [slot, count] : slots_) {
      *slot = next;
      next += count;
    }
  }

 private:
  std::vector<std::pair<float**, std::size_t>> slots_;
};

bool is_layernorm(const std::string& name) { return name.find("ln_") != std::string::npos; }
bool is_residual_projection(const std::string& name) {
  return name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.c_proj.weight");
}

// GPT-2's initialisation (GPT::init_gpt2) of a buffer in the full layout.
void init_gpt2_full(const GPTConfig& config, const std::vector<ParamTensor>& layout, std::span<float> buffer,
                    std::uint32_t seed) {
  NormalGenerator normal(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * config.n_layer);
  for (const ParamTensor& tensor : layout) {
    float* values = buffer.data() + tensor.offset;
    std::size_t drawn = tensor.size();
    if (tensor.name == "wte.weight") {
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

std::size_t layout_size(const std::vector<ParamTensor>& layout) { return layout.back().offset + layout.back().size(); }

// Calls copy(local_offset, full_offset, count) for every run of consecutive floats of
// rank `rank`'s piece `local` of the full tensor `full` (offsets from each tensor's
// start), as ParamTensor::split describes. Full rows from real_rows on have no
// counterpart (wte's padding, whose extent depends on tp) and are left out.
template <typename Copy>
void for_each_run(const ParamTensor& local, const ParamTensor& full, int tp, int rank, std::size_t real_rows,
                  Copy&& copy) {
  DUFU_CHECK(local.name == full.name && local.shape.size() == full.shape.size(), local.name, " vs ", full.name);
  const std::size_t pieces = static_cast<std::size_t>(local.split_blocks);
  const std::size_t ranks = static_cast<std::size_t>(tp);
  const std::size_t r = static_cast<std::size_t>(rank);
  switch (local.split) {
    case TensorSplit::kReplicated:
      DUFU_CHECK(local.size() == full.size(), local.name);
      copy(std::size_t{0}, std::size_t{0}, local.size());
      return;
    case TensorSplit::kRows: {
      const std::size_t width = local.shape.size() == 2 ? local.shape[1] : 1;
      const std::size_t piece_rows = local.shape[0] / pieces;
      DUFU_CHECK(piece_rows * pieces == local.shape[0] && real_rows <= full.shape[0] &&
                     real_rows <= piece_rows * pieces * ranks,
                 local.name);
      for (std::size_t block = 0; block < pieces; ++block) {
        const std::size_t first = (block * ranks + r) * piece_rows;  // full row of the piece's row 0
        const std::size_t rows = first >= real_rows ? 0 : std::min(piece_rows, real_rows - first);
        if (rows > 0) copy(block * piece_rows * width, first * width, rows * width);
      }
      return;
    }
    case TensorSplit::kColumns: {
      const std::size_t rows = local.shape[0];
      const std::size_t local_width = local.shape[1];
      const std::size_t full_width = full.shape[1];
      const std::size_t piece_columns = local_width / pieces;
      DUFU_CHECK(piece_columns * pieces * ranks == full_width && rows == full.shape[0], local.name);
      for (std::size_t row = 0; row < rows; ++row) {
        for (std::size_t block = 0; block < pieces; ++block) {
          copy(row * local_width + block * piece_columns,
               row * full_width + (block * ranks + r) * piece_columns, piece_columns);
        }
      }
      return;
    }
  }
}

// The rows of `full` that have a counterpart in the pieces: all, except wte's
// padding rows (and the real ones must fit the pieces of every tp).
std::size_t real_rows(const ParamTensor& full, const GPTConfig& config) {
  return full.name == "wte.weight" ? static_cast<std::size_t>(config.vocab_size) : full.shape[0];
}

void check_buffer_sizes(const char* operation, std::size_t full_got, std::size_t full_want, std::size_t local_got,
                        std::size_t local_want) {
  if (full_got != full_want || local_got != local_want) {
    DUFU_FAIL(operation, ": buffers of ", full_got, " (full) and ", local_got, " (this rank's piece) floats, the ",
              "layouts need ", full_want, " and ", local_want);
  }
}

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

PipelineStage resolve_stage(const GPTConfig& config, PipelineStage stage) {
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

}  // namespace

int GPTConfig::padded_vocab_size(int tensor_parallel_size) const {
  if (tensor_parallel_size < 1) DUFU_FAIL("tensor_parallel_size must be at least 1, got ", tensor_parallel_size);
  const long long multiple = static_cast<long long>(vocab_multiple) * tensor_parallel_size;
  const long long padded = (vocab_size + multiple - 1) / multiple * multiple;
  if (padded > INT_MAX) {
    DUFU_FAIL("GPT config: vocab_size ", vocab_size, " padded to a multiple of ", vocab_multiple, " x ",
              tensor_parallel_size, " (tensor parallel ranks) overflows int");
  }
  return static_cast<int>(padded);
}

void GPTConfig::validate() const {
  const std::pair<const char*, int> sizes[] = {{"n_layer", n_layer},       {"n_head", n_head},
                                               {"d_model", d_model},       {"vocab_size", vocab_size},
                                               {"vocab_multiple", vocab_multiple}, {"seq_length", seq_length}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) DUFU_FAIL("GPT config: ", field, " must be positive, got ", value);
  }
  if (d_model % n_head != 0) {
    DUFU_FAIL("GPT config: d_model ", d_model, " is not divisible by n_head ", n_head,
              "; HINT: each head gets d_model / n_head channels");
  }
  if (vocab_size > INT_MAX - vocab_multiple) {
    DUFU_FAIL("GPT config: vocab_size ", vocab_size, " padded to a multiple of ", vocab_multiple,
              " overflows int");
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
  if (tp < 1) DUFU_FAIL("tensor_parallel_size must be at least 1, got ", tp);
  if (config.n_head % tp != 0) {
    DUFU_FAIL("GPT config: n_head ", config.n_head, " is not divisible by the tensor parallel size ", tp,
              "; HINT: each tensor-parallel rank computes n_head / tp whole heads, so choose a tp that divides n_head");
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
  add("wte.weight", {static_cast<std::size_t>(config.padded_vocab_size(tp)), C}, rows);
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
  if (stages < 1) DUFU_FAIL("pipeline_parallel_size must be at least 1, got ", stages);
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
  if (stages < 1) DUFU_FAIL("pipeline_parallel_size must be at least 1, got ", stages);
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
  const PipelineStage resolved = resolve_stage(config, stage);
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

namespace {
// Calls copy(staged tensor, full tensor) for every tensor the stage holds.
template <typename Copy>
void for_each_staged(const GPTConfig& config, const PipelineStage& stage, std::size_t full_size,
                     std::size_t staged_size, const char* operation, Copy&& copy) {
  const std::vector<ParamTensor> full_layout = gpt_parameter_layout(config);
  const std::vector<ParamTensor> staged_layout = gpt_stage_layout(config, full_layout, stage);
  check_buffer_sizes(operation, full_size, layout_size(full_layout), staged_size, layout_size(staged_layout));
  std::size_t j = 0;
  for (const ParamTensor& tensor : staged_layout) {
    while (full_layout[j].name != tensor.name) ++j;
    copy(tensor, full_layout[j]);
  }
}
}  // namespace

void stage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> full,
                      std::span<float> staged) {
  for_each_staged(config, stage, full.size(), staged.size(), "stage_gpt_buffer",
                  [&](const ParamTensor& mine, const ParamTensor& whole) {
                    std::copy_n(full.data() + whole.offset, whole.size(), staged.data() + mine.offset);
                  });
}

void unstage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> staged,
                        std::span<float> full) {
  for_each_staged(config, stage, full.size(), staged.size(), "unstage_gpt_buffer",
                  [&](const ParamTensor& mine, const ParamTensor& whole) {
                    std::copy_n(staged.data() + mine.offset, mine.size(), full.data() + whole.offset);
                  });
}

namespace {
// Calls copy(piece offset, full offset, count) for every run of consecutive floats the
// piece of (tp_rank, stage) shares with the full serial layout, after checking both
// buffers' sizes.
template <typename Copy>
void for_each_piece_run(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                        std::size_t full_size, std::size_t piece_size, const char* operation, Copy&& copy) {
  if (tp_rank < 0 || tp_rank >= tp) DUFU_FAIL(operation, ": tensor rank ", tp_rank, " is not in [0, ", tp, ")");
  const std::vector<ParamTensor> full_layout = gpt_parameter_layout(config);
  const std::vector<ParamTensor> piece_layout = gpt_stage_layout(config, gpt_parameter_layout(config, tp), stage);
  check_buffer_sizes(operation, full_size, layout_size(full_layout), piece_size, layout_size(piece_layout));
  std::size_t j = 0;
  for (const ParamTensor& piece : piece_layout) {
    while (full_layout[j].name != piece.name) ++j;
    const ParamTensor& whole = full_layout[j];
    for_each_run(piece, whole, tp, tp_rank, real_rows(whole, config),
                 [&](std::size_t piece_offset, std::size_t full_offset, std::size_t count) {
                   copy(piece.offset + piece_offset, whole.offset + full_offset, count);
                 });
  }
}

// The moves between the serial layout and a piece, with `operation` naming the
// public function in messages.
void shard_piece(const char* operation, const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                 std::span<const float> full, std::span<float> piece) {
  std::fill(piece.begin(), piece.end(), 0.0f);  // wte's padding rows
  for_each_piece_run(config, tp, tp_rank, stage, full.size(), piece.size(), operation,
                     [&](std::size_t piece_offset, std::size_t full_offset, std::size_t count) {
                       std::copy_n(full.data() + full_offset, count, piece.data() + piece_offset);
                     });
}

void unshard_piece(const char* operation, const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                   std::span<const float> piece, std::span<float> full) {
  for_each_piece_run(config, tp, tp_rank, stage, full.size(), piece.size(), operation,
                     [&](std::size_t piece_offset, std::size_t full_offset, std::size_t count) {
                       std::copy_n(piece.data() + piece_offset, count, full.data() + full_offset);
                     });
}
}  // namespace

void shard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> full,
                      std::span<float> local) {
  shard_piece("shard_gpt_buffer", config, tp, rank, PipelineStage{}, full, local);
}

void unshard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> local,
                        std::span<float> full) {
  unshard_piece("unshard_gpt_buffer", config, tp, rank, PipelineStage{}, local, full);
}

void shard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                     std::span<const float> full, std::span<float> piece) {
  shard_piece("shard_gpt_piece", config, tp, tp_rank, stage, full, piece);
}

void unshard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                       std::span<const float> piece, std::span<float> full) {
  unshard_piece("unshard_gpt_piece", config, tp, tp_rank, stage, piece, full);
}

GPT::GPT(const GPTConfig& config, Communicator* tensor_group, const PipelineStage& stage)
    : config_(config),
      stage_(resolve_stage(config, stage)),
      tensor_group_(tensor_group != nullptr && tensor_group->size() > 1 ? tensor_group : nullptr),
      tp_(tensor_group_ != nullptr ? tensor_group_->size() : 1),
      tp_rank_(tensor_group_ != nullptr ? tensor_group_->rank() : 0),
      layout_(gpt_stage_layout(config, gpt_parameter_layout(config, tp_), stage_)),
      full_layout_(tp_ > 1 ? gpt_stage_layout(config, gpt_parameter_layout(config), stage_) : layout_),
      params_(layout_size(layout_), 0.0f),
      grads_(params_.size(), 0.0f),
      p_(tensors(params_)),
      g_(tensors(grads_)) {}

std::size_t GPT::num_full_parameters() const { return layout_size(full_layout_); }

std::vector<float> GPT::gather_full(std::span<const float> local) const {
  std::vector<float> full(num_full_parameters(), 0.0f);
  check_buffer_sizes("GPT::gather_full", full.size(), full.size(), local.size(), params_.size());
  std::vector<float> pieces;  // one tensor's pieces from every rank, in rank order
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const ParamTensor& piece = layout_[i];
    const ParamTensor& whole = full_layout_[i];
    const std::span<const float> mine = local.subspan(piece.offset, piece.size());
    if (tp_ == 1 || piece.split == TensorSplit::kReplicated) {
      std::copy(mine.begin(), mine.end(), full.begin() + static_cast<std::ptrdiff_t>(whole.offset));
      continue;
    }
    pieces.resize(piece.size() * static_cast<std::size_t>(tp_));
    tensor_group_->all_gather(mine, pieces);
    for (int rank = 0; rank < tp_; ++rank) {
      const float* from = pieces.data() + static_cast<std::size_t>(rank) * piece.size();
      for_each_run(piece, whole, tp_, rank, real_rows(whole, config_),
                   [&](std::size_t local_offset, std::size_t full_offset, std::size_t count) {
                     std::copy_n(from + local_offset, count, full.data() + whole.offset + full_offset);
                   });
    }
  }
  return full;
}

void GPT::shard_full(std::span<const float> full, std::span<float> local) const {
  if (tp_ == 1) {
    check_buffer_sizes("GPT::shard_full", full.size(), params_.size(), local.size(), params_.size());
    std::copy(full.begin(), full.end(), local.begin());
    return;
  }
  // full_layout_ is the stage's part of the serial layout, tensor for tensor with
  // layout_.
  check_buffer_sizes("GPT::shard_full", full.size(), num_full_parameters(), local.size(), params_.size());
  std::fill(local.begin(), local.end(), 0.0f);  // wte's padding rows
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const ParamTensor& piece = layout_[i];
    const ParamTensor& whole = full_layout_[i];
    for_each_run(piece, whole, tp_, tp_rank_, real_rows(whole, config_),
                 [&](std::size_t local_offset, std::size_t full_offset, std::size_t count) {
                   std::copy_n(full.data() + whole.offset + full_offset, count,
                               local.data() + piece.offset + local_offset);
                 });
  }
}

double GPT::full_sum_of_squares(std::span<const float> local) const {
  if (local.size() != params_.size()) {
    DUFU_FAIL("GPT::full_sum_of_squares: buffer of ", local.size(), " floats, the parameters need ", params_.size());
  }
  if (tp_ == 1 && !stage_.holds_wte_copy()) return sum_of_squares(local.data(), local.size());
  // Replicated tensors are identical on every rank, so each rank adds them up alone
  // and gets the same sum; the pieces of split tensors are summed over the group.
  double replicated = 0.0;
  double split = 0.0;
  for (const ParamTensor& tensor : layout_) {
    if (stage_.holds_wte_copy() && tensor.name == "wte.weight") continue;  // counted on the first stage
    const double sum = sum_of_squares(local.data() + tensor.offset, tensor.size());
    (tensor.split == TensorSplit::kReplicated ? replicated : split) += sum;
  }
  return replicated + (tp_ > 1 ? tensor_group_->all_reduce_value(split) : split);
}

void GPT::reduce_over_tensor_group(float* data, std::size_t count) {
  if (tensor_group_ != nullptr) tensor_group_->all_reduce(std::span<float>(data, count));
}

const ParamTensor& GPT::tensor(std::string_view name) const {
  for (const ParamTensor& tensor : layout_) {
    if (tensor.name == name) return tensor;
  }
  DUFU_FAIL("GPT has no parameter tensor named '", name, "'; HINT: names follow HuggingFace's GPT2Model, ",
            "e.g. wte.weight, h.0.attn.c_attn.weight, ln_f.bias");
}

GPTTensors GPT::tensors(std::span<float> buffer) const {
  if (buffer.size() != params_.size()) {
    DUFU_FAIL("GPT::tensors: buffer of ", buffer.size(), " floats, the parameters need ", params_.size());
  }
  // Walks the layout in the order gpt_parameter_layout wrote it; the name check keeps
  // the two in step if either changes.
  std::size_t index = 0;
  const auto next = [&](std::string_view expected) {
    const ParamTensor& tensor = layout_[index++];
    DUFU_CHECK(tensor.name == expected, "layout has ", tensor.name, " where ", expected, " was expected");
    return buffer.data() + tensor.offset;
  };
  GPTTensors views{};
  views.wte = stage_.holds_wte() ? next("wte.weight") : nullptr;
  views.wpe = stage_.is_first() ? next("wpe.weight") : nullptr;
  views.h.resize(static_cast<std::size_t>(stage_.num_layers));
  for (int local = 0; local < stage_.num_layers; ++local) {
    const std::string prefix = str_cat("h.", stage_.first_layer + local, ".");
    GPTLayerTensors& h = views.h[static_cast<std::size_t>(local)];
    h.ln_1_weight = next(prefix + "ln_1.weight");
    h.ln_1_bias = next(prefix + "ln_1.bias");
    h.attn_c_attn_weight = next(prefix + "attn.c_attn.weight");
    h.attn_c_attn_bias = next(prefix + "attn.c_attn.bias");
    h.attn_c_proj_weight = next(prefix + "attn.c_proj.weight");
    h.attn_c_proj_bias = next(prefix + "attn.c_proj.bias");
    h.ln_2_weight = next(prefix + "ln_2.weight");
    h.ln_2_bias = next(prefix + "ln_2.bias");
    h.mlp_c_fc_weight = next(prefix + "mlp.c_fc.weight");
    h.mlp_c_fc_bias = next(prefix + "mlp.c_fc.bias");
    h.mlp_c_proj_weight = next(prefix + "mlp.c_proj.weight");
    h.mlp_c_proj_bias = next(prefix + "mlp.c_proj.bias");
  }
  views.ln_f_weight = stage_.is_last() ? next("ln_f.weight") : nullptr;
  views.ln_f_bias = stage_.is_last() ? next("ln_f.bias") : nullptr;
  DUFU_CHECK(index == layout_.size());
  return views;
}

void GPT::init_gpt2(std::uint32_t seed) {
  const bool whole_model = stage_.num_stages == 1;
  if (tp_ == 1 && whole_model) {
    init_gpt2_full(config_, layout_, params_, seed);
    return;
  }
  // The whole model's draws in buffer order, then this stage's tensors, then this
  // tensor-parallel rank's pieces.
  std::vector<float> full(layout_size(gpt_parameter_layout(config_)));
  init_gpt2_full(config_, gpt_parameter_layout(config_), full, seed);
  if (!whole_model) {
    std::vector<float> staged(num_full_parameters());
    stage_gpt_buffer(config_, stage_, full, staged);
    full = std::move(staged);
  }
  shard_full(full, params_);
}

void GPT::check_batch(std::span<const std::int32_t> tokens, std::span<const float> input,
                      std::span<const std::int32_t> targets, int B, int T) const {
  if (B <= 0 || T <= 0) DUFU_FAIL("GPT::forward: batch ", B, " x ", T, " must have positive sizes");
  if (T > config_.seq_length) {
    DUFU_FAIL("GPT::forward: sequence of ", T, " positions, the model has ", config_.seq_length,
              "; HINT: raise seq_length or shorten the batch");
  }
  const std::size_t rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  if (rows > static_cast<std::size_t>(INT_MAX)) DUFU_FAIL("GPT::forward: batch ", B, " x ", T, " overflows int");
  if (stage_.is_first()) {
    if (tokens.size() != rows) DUFU_FAIL("GPT::forward: ", tokens.size(), " tokens for a batch of ", B, " x ", T);
    if (!input.empty()) DUFU_FAIL("GPT::forward_stage: the first pipeline stage takes tokens, not an input");
  } else {
    if (!tokens.empty()) {
      DUFU_FAIL("GPT::forward_stage: pipeline stage ", stage_.stage, " takes the previous stage's output, not tokens");
    }
    const std::size_t want = rows * static_cast<std::size_t>(config_.d_model);
    if (input.size() != want) {
      DUFU_FAIL("GPT::forward_stage: pipeline stage ", stage_.stage, " got an input of ", input.size(),
                " floats for a batch of ", B, " x ", T, " x ", config_.d_model, " (", want, ")");
    }
  }
  if (!targets.empty() && !stage_.is_last()) {
    DUFU_FAIL("GPT::forward_stage: pipeline stage ", stage_.stage, " of ", stage_.num_stages,
              " has no LM head; HINT: pass the targets to the last stage only");
  }
  if (!targets.empty() && targets.size() != rows) {
    DUFU_FAIL("GPT::forward: ", targets.size(), " targets for a batch of ", B, " x ", T);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      DUFU_FAIL("GPT::forward: token ", tokens[i], " at position ", i, " is outside the vocabulary [0, ",
                config_.vocab_size, "); HINT: the tokenizer and the model's vocab_size must agree");
    }
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < -1 || targets[i] >= config_.vocab_size) {
      DUFU_FAIL("GPT::forward: target ", targets[i], " at position ", i, " is neither -1 (ignored) nor in [0, ",
                config_.vocab_size, ")");
    }
  }
}

void GPT::require_whole_model(const char* operation) const {
  if (stage_.num_stages != 1) {
    DUFU_FAIL(operation, ": this GPT is pipeline stage ", stage_.stage, " of ", stage_.num_stages,
              "; HINT: run a stage with forward_stage and backward_stage (pipeline_schedule.h)");
  }
}

GPT::ActivationSlot& GPT::activation_slot(int slot) {
  if (slot < 0) DUFU_FAIL("GPT: activation slot ", slot, " is negative");
  if (static_cast<std::size_t>(slot) >= slots_.size()) slots_.resize(static_cast<std::size_t>(slot) + 1);
  return slots_[static_cast<std::size_t>(slot)];
}

int GPT::activation_slots() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const ActivationSlot& slot) { return !slot.memory.empty(); }));
}

void GPT::ensure_activations(ActivationSlot& slot, int B, int T) {
  if (B <= slot.capacity_b && T <= slot.capacity_t) return;
  slot.capacity_b = std::max(B, slot.capacity_b);
  slot.capacity_t = std::max(T, slot.capacity_t);
  const std::size_t N = static_cast<std::size_t>(slot.capacity_b) * static_cast<std::size_t>(slot.capacity_t);
  const std::size_t C = static_cast<std::size_t>(config_.d_model);
  // This rank's share: channels of its heads, its heads, hidden units, vocabulary.
  const std::size_t ranks = static_cast<std::size_t>(tp_);
  const std::size_t Cl = C / ranks;
  const std::size_t att =
      N * static_cast<std::size_t>(config_.n_head) / ranks * static_cast<std::size_t>(slot.capacity_t);
  const std::size_t Vl = static_cast<std::size_t>(local_vocab_size());

  Activations& acts = slot.acts;
  BufferCarver carver;
  acts.layers.resize(static_cast<std::size_t>(stage_.num_layers));
  carver.want(acts.encoded, N * C);  // the embedding, or the previous stage's output
  for (LayerActivations& layer : acts.layers) {
    carver.want(layer.ln_1, N * C);
    carver.want(layer.ln_1_mean, N);
    carver.want(layer.ln_1_rstd, N);
    carver.want(layer.qkv, N * 3 * Cl);
    carver.want(layer.att, att);
    carver.want(layer.atty, N * Cl);
    carver.want(layer.residual_mid, N * C);
    carver.want(layer.ln_2, N * C);
    carver.want(layer.ln_2_mean, N);
    carver.want(layer.ln_2_rstd, N);
    carver.want(layer.fc_pre, N * 4 * Cl);
    carver.want(layer.fc_gelu, N * 4 * Cl);
    carver.want(layer.residual_out, N * C);
  }
  if (stage_.is_last()) {
    carver.want(acts.ln_f, N * C);
    carver.want(acts.ln_f_mean, N);
    carver.want(acts.ln_f_rstd, N);
    carver.want(acts.logits, N * Vl);
    carver.want(acts.losses, N);
  }
  carver.want(acts.fc_out, N * 4 * Cl);
  carver.want(acts.branch, N * C);
  carver.allocate(slot.memory);
  slot.has_logits = false;
  slot.backward_pending = false;
}

void GPT::ensure_activation_grads(int B, int T) {
  if (B <= grad_capacity_b_ && T <= grad_capacity_t_) return;
  grad_capacity_b_ = std::max(B, grad_capacity_b_);
  grad_capacity_t_ = std::max(T, grad_capacity_t_);
  const std::size_t N = static_cast<std::size_t>(grad_capacity_b_) * static_cast<std::size_t>(grad_capacity_t_);
  const std::size_t C = static_cast<std::size_t>(config_.d_model);
  const std::size_t ranks = static_cast<std::size_t>(tp_);
  const std::size_t Cl = C / ranks;
  const std::size_t att =
      N * static_cast<std::size_t>(config_.n_head) / ranks * static_cast<std::size_t>(grad_capacity_t_);

  BufferCarver carver;
  carver.want(dacts_.residual, N * C);
  carver.want(dacts_.ln, N * C);
  carver.want(dacts_.atty, N * Cl);
  carver.want(dacts_.qkv, N * 3 * Cl);
  carver.want(dacts_.att, att);
  carver.want(dacts_.fc_gelu, N * 4 * Cl);
  carver.want(dacts_.fc_pre, N * 4 * Cl);
  carver.allocate(activation_grad_memory_);
}

float GPT::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T) {
  const auto counted = std::count_if(targets.begin(), targets.end(), [](std::int32_t t) { return t != -1; });
  return forward(tokens, targets, B, T, 1.0f / static_cast<float>(std::max<std::ptrdiff_t>(counted, 1)));
}

float GPT::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T,
                   float dloss_scale) {
  require_whole_model("GPT::forward");
  return forward_stage(0, tokens, {}, targets, B, T, dloss_scale);
}

float GPT::forward_stage(int slot_index, std::span<const std::int32_t> tokens, std::span<const float> input,
                         std::span<const std::int32_t> targets, int B, int T, float dloss_scale) {
  check_batch(tokens, input, targets, B, T);
  if (!std::isfinite(dloss_scale)) DUFU_FAIL("GPT::forward: dloss_scale ", dloss_scale, " is not finite");
  ActivationSlot& slot = activation_slot(slot_index);
  ensure_activations(slot, B, T);
  Activations& acts = slot.acts;
  if (stage_.is_first()) slot.tokens.assign(tokens.begin(), tokens.end());
  slot.batch_b = B;
  slot.batch_t = T;
  const int N = B * T;
  const int C = config_.d_model;
  const int L = stage_.num_layers;
  // This rank's share (all of it when serial): channels of its heads, its heads,
  // hidden units of the MLP, columns of the vocabulary.
  const int Cl = C / tp_;
  const int NHl = config_.n_head / tp_;
  const int Vl = local_vocab_size();
  const std::size_t rows = static_cast<std::size_t>(N);
  const std::size_t stream = rows * static_cast<std::size_t>(C);  // floats of an [N, C] activation

  // Tensor parallel, two kinds of linear layer (Megatron-LM): column-parallel c_attn
  // and c_fc take the whole (replicated) LayerNorm output and produce this rank's
  // heads or hidden units; row-parallel c_proj turn those into a partial sum of the
  // [N, C] output, which an all-reduce completes. The c_proj bias joins on rank 0
  // only, so the sum adds it once; likewise wpe in the vocab-parallel embedding.
  const bool adds_replicated = tp_rank_ == 0;
  if (!stage_.is_first()) {
    std::copy(input.begin(), input.end(), acts.encoded);
  } else if (tp_ == 1) {
    embedding_forward(acts.encoded, tokens.data(), p_.wte, p_.wpe, B, T, C);
  } else {
    vocab_parallel_embedding_forward(acts.encoded, tokens.data(), p_.wte, adds_replicated ? p_.wpe : nullptr,
                                     vocab_begin(), Vl, B, T, C);
    reduce_over_tensor_group(acts.encoded, stream);
  }
  LayerActivations& first = acts.layers[0];
  layernorm_forward(first.ln_1, first.ln_1_mean, first.ln_1_rstd, acts.encoded, p_.h[0].ln_1_weight,
                    p_.h[0].ln_1_bias, N, C);
  for (int l = 0; l < L; ++l) {
    const GPTLayerTensors& w = p_.h[static_cast<std::size_t>(l)];
    LayerActivations& a = acts.layers[static_cast<std::size_t>(l)];
    const float* residual_in = l == 0 ? acts.encoded : acts.layers[static_cast<std::size_t>(l - 1)].residual_out;

    // The local qkv is [q, k, v] of this rank's heads, so attention runs unchanged on
    // Cl channels and NHl heads.
    matmul_forward(a.qkv, a.ln_1, w.attn_c_attn_weight, w.attn_c_attn_bias, N, C, 3 * Cl);
    attention_forward(a.atty, a.att, a.qkv, B, T, Cl, NHl);
    matmul_forward(acts.branch, a.atty, w.attn_c_proj_weight, adds_replicated ? w.attn_c_proj_bias : nullptr, N, Cl,
                   C);
    if (tp_ > 1) reduce_over_tensor_group(acts.branch, stream);
    residual_layernorm_forward(a.residual_mid, a.ln_2, a.ln_2_mean, a.ln_2_rstd, residual_in, acts.branch,
                               w.ln_2_weight, w.ln_2_bias, N, C);

    matmul_forward(acts.fc_out, a.ln_2, w.mlp_c_fc_weight, nullptr, N, C, 4 * Cl);
    bias_gelu_forward(a.fc_gelu, a.fc_pre, acts.fc_out, w.mlp_c_fc_bias, N, 4 * Cl);
    matmul_forward(acts.branch, a.fc_gelu, w.mlp_c_proj_weight, adds_replicated ? w.mlp_c_proj_bias : nullptr, N,
                   4 * Cl, C);
    if (tp_ > 1) reduce_over_tensor_group(acts.branch, stream);

    // The block's output goes straight into the next LayerNorm: the next layer's
    // ln_1, or ln_f after the model's last layer. A stage before the last ends in the
    // plain residual add; the next stage's first ln_1 normalises it.
    if (l + 1 < L) {
      const GPTLayerTensors& next_w = p_.h[static_cast<std::size_t>(l + 1)];
      LayerActivations& next_a = acts.layers[static_cast<std::size_t>(l + 1)];
      residual_layernorm_forward(a.residual_out, next_a.ln_1, next_a.ln_1_mean, next_a.ln_1_rstd, a.residual_mid,
                                 acts.branch, next_w.ln_1_weight, next_w.ln_1_bias, N, C);
    } else if (stage_.is_last()) {
      residual_layernorm_forward(a.residual_out, acts.ln_f, acts.ln_f_mean, acts.ln_f_rstd, a.residual_mid,
                                 acts.branch, p_.ln_f_weight, p_.ln_f_bias, N, C);
    } else {
      for (std::size_t i = 0; i < stream; ++i) a.residual_out[i] = a.residual_mid[i] + acts.branch[i];
    }
  }
  if (!stage_.is_last()) {
    slot.has_logits = false;
    slot.backward_pending = true;
    return std::numeric_limits<float>::quiet_NaN();
  }
  // The tied LM head: this rank's rows of wte give its columns of the logits.
  matmul_forward(acts.logits, acts.ln_f, p_.wte, nullptr, N, C, Vl);

  if (targets.empty()) {
    slot.has_logits = true;
    slot.backward_pending = false;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const int V = config_.vocab_size;
  if (tp_ == 1) {
    classifier_forward_backward(acts.logits, acts.losses, targets.data(), dloss_scale, N, V, Vl);
  } else {
    // Vocab-parallel cross-entropy: the ranks combine row maxima, then sums of exp
    // and the target logits (2N numbers per all-reduce), never the logits themselves.
    row_max_.resize(rows);
    row_stats_.resize(2 * rows);
    vocab_parallel_classifier_max(row_max_.data(), acts.logits, targets.data(), N, V, vocab_begin(), Vl);
    tensor_group_->all_reduce(row_max_, ReduceOp::kMax);
    vocab_parallel_classifier_exp_sum(row_stats_.data(), acts.logits, row_max_.data(), targets.data(), N, V,
                                      vocab_begin(), Vl);
    tensor_group_->all_reduce(row_stats_);
    vocab_parallel_classifier_finish(acts.logits, acts.losses, row_stats_.data(), row_max_.data(), targets.data(),
                                     dloss_scale, N, V, vocab_begin(), Vl);
  }
  slot.has_logits = false;
  slot.backward_pending = true;
  double sum = 0.0;
  std::size_t counted = 0;
  for (int i = 0; i < N; ++i) {
    if (targets[static_cast<std::size_t>(i)] == -1) continue;
    sum += acts.losses[i];
    ++counted;
  }
  return counted == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(counted));
}

std::span<const float> GPT::logits() const {
  if (slots_.empty() || !slots_[0].has_logits) {
    DUFU_FAIL("GPT::logits: no logits to read; HINT: call forward without targets first (with targets the ",
              "classifier turns the logits into their gradient)");
  }
  const ActivationSlot& slot = slots_[0];
  const std::size_t rows = static_cast<std::size_t>(slot.batch_b) * static_cast<std::size_t>(slot.batch_t);
  return {slot.acts.logits, rows * static_cast<std::size_t>(local_vocab_size())};
}

std::span<const float> GPT::stage_output(int slot_index) const {
  if (stage_.is_last()) DUFU_FAIL("GPT::stage_output: the last pipeline stage ends in the loss, not an output");
  if (slot_index < 0 || static_cast<std::size_t>(slot_index) >= slots_.size() ||
      slots_[static_cast<std::size_t>(slot_index)].memory.empty()) {
    DUFU_FAIL("GPT::stage_output: activation slot ", slot_index, " has had no forward");
  }
  const ActivationSlot& slot = slots_[static_cast<std::size_t>(slot_index)];
  const std::size_t count = static_cast<std::size_t>(slot.batch_b) * static_cast<std::size_t>(slot.batch_t) *
                            static_cast<std::size_t>(config_.d_model);
  return {slot.acts.layers.back().residual_out, count};
}

void GPT::zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void GPT::backward() {
  require_whole_model("GPT::backward");
  backward_stage(0, {});
}

std::span<const float> GPT::backward_stage(int slot_index, std::span<const float> d_output) {
  if (slot_index < 0 || static_cast<std::size_t>(slot_index) >= slots_.size() ||
      !slots_[static_cast<std::size_t>(slot_index)].backward_pending) {
    DUFU_FAIL("GPT::backward: no forward with targets to go back through",
              stage_.num_stages > 1 ? str_cat(" in activation slot ", slot_index) : std::string(),
              "; HINT: call forward with targets once before each backward");
  }
  ActivationSlot& slot = slots_[static_cast<std::size_t>(slot_index)];
  const int B = slot.batch_b;
  const int T = slot.batch_t;
  const int N = B * T;
  const int C = config_.d_model;
  const int Cl = C / tp_;
  const int NHl = config_.n_head / tp_;
  const int Vl = local_vocab_size();
  const std::size_t rows = static_cast<std::size_t>(N);
  const std::size_t stream = rows * static_cast<std::size_t>(C);
  if (stage_.is_last() != d_output.empty() || (!d_output.empty() && d_output.size() != stream)) {
    DUFU_FAIL("GPT::backward_stage: pipeline stage ", stage_.stage, " of ", stage_.num_stages, " got ",
              d_output.size(), " floats of output gradient; it needs ", stage_.is_last() ? std::size_t{0} : stream,
              " (the last stage starts from its loss)");
  }
  slot.backward_pending = false;
  ensure_activation_grads(B, T);
  const Activations& acts = slot.acts;
  const ActivationGrads& d = dacts_;

  // Tensor parallel, the conjugates of the forward's communication: a column-parallel
  // layer (c_attn, c_fc, the LM head) got the whole LayerNorm output on every rank,
  // so the gradient of that input is the sum of every rank's part, an all-reduce; a
  // row-parallel layer (c_proj) got the all-reduced sum, whose backward hands each
  // rank the same output gradient with no communication, and so does the embedding.
  //
  // After each all-reduce the residual stream's gradient d.residual is bitwise the
  // same on every rank, and so are the LayerNorm inputs and weights it meets, so every
  // rank computes bitwise the same gradients for the replicated parameters (wpe, the
  // LayerNorms, the c_proj biases): they need no reduction over the group.

  if (stage_.is_last()) {
    // The classifier left dloss/dlogits in the logits buffer.
    matmul_backward(d.ln, g_.wte, nullptr, acts.logits, acts.ln_f, p_.wte, N, C, Vl);
    if (tp_ > 1) reduce_over_tensor_group(d.ln, stream);
    const LayerActivations& last = acts.layers.back();
    std::fill_n(d.residual, stream, 0.0f);
    layernorm_backward(d.residual, g_.ln_f_weight, g_.ln_f_bias, d.ln, last.residual_out, p_.ln_f_weight,
                       acts.ln_f_mean, acts.ln_f_rstd, N, C);
  } else {
    // The next stage's input gradient is this stage's output gradient.
    std::copy(d_output.begin(), d_output.end(), d.residual);
  }

  // d.residual carries the gradient of the residual stream down the layers: each
  // branch reads it as the gradient of its output, and each LayerNorm backward adds
  // its input's gradient to it, which is the residual add's backward.
  for (int l = stage_.num_layers - 1; l >= 0; --l) {
    const GPTLayerTensors& w = p_.h[static_cast<std::size_t>(l)];
    const GPTLayerTensors& dw = g_.h[static_cast<std::size_t>(l)];
    const LayerActivations& a = acts.layers[static_cast<std::size_t>(l)];
    const float* residual_in = l == 0 ? acts.encoded : acts.layers[static_cast<std::size_t>(l - 1)].residual_out;

    matmul_backward(d.fc_gelu, dw.mlp_c_proj_weight, dw.mlp_c_proj_bias, d.residual, a.fc_gelu, w.mlp_c_proj_weight,
                    N, 4 * Cl, C);
    bias_gelu_backward(d.fc_pre, dw.mlp_c_fc_bias, d.fc_gelu, a.fc_pre, N, 4 * Cl);
    matmul_backward(d.ln, dw.mlp_c_fc_weight, nullptr, d.fc_pre, a.ln_2, w.mlp_c_fc_weight, N, C, 4 * Cl);
    if (tp_ > 1) reduce_over_tensor_group(d.ln, stream);
    layernorm_backward(d.residual, dw.ln_2_weight, dw.ln_2_bias, d.ln, a.residual_mid, w.ln_2_weight, a.ln_2_mean,
                       a.ln_2_rstd, N, C);

    matmul_backward(d.atty, dw.attn_c_proj_weight, dw.attn_c_proj_bias, d.residual, a.atty, w.attn_c_proj_weight, N,
                    Cl, C);
    attention_backward(d.qkv, d.att, d.atty, a.qkv, a.att, B, T, Cl, NHl);
    matmul_backward(d.ln, dw.attn_c_attn_weight, dw.attn_c_attn_bias, d.qkv, a.ln_1, w.attn_c_attn_weight, N, C,
                    3 * Cl);
    if (tp_ > 1) reduce_over_tensor_group(d.ln, stream);
    layernorm_backward(d.residual, dw.ln_1_weight, dw.ln_1_bias, d.ln, residual_in, w.ln_1_weight, a.ln_1_mean,
                       a.ln_1_rstd, N, C);
  }
  if (!stage_.is_first()) return {d.residual, stream};  // the previous stage's output gradient
  if (tp_ == 1) {
    embedding_backward(g_.wte, g_.wpe, d.residual, slot.tokens.data(), B, T, C);
  } else {
    vocab_parallel_embedding_backward(g_.wte, g_.wpe, d.residual, slot.tokens.data(), vocab_begin(), Vl, B, T, C);
  }
  return {};
}

}  // namespace dufu::trainer
