// `train export-hf CHECKPOINT DIR [--tokenizer M]`: a checkpoint as a directory
// that transformers' GPT2LMHeadModel (or LlamaForCausalLM) and AutoTokenizer.from_pretrained
// load as they are (trainer::export_hf), so a user does not write config.json by hand.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "dufu/dataprep/tokenizer.h"
#include "dufu/trainer/checkpoint/hf_export.h"
#include "tokenizer_flags.h"

namespace dufu::tools {
namespace {

struct ExportFlags {
  std::string checkpoint;
  std::string destination;
  TokenizerFlags tokenizer;
  bool no_tokenizer = false;
};

std::string id_text(std::int32_t id) { return id >= 0 ? std::to_string(id) : "none"; }

void run(const ExportFlags& flags) {
  const auto start = std::chrono::steady_clock::now();
  const trainer::HfExport exported =
      trainer::export_hf(flags.checkpoint, flags.destination, flags.tokenizer.spec, nullptr,
                         flags.no_tokenizer ? trainer::ExportTokenizer::kOmit : trainer::ExportTokenizer::kInclude);
  const trainer::GPTConfig& model = exported.model;
  std::fprintf(stderr, "checkpoint %s: step %lld, %d layers, %d heads, d_model %d, vocab %d, seq_length %d\n",
               exported.checkpoint.c_str(), static_cast<long long>(exported.step), model.n_layer, model.n_head,
               model.d_model, model.vocab_size, model.seq_length);
  std::string files;
  for (const std::string& name : exported.files) files += (files.empty() ? "" : ", ") + name;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("exported to %s in %.1f s: %s\n", exported.directory.c_str(), seconds, files.c_str());
  if (flags.no_tokenizer) {
    std::printf("no tokenizer (--no-tokenizer): config.json's token ids are null\n");
    std::printf("load with %s.from_pretrained(DIR) and the tokenizer the run's data was tokenized with\n",
                model.is_llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel");
    return;
  }
  std::printf("tokenizer %s: bos %s, eos %s, pad %s\n", exported.tokenizer_class.c_str(),
              id_text(exported.bos_token_id).c_str(), id_text(exported.eos_token_id).c_str(),
              id_text(exported.pad_token_id).c_str());
  std::printf("load with %s.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR%s)\n",
              model.is_llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel",
              exported.tokenizer_class == "LlamaTokenizer" ? ", use_fast=False" : "");
}

}  // namespace

void add_export_hf_command(CLI::App& app) {
  auto flags = std::make_shared<ExportFlags>();
  auto* command = app.add_subcommand(
      "export-hf",
      "Write a checkpoint as a HuggingFace directory (config.json, generation_config.json, model.safetensors and "
      "the tokenizer) that GPT2LMHeadModel.from_pretrained (model.arch gpt2) or LlamaForCausalLM.from_pretrained "
      "(llama) loads; sharded checkpoints are merged on the way");
  command->add_option("CHECKPOINT", flags->checkpoint, "Checkpoint directory, or a run directory (its newest)")
      ->required();
  command->add_option("DIR", flags->destination, "New directory for the export")->required();
  // A .tiktoken file has no form transformers reads: export_hf says so.
  add_tokenizer_flags(command, flags->tokenizer, TokenizerFlag::kFoundWhenLeftOut,
                      "the run's data was tokenized with (not .tiktoken: transformers has no reader for it)",
                      "the checkpoint's state.json");
  command->add_flag("--no-tokenizer", flags->no_tokenizer,
                    "Export the weights, config.json and generation_config.json without a tokenizer (token ids "
                    "null), for a checkpoint that records none");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
