// `train import-hf HF_DIR CHECKPOINT [--tensor-parallel-size N] [--pipeline-parallel-size M]`:
// a HuggingFace model directory as a dufu checkpoint in the layout the fine-tuning run
// will use (trainer::import_hf), for `train CONFIG model.init_from=CHECKPOINT`.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dufu/trainer/checkpoint/hf_import.h"

namespace dufu::tools {
namespace {

struct ImportFlags {
  std::string source;
  std::string destination;
  trainer::HfImportOptions options;
  bool no_tokenizer = false;
};

void run(ImportFlags flags) {
  const auto start = std::chrono::steady_clock::now();
  flags.options.with_tokenizer = !flags.no_tokenizer;
  const trainer::HfImport imported = trainer::import_hf(flags.source, flags.destination, flags.options);
  const trainer::GPTConfig& model = imported.model;
  std::string files;
  for (const std::string& name : imported.weight_files) files += (files.empty() ? "" : ", ") + name;
  std::fprintf(stderr, "%s from %s (%s): %d layers, %d heads, d_model %d, vocab %d, n_positions %d\n",
               imported.architecture.c_str(), flags.source.c_str(), files.c_str(), model.n_layer, model.n_head,
               model.d_model, model.vocab_size, model.seq_length);
  if (model.is_llama()) {
    std::fprintf(stderr, "model.arch llama: %d K/V heads, ffn_hidden %d, rope_theta %g, norm_eps %g, %s head\n",
                 model.kv_heads(), static_cast<int>(model.mlp_hidden()), static_cast<double>(model.rope_theta),
                 static_cast<double>(model.norm_eps), model.tie_embeddings ? "tied" : "untied");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("imported into %s in %.1f s: tensor parallel %d, pipeline parallel %d, step 0, fresh optimizer\n",
              imported.checkpoint.c_str(), seconds, imported.layout.tensor_parallel_size,
              imported.layout.pipeline_parallel_size);
  std::printf("tokenizer: %s\n", imported.tokenizer.empty() ? "none" : imported.tokenizer.c_str());
  std::printf("fine-tune with: train CONFIG model.init_from=%s\n", imported.checkpoint.c_str());
}

}  // namespace

void add_import_hf_command(CLI::App& app) {
  auto flags = std::make_shared<ImportFlags>();
  auto* command = app.add_subcommand(
      "import-hf",
      "Write a HuggingFace model directory (config.json and model.safetensors, or shards with "
      "model.safetensors.index.json; GPT2LMHeadModel or LlamaForCausalLM) as a dufu checkpoint at step 0 with a fresh optimizer, in the "
      "given tensor x pipeline layout, for `train CONFIG model.init_from=CHECKPOINT`");
  command->add_option("HF_DIR", flags->source, "HuggingFace model directory (save_pretrained's)")->required();
  command->add_option("CHECKPOINT", flags->destination, "New directory for the checkpoint")->required();
  command->add_option("--tensor-parallel-size", flags->options.tensor_parallel_size,
                      "Tensor-parallel pieces, as dist.tensor_parallel_size (any layout loads into any run; the "
                      "run's own loads without resharding)")
      ->check(whole_number_in(1, 4096));
  command->add_option("--pipeline-parallel-size", flags->options.pipeline_parallel_size,
                      "Pipeline stages, as dist.pipeline_parallel_size")
      ->check(whole_number_in(1, 4096));
  command->add_option("--pipeline-num-layers", flags->options.pipeline_layers,
                      "Layers per stage, as dist.pipeline_num_layers (default: an even split)")
      ->delimiter(',');
  command->add_option("--vocab-multiple", flags->options.vocab_multiple,
                      "model.vocab_multiple of the runs that will load it")
      ->check(whole_number_in(1, 1 << 20));
  command->add_flag("--no-tokenizer", flags->no_tokenizer,
                    "Leave the directory's tokenizer files out (by default tokenizer.model, tokenizer.json or "
                    "vocab.json + merges.txt goes into the checkpoint's tokenizer/)");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
