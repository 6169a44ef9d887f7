// The GPT-2 model on a Device (device.h): every parameter in one contiguous buffer
// under HuggingFace's GPT2Model names (gpt_layout.h), GPT-2 initialisation, and a
// forward and backward written out layer by layer as calls into the device's kernel
// table, like llm.c's train_gpt2.c, so that each step can be read next to the PyTorch
// reference that checks it (tests/reference/gpt_torch_reference.py). Between kernels
// the model does no arithmetic of its own on the host: its parameters, gradients and
// activations live in device memory, and the host only checks arguments, once, before
// the first kernel of a call, and reads back the loss (at once, or when a step ends:
// forward_keeping_loss).
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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"  // PendingCollective, held by value in the model
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt_activations.h"
#include "dufu/trainer/model/gpt_layout.h"
#include "dufu/trainer/model/gpt_pieces.h"
#include "dufu/trainer/model/gpt_recipe.h"
#include "dufu/trainer/model/gpt_tensors.h"
#include "dufu/trainer/model/parameter_storage.h"
#include "dufu/trainer/model/recipe_rules.h"

namespace dufu::trainer {

// The documents packed into a batch's rows (document masking: Megatron's
// data.reset_position_ids and data.reset_attention_mask; dataprep/packed_documents.h
// finds them). Both empty: every row one sequence, the model as it always was, bit
// for bit.
struct BatchDocuments {
  // [B, T]: each token's position in its document, which GPT-2's learned positions
  // and Llama's rotary read instead of t. Each in [0, seq_length).
  std::span<const std::int32_t> positions = {};
  // [B, T]: where in its row each token's document starts; attention then sees the
  // token's own document only. Non-decreasing along a row, each at most its t.
  std::span<const std::int32_t> document_starts = {};
};

// The tensor views (BasicGPTTensors) and the recipe (Precision, Recompute) are in
// gpt_tensors.h and gpt_recipe.h; the activations the model keeps, in gpt_activations.h.

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
  //
  // device: where the parameters, gradients and activations live and the kernels run
  // (null: the CPU device); it must outlive the model. The tensor group's
  // collectives must move that device's memory (Communicator::memory_space()), or
  // this throws dufu::Error naming both.
  //
  // recipe: how the model computes (GPTRecipe: precision, attention's tile products,
  // recomputation, optimizer offload), fixed here for the model's life; the getters
  // below read it back. A different recipe is a different model: construct another
  // and move the weights with download_parameters() and upload_parameters(). Throws
  // dufu::Error with the rule book's words for a combination it refuses
  // (recipe_rules.h), and for bf16 on a device whose kernel table lacks the bf16 ops.
  explicit GPT(const GPTConfig& config, Communicator* tensor_group = nullptr, const PipelineStage& stage = {},
               Device* device = nullptr, const GPTRecipe& recipe = {});
  // The views point into the buffers: a copy would share them, a move keeps them.
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;
  GPT(GPT&&) = default;
  GPT& operator=(GPT&&) = default;

