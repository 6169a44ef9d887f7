// The GPT-2 model on top of the kernels (kernels.h): configuration, every parameter
// in one contiguous buffer under HuggingFace's GPT2Model names, GPT-2 initialisation,
// and a forward and backward written out layer by layer, like llm.c's train_gpt2.c,
// so that each step can be read next to the PyTorch reference that checks it
// (tests/reference/gpt_torch_reference.py).
//
// The same model runs tensor parallel (Megatron-LM's layout, Shoeybi et al. 2019)
// when given a group of ranks: each rank holds a slice of the heads, of the MLP's
// hidden units and of the vocabulary, and the ranks meet in one all-reduce per
// row-parallel projection and per column-parallel input gradient. Without a group (or
// with a group of one) it is the serial model, unchanged bit for bit.
//
// It also runs as one stage of a pipeline (Megatron-LM's layout, Narayanan et al.
// 2021) when given a PipelineStage: the stage holds a contiguous range of layers, the
// first stage the embedding (wte, wpe), the last ln_f and the LM head with its own
// copy of wte, whose gradient is summed with the first stage's (pipeline_schedule.h).
// A stage keeps the activations of several micro-batches at once (activation slots),
// as the 1F1B schedule needs. Tensor and pipeline parallelism combine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dufu {
class Communicator;
}

namespace dufu::trainer {

struct GPTConfig {
  int n_layer = 12;
  int n_head = 12;
  int d_model = 768;
  int vocab_size = 50257;
  // wte gets padded_vocab_size() rows, a multiple of this, so the classifier's
  // matmul works on round sizes (50257 -> 50304 with 128, as in llm.c).
  int vocab_multiple = 128;
  int seq_length = 1024;  // maximum number of positions (rows of wpe)

  // vocab_size rounded up to a multiple of vocab_multiple x tensor_parallel_size (as
  // Megatron-LM does), so the rows of wte split evenly over the tensor-parallel ranks
  // and each rank's slice is still a multiple of vocab_multiple: 50257 -> 50304 for
  // tp 1, 50688 for tp 4 (a multiple of 512). Rows from vocab_size on are padding:
  // zero, and excluded from the softmax, so the loss does not depend on tp. Throws
  // dufu::Error if the padded size overflows int or tensor_parallel_size < 1.
  int padded_vocab_size(int tensor_parallel_size = 1) const;
  // Throws dufu::Error naming the field for a size that is not positive, or for a
  // d_model that n_head does not divide.
  void validate() const;
};

// Which layers one pipeline stage holds. The default is the whole model (one stage).
// Stage `stage` of `num_stages` holds layers [first_layer, first_layer + num_layers);
// the first stage also holds wte and wpe, the last ln_f and (for the tied LM head) a
// copy of wte. A num_layers below 0 means "to the last layer".
struct PipelineStage {
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;
  int num_layers = -1;
  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage + 1 == num_stages; }
  // The last stage of several keeps a copy of the first stage's wte.
  bool holds_wte() const { return is_first() || is_last(); }
  bool holds_wte_copy() const { return is_last() && !is_first(); }
};

// Layers per stage for `stages` pipeline stages of an n_layer model. With an empty
// `pipeline_num_layers`, an even split: n_layer / stages each, the first
// n_layer % stages stages one more. Otherwise pipeline_num_layers is the list of
// layers per stage, one positive entry per stage, summing to n_layer. Throws
// dufu::Error when stages < 1, stages > n_layer (every stage needs a layer), or the
// list has the wrong length, a non-positive entry or the wrong sum.
std::vector<int> pipeline_layer_split(int n_layer, int stages, std::span<const int> pipeline_num_layers = {});
// The same from explicit stage ids: stage_of_layer[i] is the stage of layer i, one per
// layer, non-decreasing from 0 to stages - 1 without gaps. Throws dufu::Error
// otherwise.
std::vector<int> pipeline_layer_split_from_stage_ids(int n_layer, int stages, std::span<const int> stage_of_layer);
// Stage `stage` of a split (layers per stage). Throws dufu::Error for a stage outside
// the split or a non-positive entry.
PipelineStage pipeline_stage(std::span<const int> layers_per_stage, int stage);

// How a tensor of a tensor-parallel rank is cut from the full tensor (ParamTensor).
enum class TensorSplit {
  kReplicated,  // every rank holds the whole tensor
  kRows,        // cut along dimension 0 (the only one of a 1-D tensor)
  kColumns,     // cut along dimension 1
};

