// The GPT model's shape and where its parameters live: the configuration, the
// parameter tensors of the one contiguous buffer (under HuggingFace's GPT2Model
// names), how tensor parallelism cuts each tensor, and how pipeline parallelism
// splits the layers into stages. Pure arithmetic on shapes: no memory, no devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dufu/trainer/model/training_knobs.h"

namespace dufu::trainer {

// model.arch. kGpt2: LayerNorm with bias, learned positions (wpe), a 4·d_model GELU
// MLP, biases on every linear layer, the LM head tied to wte. kLlama (Llama 2/3,
// Mistral, Qwen2 without q/k/v biases, ...): RMSNorm, rotary positions, a SwiGLU MLP,
// grouped-query attention, no biases, an untied head unless tie_embeddings.
enum class Architecture { kGpt2, kLlama };
// "gpt2" or "llama"; and back, throwing dufu::Error naming `knob` for anything else.
const char* architecture_name(Architecture arch);
Architecture parse_architecture(std::string_view text, std::string_view knob);

// The defaults are the knob table's (training_knobs.h): a small model for a first
// run; gpt2_small() below is GPT-2 124M.
struct GPTConfig {
  Architecture arch = Architecture::kGpt2;
  int n_layer = training_knob_int<int>("model.n_layer");
  int n_head = training_knob_int<int>("model.n_head");
  int d_model = training_knob_int<int>("model.d_model");
  int vocab_size = training_knob_int<int>("model.vocab_size");
  // wte gets padded_vocab_size() rows, a multiple of this, so the classifier's
  // matmul works on round sizes (50257 -> 50304 with 128, as in llm.c).
  int vocab_multiple = training_knob_int<int>("model.vocab_multiple");
  int seq_length = training_knob_int<int>("model.seq_length");  // maximum number of positions (rows of wpe)
  // The Llama family's knobs. GPT-2 fixes them (n_kv_head = n_head, a 4·d_model MLP,
  // LayerNorm's eps 1e-5, a tied head) and validate() refuses other values for it.
  int n_kv_head = training_knob_int<int>("model.n_kv_head");    // key/value heads (1 = MQA); 0 = n_head
  int ffn_hidden = training_knob_int<int>("model.ffn_hidden");  // the MLP's hidden width; 0 = mlp_hidden's rule
  float rope_theta = training_knob_double<float>("model.rope_theta");  // base of the rotary embedding's angles
  float norm_eps = training_knob_double<float>("model.norm_eps");  // RMSNorm's (Llama 1: 1e-6, 2 and 3: 1e-5)
  bool tie_embeddings = true;  // the LM head is wte (model.tie_embeddings = auto for gpt2); false: its own lm_head

  bool is_llama() const { return arch == Architecture::kLlama; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return d_model / n_head; }
  // The MLP's hidden width: ffn_hidden if set, else GPT-2's 4·d_model, or for llama
  // Llama's rule, 2/3 of 4·d_model rounded up to a multiple of 256. 64-bit: a plan may
  // size a model whose widths overflow int (validate() refuses building one).
  std::int64_t mlp_hidden() const;

  // vocab_size rounded up to a multiple of vocab_multiple x tensor_parallel_size (as
  // Megatron-LM does), so the rows of wte split evenly over the tensor-parallel ranks
  // and each rank's slice is still a multiple of vocab_multiple: 50257 -> 50304 for
  // tp 1, 50688 for tp 4 (a multiple of 512). Rows from vocab_size on are padding:
  // zero, and excluded from the softmax, so the loss does not depend on tp. Throws
  // dufu::Error if the padded size overflows int or tensor_parallel_size < 1.
  int padded_vocab_size(int tensor_parallel_size = 1) const;
  // Throws dufu::Error naming the field for a size that is not positive, a d_model
  // that n_head does not divide, an n_head that n_kv_head does not divide, an odd head
  // size under rotary positions, or a Llama knob set to another value for gpt2.
  void validate() const;
};

// GPT-2 small (124M parameters): 12 layers of 768 with 12 heads, GPT-2's vocabulary
// of 50257 and 1024 positions.
GPTConfig gpt2_small();

// Which layers one pipeline stage holds. The default is the whole model (one stage).
// Stage `stage` of `num_stages` holds layers [first_layer, first_layer + num_layers);
// the first stage also holds wte and wpe, the last ln_f and (for the tied LM head) a
// copy of wte, or an untied head's lm_head. A num_layers below 0 means "to the last
// layer". resolve_pipeline_stage sets tied_head from the config.
struct PipelineStage {
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;
  int num_layers = -1;
  bool tied_head = true;
  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage + 1 == num_stages; }
  // The last stage of several keeps a copy of the first stage's wte when the head is tied.
  bool holds_wte() const { return is_first() || (tied_head && is_last()); }
  bool holds_wte_copy() const { return tied_head && is_last() && !is_first(); }
  // The first and last of several stages sum their wte gradients (the tied head's).
  bool shares_wte_gradient() const { return tied_head && num_stages > 1 && (is_first() || is_last()); }
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
//
// model.arch = llama (names after HF's LlamaModel, mapped in checkpoint/hf_weights):
// wte.weight [Vp, C] (embed_tokens), then for each layer h.{i}.ln_1.weight [C]
// (input_layernorm), attn.q_proj.weight [NH hs, C], attn.k_proj.weight and
// attn.v_proj.weight [NKV hs, C], attn.o_proj.weight [C, NH hs], ln_2.weight [C]
// (post_attention_layernorm), mlp.gate_proj.weight and mlp.up_proj.weight [F, C],
// mlp.down_proj.weight [C, F]; ln_f.weight [C] (norm) and, untied, lm_head.weight
// [Vp, C]. No biases, no wpe. Under tp, q/k/v, gate and up are cut by rows (whole
// heads and K/V heads: tp must divide n_head and n_kv_head, refused in words
// otherwise), o_proj and down_proj by columns, lm_head by rows like wte. Consecutive in
// the buffer, q, k and v of a rank form one [(NH + 2 NKV) hs / tp, C] matrix (one
// matmul, the rotary and attention kernels' qkv layout), gate and up one [2F/tp, C]
// (the SwiGLU kernel's gate_up layout).
std::vector<ParamTensor> gpt_parameter_layout(const GPTConfig& config, int tensor_parallel_size = 1);

// The tensors a pipeline stage holds, out of `layout` (gpt_parameter_layout for some
// tp), in the same order and under the same names, with offsets into a buffer of the
// stage's own. For the whole model it is `layout`, unchanged. Throws dufu::Error for a
// stage whose layers are not in [0, n_layer).
std::vector<ParamTensor> gpt_stage_layout(const GPTConfig& config, const std::vector<ParamTensor>& layout,
                                          const PipelineStage& stage);

// `stage` with num_layers resolved (a negative one means "to the last layer"), after
// checking it is a stage of a pipeline over config's layers. Throws dufu::Error for a
// stage outside [0, num_stages), layers outside [0, n_layer), a first stage that does
// not start at layer 0 or a last stage that does not end at the last layer.
PipelineStage resolve_pipeline_stage(const GPTConfig& config, PipelineStage stage);

// The floats a buffer in `layout` holds (0 for an empty layout).
std::size_t gpt_layout_size(const std::vector<ParamTensor>& layout);

}  // namespace dufu::trainer
