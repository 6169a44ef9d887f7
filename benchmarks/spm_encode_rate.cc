// The baseline of the preprocessing benchmark: sentencepiece's single-thread encode
// rate on a corpus, i.e. the tokenizer-bound limit of one `dataprep preprocess` worker.
// Documents are read with dufu's DocumentReader (same text, same keys as preprocess)
// in chunks of about --chunk-mb, so memory stays modest; only the sentencepiece
// Encode calls are timed, on one thread. Prints one parseable line:
//   spm_encode_rate documents=N text_bytes=B tokens=T seconds=S text_mb_per_s=X tokens_per_s=Y
// `tokens` counts no end-of-document ids; a preprocess run with --append-eod writes
// tokens + (documents that encode to at least one token), which the driver checks.
#include <sentencepiece_processor.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/document_reader.h"

namespace {

struct Totals {
  std::uint64_t documents = 0;           // documents that encode to >= 1 token
  std::uint64_t empty = 0;               // documents that encode to nothing
  std::uint64_t text_bytes = 0;
  std::uint64_t tokens = 0;
  double seconds = 0;
};

// Encodes every text of `chunk` on this thread; only this loop is timed.
void encode_chunk(const sentencepiece::SentencePieceProcessor& processor,
                  const std::vector<std::string>& chunk, Totals* totals) {
  std::vector<int> ids;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& text : chunk) {
    ids.clear();
    const auto status = processor.Encode(text, &ids);
    if (!status.ok()) DUFU_FAIL("sentencepiece failed to encode a document: ", status.ToString());
    totals->tokens += ids.size();
    if (ids.empty()) {
      ++totals->empty;
    } else {
      ++totals->documents;
    }
  }
  totals->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Totals measure(const std::string& model_path, const std::vector<std::string>& inputs,
               const std::string& json_key, std::size_t chunk_bytes) {
  sentencepiece::SentencePieceProcessor processor;
  const auto status = processor.Load(model_path);
  if (!status.ok()) DUFU_FAIL("cannot load sentencepiece model '", model_path, "': ", status.ToString());

  dufu::dataprep::ReaderOptions options;
  options.json_keys = {json_key};
  dufu::dataprep::DocumentReader reader(dufu::dataprep::expand_inputs(inputs), options);
  Totals totals;
  std::vector<std::string> chunk;
  std::size_t chunk_text = 0;
  dufu::dataprep::Document document;
  while (reader.next(&document)) {
    chunk_text += document.fields[0].size();
    totals.text_bytes += document.fields[0].size();
    chunk.push_back(std::move(document.fields[0]));
    if (chunk_text >= chunk_bytes) {
      encode_chunk(processor, chunk, &totals);
      chunk.clear();
      chunk_text = 0;
    }
  }
  encode_chunk(processor, chunk, &totals);
  return totals;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sentencepiece's single-thread encode rate on a txt/jsonl corpus"};
  std::string model_path;
  std::vector<std::string> inputs;
  std::string json_key = "text";
  std::size_t chunk_mb = 64;
  app.add_option("--tokenizer-model,-m", model_path, "sentencepiece .model file")->required();
  app.add_option("--input,-i", inputs, "Input files (txt/jsonl, optionally .zst/.gz)")
      ->required()
      ->expected(1, -1);
  app.add_option("--json-key", json_key, "JSON key holding the text")->capture_default_str();
  app.add_option("--chunk-mb", chunk_mb, "Text read per timed chunk, in MB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    const Totals totals = measure(model_path, inputs, json_key, chunk_mb * 1000 * 1000);
    const double seconds = totals.seconds > 0 ? totals.seconds : 1e-9;
    std::printf(
        "spm_encode_rate documents=%llu empty=%llu text_bytes=%llu tokens=%llu seconds=%.3f "
        "text_mb_per_s=%.4f tokens_per_s=%.0f\n",
        static_cast<unsigned long long>(totals.documents),
        static_cast<unsigned long long>(totals.empty),
        static_cast<unsigned long long>(totals.text_bytes),
        static_cast<unsigned long long>(totals.tokens), totals.seconds,
        static_cast<double>(totals.text_bytes) / 1e6 / seconds,
        static_cast<double>(totals.tokens) / seconds);
  } catch (const dufu::Error& error) {
    std::fprintf(stderr, "spm_encode_rate: %s\n", error.what());
    return 1;
  } catch (const dufu::InternalError& bug) {  // a failed DUFU_CHECK: a bug in dufu
    std::fprintf(stderr, "spm_encode_rate: internal error: %s\n", bug.what());
    return 3;
  }
  return 0;
}