// One parameter tensor inside the contiguous buffer. Matrices are stored [out, in]
// (the layout of our matmul and of torch.nn.Linear). HuggingFace's GPT-2 stores its
// Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) transposed, as
// [in, out]: checkpoint code reading or writing HF files must transpose those four;
// wte and wpe are [rows, C] in both.
struct ParamTensor {
  std::string name;                // e.g. "h.3.attn.c_attn.weight"
  std::size_t offset = 0;          // in floats from the start of the buffer
  std::vector<std::size_t> shape;  // 1-D or 2-D
  bool is_matrix = false;          // 2-D: the tensors that get weight decay
  // Tensor parallelism. Under tp ranks, shape is this rank's piece, and the split
  // says how the pieces tile the full tensor (the one the serial layout has): the
  // full tensor's dimension (split) is split_blocks equal blocks, each cut into tp
  // equal pieces, and rank r holds piece r of every block, block after block. So
  // attn.c_attn.weight [3C, C] (q, k, v: 3 blocks) gives rank r the rows of its heads
  // in each of q, k and v, as [3C/tp, C]. wte.weight's full tensor for this purpose
  // has padded_vocab_size(tp) rows; those from vocab_size on are padding, not
  // carried to or from the serial layout (see shard_gpt_buffer). The same values are
  // set for tp = 1, where the one piece is the whole tensor.
  TensorSplit split = TensorSplit::kReplicated;
  int split_blocks = 1;
  std::size_t size() const;
};

// The parameter tensors in buffer order: wte.weight [Vp, C], wpe.weight [T, C], then
// for each layer i h.{i}.ln_1.weight/bias [C], attn.c_attn.weight [3C, C],
// attn.c_attn.bias [3C], attn.c_proj.weight [C, C], attn.c_proj.bias [C],
// ln_2.weight/bias [C], mlp.c_fc.weight [4C, C], mlp.c_fc.bias [4C],
// mlp.c_proj.weight [C, 4C], mlp.c_proj.bias [C]; last ln_f.weight/bias [C]. The LM
// head is wte itself. Throws like GPTConfig::validate.
//
// With tensor_parallel_size tp > 1, the layout of one tensor-parallel rank (the same
// on every rank; see ParamTensor::split): wte.weight [Vp/tp, C] with
// Vp = padded_vocab_size(tp) (vocab-parallel embedding and LM head), c_attn.weight
// [3C/tp, C] and c_attn.bias [3C/tp] (column-parallel: this rank's heads of q, k, v),
// attn.c_proj.weight [C, C/tp] (row-parallel), mlp.c_fc.weight [4C/tp, C] and
// mlp.c_fc.bias [4C/tp] (column-parallel), mlp.c_proj.weight [C, 4C/tp]
// (row-parallel); wpe, the LayerNorms and the two c_proj biases are replicated.
// Throws dufu::Error when tp < 1 or n_head is not divisible by tp.
std::vector<ParamTensor> gpt_parameter_layout(const GPTConfig& config, int tensor_parallel_size = 1);

// Moving between the full (serial) layout, gpt_parameter_layout(config), and the
// piece of tensor-parallel rank `rank` of `tp`, gpt_parameter_layout(config, tp); no
// communication, so checkpoint tools can merge or reshard offline. Work for any
// buffer in those layouts: parameters, gradients, optimizer moments.
// shard_gpt_buffer writes all of `local` (wte's padding rows, beyond vocab_size, get
// 0); unshard_gpt_buffer writes the entries of `full` that rank's piece holds (the
// replicated tensors whole; wte's padding rows never), so calling it for every rank
// assembles the full buffer. Throw dufu::Error for buffers of the wrong size.
void shard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> full, std::span<float> local);
void unshard_gpt_buffer(const GPTConfig& config, int tp, int rank, std::span<const float> local,
                        std::span<float> full);

// The tensors a pipeline stage holds, out of `layout` (gpt_parameter_layout for some
// tp), in the same order and under the same names, with offsets into a buffer of the
// stage's own. For the whole model it is `layout`, unchanged. Throws dufu::Error for a
// stage whose layers are not in [0, n_layer).
std::vector<ParamTensor> gpt_stage_layout(const GPTConfig& config, const std::vector<ParamTensor>& layout,
                                          const PipelineStage& stage);
// Between the full serial layout and a stage's part of it (gpt_stage_layout of
// gpt_parameter_layout(config)); no communication. unstage_gpt_buffer writes the
// stage's tensors into `full` and leaves the rest; wte goes in from both the first and
// the last stage, so writing every stage but the last's copy assembles a model.
void stage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> full,
                      std::span<float> staged);