  // GPT-2's initialisation (Llama's the same way: RMSNorm weights 1, its residual
  // projections o_proj and down_proj scaled like c_proj, lm_head like wte): matrices (wte, wpe, the linear layers) ~ N(0, 0.02),
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
  Device& device() const { return *device_; }
  // The layers and tensors this rank holds (the whole model unless pipelined).
  const PipelineStage& pipeline_stage() const { return stage_; }
  // This rank's tensors and their count (the whole model when serial).
  const std::vector<ParamTensor>& parameter_tensors() const { return layout_; }
  std::size_t num_parameters() const { return num_parameters_; }

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
  // rank's `local` buffer (host memory) (num_parameters() floats in this rank's layout, e.g.
  // params(), grads(), Adam moments), on every rank. Replicated tensors come from this
  // rank (they are identical on all ranks), wte's padding rows are 0.
  std::vector<float> gather_full(std::span<const float> local) const;
  // This rank's piece of a full-layout buffer, into `local`; no communication.
  void shard_full(std::span<const float> full, std::span<float> local) const;
  // The same for the parameters and gradients, read from the device (the parameters
  // through download_parameters(): collective where the storage spreads them over
  // ranks); and this rank's piece of full-layout parameters, written to it.
  std::vector<float> gather_full_parameters() const { return gather_full(download_parameters()); }
  std::vector<float> gather_full_gradients() const { return gather_full(host_gradients()); }
  void load_full_parameters(std::span<const float> full);
  // Collective over the tensor group: the sum of squares of the full-layout buffer
  // that `local` is this rank's piece of (e.g. grads(), for the gradient norm),
  // counting replicated tensors once. Deterministic; identical on every rank.
  // On a pipeline stage, this stage's tensors, except that the last stage leaves out
  // its copy of wte: the sum over the pipeline group counts every parameter once.
  double full_sum_of_squares(std::span<const float> local) const;
  // The parameters and their gradients, in device memory (device.h says who may
  // read it directly). Under bf16 these are the fp32 masters; taking them writable
  // marks the bf16 working copy stale, and the next forward remakes it from them.
  // Both throw while the storage does not keep the parameters whole
  // (parameter_storage.h).
  std::span<float> params();
  std::span<const float> params() const;
  // The gradient is allocated by its first use (zero_grad, backward, grads()), so a
  // model that only runs forward never holds one. grads() throws while the storage
  // does not keep the layers' gradients whole, the const one also before the gradient
  // exists.
  std::span<float> grads();
  std::span<const float> grads() const;
  // Throws dufu::Error for a name that is not in parameter_tensors().
  const ParamTensor& tensor(std::string_view name) const;
  // Named views into another buffer of num_parameters() floats (e.g. Adam moments).
  GPTTensors tensors(std::span<float> buffer) const;

