// dufu's single-thread tokenizer rate on a corpus: every document of the inputs
// encoded by one fresh TokenEncoder, as one `dataprep preprocess` worker meets them
// (its caches start empty and fill as it goes), best of --passes passes; with --warm,
// one encoder for every pass (caches full: the rate of a long run's steady state on a
// corpus like this one). Time is the thread's CPU time, so that other processes on a
// shared machine do not count (the reference script measures the same way). Prints
// one parseable line:
//   tokenizer_benchmark documents=N text_bytes=B tokens=T seconds=S text_mb_per_s=X checksum=C
// where checksum is an FNV-1a hash of every id in order, which the reference script
// (benchmarks/reference/tokenizer_reference_rate.py) prints too: equal checksums mean
// identical tokens.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/document_reader.h"
#include "dufu/dataprep/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"Single-thread encode rate of a dufu tokenizer"};
  dufu::dataprep::TokenizerSpec spec;
  std::vector<std::string> inputs;
  std::string json_key = "text";
  int passes = 3;
  bool warm = false;
  bool uncached = false;
  app.add_option("--tokenizer-model,-m", spec.model, "Tokenizer file")->required();
  app.add_option("--tokenizer-merges", spec.merges, "merges.txt of a vocab.json");
  app.add_option("--tokenizer-pattern", spec.pattern, "Pattern of a .tiktoken file");
  app.add_option("--input,-i", inputs, "jsonl/txt inputs")->required()->expected(1, -1);
  app.add_option("--json-key", json_key, "JSON key of the text")->capture_default_str();
  app.add_option("--passes", passes, "Timed passes (the best is reported)")->capture_default_str();
  app.add_flag("--uncached", uncached,
               "The implementation's own encoder without dufu's caches (sentencepiece's Encode): the baseline");
  app.add_flag("--warm", warm, "One encoder for all passes (its caches warm), after a warm-up pass");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto tokenizer = dufu::dataprep::Tokenizer::load(spec);
    dufu::dataprep::ReaderOptions options;
    options.json_keys = {json_key};
    dufu::dataprep::DocumentReader reader(dufu::dataprep::expand_inputs(inputs), options);
    std::vector<std::string> texts;
    std::uint64_t text_bytes = 0;
    dufu::dataprep::Document document;
    while (reader.next(&document)) {
      text_bytes += document.fields[0].size();
      texts.push_back(std::move(document.fields[0]));
    }
    auto encoder = tokenizer.make_encoder();
    std::vector<std::int32_t> ids;
    const auto cpu_seconds = [] {
      timespec now{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
      return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
    };
    std::uint64_t tokens = 0;
    std::uint64_t checksum = 14695981039346656037ULL;
    for (const auto& text : texts) {  // warm-up, and the tokens and checksum (of the encoder measured)
      if (uncached) {
        tokenizer.encode_uncached(text, &ids);
      } else {
        encoder->encode(text, &ids);
      }
      tokens += ids.size();
      for (const auto id : ids) checksum = (checksum ^ static_cast<std::uint32_t>(id)) * 1099511628211ULL;
    }
    double best = 1e30;
    for (int pass = 0; pass < passes; ++pass) {
      if (!warm) encoder = tokenizer.make_encoder();
      const double start = cpu_seconds();
      for (const auto& text : texts) {
        if (uncached) {
          tokenizer.encode_uncached(text, &ids);
        } else {
          encoder->encode(text, &ids);
        }
      }
      best = std::min(best, cpu_seconds() - start);
    }
    std::printf("tokenizer_benchmark documents=%zu text_bytes=%llu tokens=%llu seconds=%.4f text_mb_per_s=%.3f "
                "checksum=%016llx\n",
                texts.size(), static_cast<unsigned long long>(text_bytes), static_cast<unsigned long long>(tokens),
                best, static_cast<double>(text_bytes) / best / 1e6, static_cast<unsigned long long>(checksum));
  } catch (const dufu::Error& error) {
    std::fprintf(stderr, "tokenizer_benchmark: %s\n", error.what());
    return 1;
  } catch (const dufu::InternalError& bug) {  // a failed DUFU_CHECK: a bug in dufu
    std::fprintf(stderr, "tokenizer_benchmark: internal error: %s\n", bug.what());
    return 3;
  }
  return 0;
}