void unstage_gpt_buffer(const GPTConfig& config, const PipelineStage& stage, std::span<const float> staged,
                        std::span<float> full);

// Both moves at once, between the full serial layout and the piece that tensor-
// parallel rank `tp_rank` of `tp` holds on pipeline stage `stage`: the layout of
// GPT(config, <group of tp>, stage).parameter_tensors(), i.e. gpt_stage_layout(config,
// gpt_parameter_layout(config, tp), stage). No communication, so sharded checkpoints
// merge and reshard offline. shard_gpt_piece writes all of `piece` (wte's padding
// rows 0); unshard_gpt_piece writes the entries of `full` the piece holds, so calling
// it for every (tp rank, stage) assembles the full buffer. Throw dufu::Error for
// buffers of the wrong size.
void shard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                     std::span<const float> full, std::span<float> piece);
void unshard_gpt_piece(const GPTConfig& config, int tp, int tp_rank, const PipelineStage& stage,
                       std::span<const float> piece, std::span<float> full);

// Pointers to the tensors of one buffer laid out as gpt_parameter_layout says: the
// same struct serves the parameters, their gradients and optimizer moments. On a
// pipeline stage, h holds the stage's layers (h[0] is layer first_layer) and the
// tensors the stage does not hold are null.
struct GPTLayerTensors {
  float* ln_1_weight;
  float* ln_1_bias;
  float* attn_c_attn_weight;
  float* attn_c_attn_bias;
  float* attn_c_proj_weight;
  float* attn_c_proj_bias;
  float* ln_2_weight;
  float* ln_2_bias;
  float* mlp_c_fc_weight;
  float* mlp_c_fc_bias;
  float* mlp_c_proj_weight;
  float* mlp_c_proj_bias;
};
struct GPTTensors {
  float* wte;
  float* wpe;
  std::vector<GPTLayerTensors> h;
  float* ln_f_weight;
  float* ln_f_bias;
};

class GPT {
 public:
  // Throws dufu::Error for an invalid config. Parameters start at zero; call
  // init_gpt2 or fill params().
  //
  // tensor_group: the ranks this model is split over (tensor parallelism), each
  // constructing its GPT with the same config and calling forward, backward and the
  // collective methods below together, with the same batch. nullptr or a group of
  // one gives the serial model. The group must outlive the model. Throws
  // dufu::Error when n_head is not divisible by the group's size.
  //
  // stage: the part of the model this rank holds under pipeline parallelism (the
  // whole model by default); see PipelineStage and forward_stage. Throws dufu::Error
  // for layers outside [0, n_layer) or a stage outside [0, num_stages).
  explicit GPT(const GPTConfig& config, Communicator* tensor_group = nullptr, const PipelineStage& stage = {});
  // The views point into the buffers: a copy would share them, a move keeps them.
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;
  GPT(GPT&&) = default;
  GPT& operator=(GPT&&) = default;

  // GPT-2's initialisation: matrices (wte, wpe, the linear layers) ~ N(0, 0.02),
  // except the residual projections (attn.c_proj.weight, mlp.c_proj.weight) ~
  // N(0, 0.02 / sqrt(2 · n_layer)); biases 0, LayerNorm weight 1 and bias 0, wte's
  // padding rows 0. The draws come from
  // std::mt19937 (whose output the C++ standard fixes) through a Box-Muller transform
  // written out in gpt.cc, tensor after tensor in buffer order, so a seed gives the
  // same weights with any standard library (std::normal_distribution would not).
  // Tensor or pipeline parallel, each rank draws the full tensors the same way and
  // keeps its piece, so a seed gives the same model for every tp and pp (and the two
  // copies of wte on the first and last stage are equal).
  void init_gpt2(std::uint32_t seed);

  const GPTConfig& config() const { return config_; }
  // The layers and tensors this rank holds (the whole model unless pipelined).
  const PipelineStage& pipeline_stage() const { return stage_; }
  // This rank's tensors and their count (the whole model when serial).
  const std::vector<ParamTensor>& parameter_tensors() const { return layout_; }
  std::size_t num_parameters() const { return params_.size(); }