  // ---- the recipe, as the constructor fixed it ----
  // The arithmetic of forward and backward (fp32 by default; fp32 is the model as it
  // was, bit for bit). bf16 keeps a working copy of the weights in bf16, every
  // parameter rounded, made from the masters by the first forward after they change
  // (once per step, after the optimizer), and an fp32 copy of its biases and LayerNorm
  // parameters for the kernels that take floats; it rounds the activations at the
  // recipe's points, keeps the activations a backward reads in bf16 memory, and runs
  // the embedding and the matmuls on the bf16 copies (the *_bf16 kernels).
  Precision precision() const { return precision_; }
  // Attention's tile products (train.attention_products): kFp32 (the default), or kBf16,
  // bf16 operands with fp32 sums as tensor cores run them (kernel_table.h: the
  // attention entries given qkv's bf16 copy); kBf16 needs precision() == kBf16, where
  // qkv's bf16 copy exists.
  Precision attention_products() const { return attention_products_; }
  // optim.offload = cpu (ZeRO-Offload's split, Ren et al. 2021): the fp32 master
  // weights live in host memory (the CPU device's), where the optimizer keeps its
  // moments and runs AdamW (optimizer.h takes parameter_device()); the model's device
  // keeps the bf16 working copy, remade on the host and uploaded by the first forward
  // after the masters change, the gradients and the activations. The arithmetic is
  // unchanged: the same rounding and the same AdamW formula, on the host. Needs bf16
  // (under fp32 the device would need fp32 weights, all that offload moves) and a
  // device whose memory is not the host's; the constructor refuses it otherwise.
  bool optimizer_offloaded() const { return &storage_->parameter_device() != device_; }
  // Where params() lives: the model's device, or the CPU device under offload.
  Device& parameter_device() const { return storage_->parameter_device(); }
  // What the forward keeps for the backward (see Recompute; kNone by default).
  Recompute recompute() const { return recompute_; }

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
  // `documents` (empty by default) packs several documents into a row.
  float forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T,
                float dloss_scale, const BatchDocuments& documents = {});
  // The same with dloss_scale = 1 / (number of non-ignored targets).
  float forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B, int T);
  // forward() that leaves its loss on the device, after those of earlier such calls,
  // instead of waiting for the device to read it: a step's micro-batches then queue
  // their kernels without the host waiting once, and read_kept_losses() brings all
  // their losses back in one copy when the step ends. Kept only with targets.
  void forward_keeping_loss(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int B,
                            int T, float dloss_scale, const BatchDocuments& documents = {});
  // The losses kept since the last call, in the order of their forwards (the same
  // values forward() would have returned); one download, and none kept after it.
  std::vector<float> read_kept_losses();

  // Logits [B·T, Vp] of the last forward, which must have had no targets (with
  // targets the classifier overwrites them with their gradient). Only the first
  // vocab_size columns of a row are real; the padding columns hold 0. Tensor
  // parallel, this rank's columns only: [B·T, local_vocab_size()], vocabulary ids
  // from vocab_begin() (the full logits are never gathered). Device memory, like
  // params(): host code downloads what it reads (generate.cc takes the last row).
  std::span<const float> logits() const;

  // Adds the gradient of the last forward (which must have had targets) to grads();
  // once per forward.
  void backward();
  void zero_grad();

  // ---- where the parameters and gradients live (parameter_storage.h) ----
  // Whole on the model's device by default. A replacement takes over the values the
  // current storage releases (collective where that one spreads them over ranks), and
  // the model's views are remade over its memory; the gradient starts afresh, zeroed
  // at its first use. The data-parallel optimizer installs its ParameterStore so.
  void replace_parameter_storage(std::unique_ptr<ParameterStorage> storage);
  // What a storage of this model's layout is made from.
  StorageShape storage_shape() const;
  bool parameters_whole() const { return storage_->parameters_whole(); }
  // {offset, size} of local layer l's tensors in the flat layout (of params()).
  std::pair<std::size_t, std::size_t> layer_range(int local_layer) const;
  // One tensor's gradient: any tensor's while the gradient is whole, an edge tensor's
  // (wte, wpe, ln_f, lm_head) always.
  std::span<float> tensor_gradient(const ParamTensor& tensor);
  // The rule book's view of this model with `precision` and `offload` (recipe_rules.h).
  RecipeChoices recipe_choices(Precision precision, bool offload) const;
  // This rank's whole piece of the parameters (num_parameters() floats), in host
  // memory, and from it: collective where the storage spreads them over ranks.
  std::vector<float> download_parameters() const { return storage_->download_parameters(); }
  void upload_parameters(std::span<const float> host);

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
  // one, wrong sizes, documents that are not a packing) or for a negative slot. Every
  // stage takes the batch's documents (its attention, and Llama's rotary, read them).
  float forward_stage(int slot, std::span<const std::int32_t> tokens, std::span<const float> input,
                      std::span<const std::int32_t> targets, int B, int T, float dloss_scale,
                      const BatchDocuments& documents = {});
  // forward_stage whose loss (on the last stage, with targets) is kept on the device
  // for read_kept_losses(), as forward_keeping_loss keeps it.
  void forward_stage_keeping_loss(int slot, std::span<const std::int32_t> tokens, std::span<const float> input,
                                  std::span<const std::int32_t> targets, int B, int T, float dloss_scale,
                                  const BatchDocuments& documents = {});
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
  // The activations (gpt_activations.h).
  using LayerActivations = gpt_activations::LayerActivations;
  using StoredLayerActivations = gpt_activations::StoredLayerActivations;
  using WorkingLayer = gpt_activations::WorkingLayer;
  using Activations = gpt_activations::Activations;
  using ActivationGrads = gpt_activations::ActivationGrads;
  using ActivationSlot = gpt_activations::ActivationSlot;
  using LayerSizes = gpt_activations::LayerSizes;

  // The forward of forward_stage and forward_stage_keeping_loss: the loss (last stage,
  // with targets) goes after the kept ones with keep_loss, else into the slot's own;
  // returns where it is on the device, or null when there is none.
  const float* forward_on_device(int slot, std::span<const std::int32_t> tokens, std::span<const float> input,
                                 std::span<const std::int32_t> targets, int B, int T, float dloss_scale,
                                 const BatchDocuments& documents, bool keep_loss);
  // The batch's documents into the slot's device buffers (none: the kernels read null).
  void upload_documents(ActivationSlot& slot, const BatchDocuments& documents);
  // In-place sum over the tensor group (no-op when serial).
  void reduce_over_tensor_group(float* data, std::size_t count);
  ActivationSlot& activation_slot(int slot);
  void ensure_activations(ActivationSlot& slot, int B, int T);
  // The working layer (the fp32 set a layer computes in under bf16 or recomputation)
  // and, under bf16 with recomputation, the bf16 copies of one layer.
  void ensure_working_layer(int B, int T);
  // This rank's widths of a layer's tensors (all of them when serial): the fused q, k, v
  // projection's output, the attention output, the MLP's first projection's output and
  // its hidden values; its query heads, K/V heads and the head size. GPT-2: 3Cl, Cl,
  // 4Cl, 4Cl; Llama: (NH + 2 NKV) hs / tp, Cl, 2F/tp, F/tp.
  struct LocalWidths {
    int qkv, attn, mlp_pre, mlp_hidden, heads, kv_heads, head_size;
  };
  LocalWidths local_widths() const;
  // Floats of a layer's activations for `rows` rows (LayerSizes).
  LayerSizes layer_sizes(std::size_t rows) const;
  // The fp32 tensors layer l of a slot computes with: its own under fp32; under bf16
  // the working set for those kept in bf16.
  LayerActivations layer_activations(const ActivationSlot& slot, int l) const;
  // The bf16 copies layer l stores to (all null under fp32).
  StoredLayerActivations stored_activations(const ActivationSlot& slot, int l) const;
  // Under bf16, before layer l's backward: the stored activations its fp32 kernels
  // read (qkv, atty, residual_mid, fc_pre) and its input (layer l - 1's residual_out)
  // back into the working set; its matmuls read their bf16 copies directly.
  void load_layer_activations(const ActivationSlot& slot, int l);
  // Layer l's forward from its ln_1 output to the MLP's GELU: every activation its
  // backward reads (the forward, and the backward's recomputation, run this).
  void forward_layer_body(const ActivationSlot& slot, int l);
  // Its last part: the MLP's first matmul with its bias and GELU, from ln_2.
  void forward_mlp_hidden(const ActivationSlot& slot, int l);
  // Under recomputation, before layer l's backward: the activations it dropped, again
  // (under kFull all of them, from its input: the previous layer's output, or the
  // embedding).
  void recompute_layer(const ActivationSlot& slot, int l);
  void ensure_activation_grads(int B, int T);
  void check_batch(std::span<const std::int32_t> tokens, std::span<const float> input,
                   std::span<const std::int32_t> targets, const BatchDocuments& documents, int B, int T) const;
  void check_documents(const BatchDocuments& documents, int B, int T) const;
  void require_whole_model(const char* operation) const;
  void require_whole_gradients(const char* operation) const;  // and allocated
  void require_whole_parameters(const char* operation) const;
  // Before a forward or backward reads local layer l: its values in place, and under
  // bf16 their working copy remade where the storage wrote new values.
  void acquire_layer_parameters(int local_layer);
  // The gradient in host memory (whole and allocated, or this throws).
  std::vector<float> host_gradients() const;
  // p_ (and under bf16 p16_ and the vector runs) for the storage's memory as it is
  // laid out now.
  void make_parameter_views();
  // The constructor's two recipe steps that do more than set a member, run once each,
  // in this order, after the rule book accepted the whole recipe and before any
  // forward: the precision's parameter views (bf16: the working copy's memory; throws
  // for a device without the bf16 kernels), then the masters moved to the CPU device
  // under offload (the working copy is remade from them on the host).
  void apply_precision(Precision precision);
  void offload_optimizer();
  // Which part of the layout a flat offset is in: -1 the edges before the layers, the
  // local layer, or num_layers the edges after (vector runs do not cross parts).
  int layout_part(std::size_t offset) const;
  // Under bf16: the working copy of `count` parameters at storage position `position`,
  // and of the vector runs in layout part `part` (all parts when part is INT_MIN).
  void refresh_working_range(std::size_t position, std::size_t count, int part);
  // Allocates the gradient (as the storage lays it out), zeroed, if it is not yet,
  // and makes g_ over it.
  void ensure_gradients();
  // The stage's layers in the flat layout: {first offset, floats per layer}.
  std::pair<std::size_t, std::size_t> layers_extent() const;
  // storage_shape() with the parameters on `parameter_device` (the constructor's, before
  // there is a storage).
  StorageShape storage_shape_with(Device& parameter_device) const;
  // g_ for the storage's gradient memory as it is laid out now.
  GPTTensors gradient_views();
  // Under bf16: the working copy of the weights, remade from the masters if stale.
  void refresh_working_weights();
  // residual_out = residual + branch, norm_out = LayerNorm(residual_out): fused under
  // fp32; under bf16 the sum is rounded first and the LayerNorm reads the rounded sum,
  // and both are kept in bf16 where the stored pointers are not null.
  void residual_layernorm(float* residual_out, float* norm_out, float* mean, float* rstd, const float* residual,
                          const float* branch, const float* weight, const float* bias, int N, int C,
                          std::uint16_t* stored_residual_out, std::uint16_t* stored_norm_out);

  // A matmul operand in the form each precision reads it: fp32 values (under fp32) or
  // bf16 bits (under bf16: an activation's stored copy, the weights' working copy).
  // A tensor the kernels read, in both forms the model may keep it: fp32 values, and
  // under bf16 its bf16 storage.
  struct Operand {
    const float* values;
    const std::uint16_t* bits;
  };
  // The form the precision reads (the bits under bf16), typed for the kernels.
  TensorIn typed(Operand operand) const;
  // qkv as the attention reads it: its bf16 copy under bf16 attention products.
  TensorIn attention_input(Operand qkv) const;
  // A tensor written as the precision keeps it: under bf16 rounded as it is written,
  // its bits stored to `stored` unless null; under fp32 as computed.
  TensorOut kept(float* values, std::uint16_t* stored) const;
  // The linear layers and the embedding through one kernel entry each, their operands
  // typed by the precision (gpt_linear.cc); arguments as the kernels'.
  void linear_forward(TensorOut out, Operand x, Operand weight, const float* bias, int N, int C, int OC);
  void linear_bias_gelu_forward(TensorOut out, TensorOut pre, Operand x, Operand weight, const float* bias, int N,
                                int C, int OC);
  void linear_backward(TensorOut dx, float* dweight, float* dbias, KeptIn dout, Operand x, Operand weight,
                       int N, int C, int OC);
  void linear_gelu_backward(TensorOut dpre, float* dweight, float* dbias, KeptIn dout, Operand x,
                            Operand weight, const float* pre, int N, int C, int OC);
  // A [rows, C] tensor that tensor parallelism all-reduces after it is computed (the
  // row-parallel outputs, the column-parallel layers' input gradients): kept by the
  // kernel that computes it with one rank, and with more written fp32 and kept after
  // the sum (reduce_and_keep), so every rank rounds the same sum.
  TensorOut kept_before_reduction(float* values) const;
  void reduce_and_keep(float* values, std::size_t count);
  // positions null: t.
  void embed(TensorOut out, const std::int32_t* tokens, const std::int32_t* positions, bool adds_positions, int B,
             int T, int C);
  // The embedding's backward into g_.wte (and g_.wpe).
  void embed_backward(const float* dout, const std::int32_t* tokens, const std::int32_t* positions, int B, int T,
                      int C);
  // The architecture's normalisation (gpt2: LayerNorm; llama: RMSNorm with the
  // config's eps, no bias and no mean: bias, mean and dbias are null), arguments as
  // the layernorm kernels'.
  void norm_forward(TensorOut out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                    int N, int C);
  void norm_backward(TensorOut dx, float* dweight, float* dbias, const float* dout, const float* x,
                     const float* weight, const float* mean, const float* rstd, int N, int C);
  // The LM head's weights: wte when tied, lm_head otherwise.
  Operand head_weights() const;
  // Views of the tensors, tensor_of(const ParamTensor&) giving each one's pointer;
  // called in layout order.
  template <typename T, typename TensorOf>
  BasicGPTTensors<T> tensor_views(TensorOf&& tensor_of) const;

  GPTConfig config_;
  Device* device_;
  const KernelTable* kernels_;  // device_->kernels()
  PipelineStage stage_;  // num_layers resolved
  Communicator* tensor_group_ = nullptr;  // null when serial
  int tp_ = 1;
  int tp_rank_ = 0;
  std::vector<ParamTensor> layout_;
  std::vector<ParamTensor> full_layout_;
  std::size_t num_parameters_;
  std::unique_ptr<ParameterStorage> storage_;  // the parameters and the gradient
  // The weights forward and backward read: the storage's memory under fp32; under bf16 the
  // working copy, p16_ for every tensor and p_ for the biases and LayerNorm parameters
  // (null for the matrices, which only the *_bf16 kernels read).
  GPTTensors p_;
  BasicGPTTensors<std::uint16_t> p16_{};
  Precision precision_ = Precision::kFp32;
  Precision attention_products_ = Precision::kFp32;
  Recompute recompute_ = Recompute::kNone;
  DeviceBuffer<std::uint16_t> working_bits_;  // bf16: every parameter rounded to bf16
  std::vector<std::uint16_t> host_working_bits_;  // under offload: working_bits_ made on the host
  DeviceBuffer<float> working_vectors_;       // bf16: the biases and LayerNorm parameters, as floats
  // bf16: where each run of biases and LayerNorm parameters sits in the layout and in
  // working_vectors_.
  struct VectorRun {
    int part;  // layout_part of every offset in the run
    std::size_t offset;
    std::size_t vector_offset;
    std::size_t count;
  };
  std::vector<VectorRun> vector_runs_;
  bool working_weights_stale_ = true;
  std::uint64_t working_weights_version_ = 0;  // the storage's parameter_version() they were made at
  GPTTensors g_;  // views into the storage's gradient memory

  std::vector<ActivationSlot> slots_;
  // Activation gradients are shared by the slots: one backward runs at a time.
  int grad_capacity_b_ = 0;
  int grad_capacity_t_ = 0;
  DeviceBuffer<float> activation_grad_memory_;
  DeviceBuffer<std::uint16_t> activation_grad_bits_memory_;  // under bf16
  bool activation_grads_bf16_ = false;                       // how they are laid out
  // Under bf16: the working set of the layer being computed, shared by the slots.
  int working_capacity_b_ = 0;
  int working_capacity_t_ = 0;
  DeviceBuffer<float> working_memory_;
  WorkingLayer working_{};
  bool working_whole_layer_ = false;                // bf16's layout of working_memory_, else
  Recompute working_recompute_ = Recompute::kNone;  // fp32's: what this recomputation drops
  // Under bf16 with recomputation: the bf16 copies of the layer being recomputed,
  // shared by the layers and slots (residual_out unused: each layer keeps its own).
  int working_stored_capacity_b_ = 0;
  int working_stored_capacity_t_ = 0;
  Recompute working_stored_recompute_ = Recompute::kNone;  // which tensors working_stored_memory_ holds
  DeviceBuffer<std::uint16_t> working_stored_memory_;
  StoredLayerActivations working_stored_{};
  ActivationGrads dacts_{};
  // The vocab-parallel classifier's row statistics: max [N], then sum of exp and
  // target logit [2N].
  DeviceBuffer<float> row_max_;
  DeviceBuffer<double> row_stats_;
  // forward_keeping_loss's losses: kept_loss_count_ of them, not yet read back.
  DeviceBuffer<float> kept_losses_;
  std::size_t kept_loss_count_ = 0;
};

}  // namespace dufu::trainer
