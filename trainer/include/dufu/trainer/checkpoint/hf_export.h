// A checkpoint as a HuggingFace model directory, what `train export-hf` writes:
// transformers' GPT2LMHeadModel.from_pretrained(DIR) (model.arch = gpt2) or
// LlamaForCausalLM.from_pretrained(DIR) (model.arch = llama) loads it with every weight
// used and nothing missing, and its tokenizer loads with AutoTokenizer.from_pretrained(DIR)
// (use_fast=False for a sentencepiece model) and encodes as dufu's does.
//
//   config.json             GPT2Config: n_layer, n_head, n_embd (d_model), vocab_size
//                           (the tokenizer's, without dufu's padding), n_positions
//                           (seq_length), activation "gelu_new" (GELU's tanh form, as
//                           dufu computes it), layer_norm_epsilon 1e-5, tied LM head,
//                           dropout 0 (dufu trains without), the tokenizer's bos, eos
//                           and pad ids (pad = eos when the tokenizer has no pad piece).
//                           llama: LlamaConfig: hidden_size, intermediate_size
//                           (ffn_hidden), num_hidden_layers, num_attention_heads,
//                           num_key_value_heads, head_dim, max_position_embeddings,
//                           hidden_act "silu", rms_norm_eps, rope_theta, no rope_scaling,
//                           no biases, tie_word_embeddings as trained, bos and eos ids,
//                           pad_token_id null (LlamaModel would freeze that row's
//                           embedding in a fine-tune).
//   generation_config.json  the same bos, eos and pad ids, so generate() stops at the
//                           end of a document.
//   model.safetensors       the weights as the serial checkpoint holds them (GPT2Model
//                           names, Conv1D weights [in, out]; llama: LlamaForCausalLM's
//                           names, embed_tokens and lm_head without padding rows); a sharded checkpoint is
//                           assembled first, as merge_checkpoint does. The checkpoint
//                           itself is only read.
//   the tokenizer           a sentencepiece .model: tokenizer.model with a
//                           tokenizer_config.json for transformers' LlamaTokenizer (no
//                           BOS or EOS added, legacy spacing, special-token text split
//                           as ordinary text), which encodes like sentencepiece's
//                           EncodeAsIds; a byte-level tokenizer.json: tokenizer.json
//                           (PreTrainedTokenizerFast); a GPT-2 vocab.json + merges.txt:
//                           those two files (GPT2Tokenizer). A .tiktoken rank file has
//                           no file transformers reads and is refused with a hint.
//
// The directory is written as <destination>.partial-<pid>/ and renamed into place when
// every file is synced, so a failure leaves nothing under the destination's name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/tokenizer.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/gpt_layout.h"

namespace dufu::trainer {

// What export_hf wrote.
struct HfExport {
  std::string directory;
  std::string checkpoint;  // the checkpoint directory the weights came from
  std::int64_t step = 0;
  GPTConfig model;
  std::vector<std::string> files;  // names inside `directory`, sorted
  std::string tokenizer_class;     // transformers' class named in tokenizer_config.json
  std::int32_t bos_token_id = -1;  // -1: the tokenizer has none
  std::int32_t eos_token_id = -1;
  std::int32_t pad_token_id = -1;
};

// Writes the HuggingFace directory of `checkpoint` (a checkpoint directory, or a run
// directory whose newest usable checkpoint is taken) into the new directory
// `destination`, with the tokenizer `tokenizer` (its model empty: the one the
// checkpoint records, run_tokenizer.h; a given one must have the recorded contents,
// dataprep::choose_tokenizer). Throws dufu::Error when the
// checkpoint does not verify, the destination exists, the tokenizer cannot be loaded,
// is a .tiktoken file or has more pieces than the model's vocab_size (a larger
// vocabulary is padding: config.json's vocab_size is the model's), or a write fails; no
// destination is left behind then. The weights are loaded onto `device` (null: the
// CPU device) and staged back through host memory for the file.
// kOmit (`export-hf --no-tokenizer`): the weights, config.json and
// generation_config.json alone (token ids null), for a checkpoint that records no
// tokenizer; `tokenizer` must then be empty.
enum class ExportTokenizer { kInclude, kOmit };
HfExport export_hf(const std::string& checkpoint, const std::string& destination,
                   const dataprep::TokenizerSpec& tokenizer, Device* device = nullptr,
                   ExportTokenizer with_tokenizer = ExportTokenizer::kInclude);

}  // namespace dufu::trainer