  // Tensor parallelism: the group's size (1 when serial) and this rank's place in it;
  // this rank's columns of the logits are the vocabulary ids
  // [vocab_begin(), vocab_begin() + local_vocab_size()), the last rank's ending in
  // padding.
  int tensor_parallel_size() const { return tp_; }
  int tensor_parallel_rank() const { return tp_rank_; }
  int vocab_begin() const { return tp_rank_ * local_vocab_size(); }
  int local_vocab_size() const { return config_.padded_vocab_size(tp_) / tp_; }
  // The full (serial) layout: gpt_parameter_layout(config()), and its float count.
  // On a pipeline stage, the stage's part of it (gpt_stage_layout), which the
  // collectives below assemble; unstage_gpt_buffer places it in the whole model.
  const std::vector<ParamTensor>& full_parameter_tensors() const { return full_layout_; }
  std::size_t num_full_parameters() const;
  // Collective over the tensor group: the full-layout buffer assembled from every
  // rank's `local` buffer (num_parameters() floats in this rank's layout, e.g.
  // params(), grads(), Adam moments), on every rank. Replicated tensors come from this
  // rank (they are identical on all ranks), wte's padding rows are 0.
  std::vector<float> gather_full(std::span<const float> local) const;
  // This rank's piece of a full-layout buffer, into `local`; no communication.
  void shard_full(std::span<const float> full, std::span<float> local) const;
  std::vector<float> gather_full_parameters() const { return gather_full(params_); }
  std::vector<float> gather_full_gradients() const { return gather_full(grads_); }
  void load_full_parameters(std::span<const float> full) { shard_full(full, params_); }
  // Collective over the tensor group: the sum of squares of the full-layout buffer
  // that `local` is this rank's piece of (e.g. grads(), for the gradient norm),
  // counting replicated tensors once. Deterministic; identical on every rank.
  // On a pipeline stage, this stage's tensors, except that the last stage leaves out
  // its copy of wte: the sum over the pipeline group counts every parameter once.
  double full_sum_of_squares(std::span<const float> local) const;
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }
  std::span<float> grads() { return grads_; }
  std::span<const float> grads() const { return grads_; }
  // Throws dufu::Error for a name that is not in parameter_tensors().
  const ParamTensor& tensor(std::string_view name) const;
  // Named views into another buffer of num_parameters() floats (e.g. Adam moments).
  GPTTensors tensors(std::span<float> buffer) const;

  // Runs the model on tokens [B, T] (values in [0, vocab_size), T <= seq_length).
  // Tensor parallel, every rank passes the same tokens and targets and gets the same
  // loss.
  // With targets [B, T] (values in [0, vocab_size) or -1 to ignore the position) it
  // returns the mean loss over the non-ignored targets (0 if all are ignored) and
  // prepares backward() to produce dloss_scale times the gradient of the SUM of the
  // per-position losses: 1 / (number of non-ignored targets) gives the gradient of
  // the returned mean; 1 / (that count over all micro-batches) makes the gradients
  // that backward() accumulates over the micro-batches equal those of one big batch.
  // Without targets (an empty span) it returns NaN and keeps the logits for
  // logits(). Throws dufu::Error for bad sizes or token values.
  float forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T,
                float dloss_scale);
  // The same with dloss_scale = 1 / (number of non-ignored targets).
  float forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T);

  // Logits [B·T, Vp] of the last forward, which must have had no targets (with
  // targets the classifier overwrites them with their gradient). Only the first
  // vocab_size columns of a row are real; the padding columns hold 0. Tensor
  // parallel, this rank's columns only: [B·T, local_vocab_size()], vocabulary ids
  // from vocab_begin() (the full logits are never gathered).
  std::span<const float> logits() const;

  // Adds the gradient of the last forward (which must have had targets) to grads();
  // once per forward.
  void backward();
  void zero_grad();

  // ---- pipeline stages ----
  // forward and backward above are for the whole model (they throw on a stage of
  // several); a stage runs micro-batches through these, each micro-batch in an
  // activation slot (0, 1, ...) that keeps its activations until its backward, so
  // several micro-batches can be in flight (the 1F1B schedule keeps up to
  // num_stages - stage). Slots get memory when first used; forward and backward above
  // use slot 0.
  //
  // The first stage takes `tokens` [B, T], the others `input` [B, T, C] (the previous
  // stage's stage_output); the last stage takes `targets` (or none, for logits) and
  // returns the loss as forward does, the others return NaN. Throws dufu::Error when
  // the arguments do not fit the stage (tokens on a later stage, targets on an earlier
  // one, wrong sizes) or for a negative slot.
  float forward_stage(int slot, std::span<const std::int32_t> tokens, std::span<const float> input,
                      std::span<const std::int32_t> targets, int B, int T, float dloss_scale);
  // The output [B, T, C] (residual stream after the stage's last layer) of the slot's
  // last forward on a stage other than the last; valid until the slot's next forward.
  std::span<const float> stage_output(int slot) const;
  // Adds the gradient of the slot's last forward to grads(), once per forward. The
  // last stage starts from its loss (d_output empty), the others from d_output
  // [B, T, C], the gradient of their output. Returns the gradient of the stage's input
  // [B, T, C] (empty on the first stage), valid until the next backward.
  std::span<const float> backward_stage(int slot, std::span<const float> d_output);
  // Slots that hold activation memory.
  int activation_slots() const;

 private:
  // What the forward keeps for backward, one set per layer. The residual stream of
  // layer l enters as residual_in (the embedding for l = 0, the previous layer's
  // residual_out otherwise), becomes residual_mid after the attention branch and
  // residual_out after the MLP branch; each sum is fused with the LayerNorm after it.
  // Shapes are this rank's: under tp ranks qkv holds [N, 3C/tp], att and atty cover
  // NH/tp heads, the MLP's hidden activations are [N, 4C/tp] and the logits
  // [N, Vp/tp]; the residual stream and LayerNorm outputs are whole ([N, C]) and
  // identical on every rank.
  struct LayerActivations {
    float* ln_1;  // [N, C]
    float* ln_1_mean;
    float* ln_1_rstd;     // [N] each
    float* qkv;           // [N, 3C]
    float* att;           // [B, NH, T, T]
    float* atty;          // [N, C] attention output, before c_proj
    float* residual_mid;  // [N, C]
    float* ln_2;          // [N, C]
    float* ln_2_mean;
    float* ln_2_rstd;
    float* fc_pre;        // [N, 4C] c_fc output plus bias, before GELU
    float* fc_gelu;       // [N, 4C]
    float* residual_out;  // [N, C]
  };
  struct Activations {
    float* encoded;  // [N, C]
    std::vector<LayerActivations> layers;
    float* ln_f;  // [N, C]
    float* ln_f_mean;
    float* ln_f_rstd;
    float* logits;  // [N, Vp]
    float* losses;  // [N]
    // Scratch reused by every layer: the c_fc output before bias and GELU, and the
    // output of a branch (c_proj of attention or MLP) before it joins the residual.
    float* fc_out;  // [N, 4C]
    float* branch;  // [N, C]
  };
  // Gradients of activations, only needed (and allocated) for backward.
  struct ActivationGrads {
    float* residual;  // [N, C] the residual stream's gradient, accumulated through
    float* ln;        // [N, C] gradient of a LayerNorm output
    float* atty;      // [N, C]
    float* qkv;       // [N, 3C]
    float* att;       // [B, NH, T, T] attention_backward's scratch
    float* fc_gelu;   // [N, 4C]
    float* fc_pre;    // [N, 4C]
  };

  // One micro-batch's activations and what its backward needs. Activations are sized
  // for the largest B and T the slot has seen (capacity_b, capacity_t); a smaller
  // batch uses the front of each tensor.
  struct ActivationSlot {
    int capacity_b = 0;
    int capacity_t = 0;
    std::vector<float> memory;
    Activations acts{};
    // The last forward: its batch (embedding_backward needs the tokens) and whether
    // the logits buffer holds logits or, after a forward with targets, their
    // gradient.
    std::vector<std::int32_t> tokens;
    int batch_b = 0;
    int batch_t = 0;
    bool has_logits = false;
    bool backward_pending = false;
  };

  // In-place sum over the tensor group (no-op when serial).
  void reduce_over_tensor_group(float* data, std::size_t count);
  ActivationSlot& activation_slot(int slot);
  void ensure_activations(ActivationSlot& slot, int B, int T);
  void ensure_activation_grads(int B, int T);
  void check_batch(std::span<const std::int32_t> tokens, std::span<const float> input,
                   std::span<const std::int32_t> targets, int B, int T) const;
  void require_whole_model(const char* operation) const;

  GPTConfig config_;
  PipelineStage stage_;  // num_layers resolved
  Communicator* tensor_group_ = nullptr;  // null when serial
  int tp_ = 1;
  int tp_rank_ = 0;
  std::vector<ParamTensor> layout_;
  std::vector<ParamTensor> full_layout_;
  std::vector<float> params_;
  std::vector<float> grads_;
  GPTTensors p_;  // views into params_
  GPTTensors g_;  // views into grads_

  std::vector<ActivationSlot> slots_;
  // Activation gradients are shared by the slots: one backward runs at a time.
  int grad_capacity_b_ = 0;
  int grad_capacity_t_ = 0;
  std::vector<float> activation_grad_memory_;
  ActivationGrads dacts_{};
  // The vocab-parallel classifier's row statistics: max [N], then sum of exp and
  // target logit [2N].
  std::vector<float> row_max_;
  std::vector<double> row_stats_;
};

}  // namespace dufu::trainer
