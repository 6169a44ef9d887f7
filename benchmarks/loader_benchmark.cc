// Loader throughput and index build time (issue: datasets and loader).
//
// 1. Loader: a synthetic mmap shard (uint16 tokens, documents of random lengths) is
//    read through CausalLMDataset + random sampler + InfiniteDataLoader at
//    seq_length 2048, and its tokens/s and GB/s are printed with the ratio to a
//    plain memcpy of the same bytes (same sample windows, same order) measured in
//    the same run. Before timing, a few batches are checked against the shard.
// 2. Index build: document, sample and shuffle indices for 10^9 tokens in 10^6
//    documents (sizes in memory), one epoch at seq_length 2048, timed.
//
// usage: loader_benchmark [WORK_DIR] [--tokens N] [--micro-batch B] [--workers W]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dufu/common/mapped_file.h"
#include "dufu/dataprep/causal_lm_dataset.h"
#include "dufu/dataprep/data_loader.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;
using dufu::dataprep::CausalLMDataset;
using dufu::dataprep::CausalLMOptions;
using dufu::dataprep::IndexedDataset;
using dufu::dataprep::IndexImpl;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::uint64_t> random_lengths(std::uint64_t total_tokens, std::uint64_t documents,
                                          std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  const std::uint64_t mean = total_tokens / documents;
  std::uniform_int_distribution<std::uint64_t> length(1, 2 * mean - 1);
  std::vector<std::uint64_t> lengths(documents);
  std::uint64_t sum = 0;
  for (auto& value : lengths) sum += value = length(rng);
  // Adjust the last document so the total is exact.
  if (sum < total_tokens) {
    lengths.back() += total_tokens - sum;
  } else {
    for (std::size_t i = 0; sum > total_tokens && i < lengths.size(); ++i) {
      const std::uint64_t cut = std::min(lengths[i] - 1, sum - total_tokens);
      lengths[i] -= cut;
      sum -= cut;
    }
  }
  return lengths;
}

void write_shard(const std::string& prefix, const std::vector<std::uint64_t>& lengths) {
  dufu::dataprep::IndexedDatasetWriter writer(prefix, dufu::dataprep::IndexLayout::kMMIDIDX,
                                              dufu::dataprep::DType::kUInt16);
  std::vector<std::int32_t> tokens;
  std::uint64_t position = 0;
  for (const auto length : lengths) {
    tokens.resize(length);
    for (auto& token : tokens) token = static_cast<std::int32_t>(position++ % 65536);
    writer.add_document(tokens);
  }
  writer.commit();
}

// What one sample's tokens should be, from the raw .bin (the token at shard position
// k is k mod 65536 by construction, so a window is a run of consecutive values except
// where the sample crosses into a document that is not the next one).
bool batch_matches_dataset(const dufu::dataprep::Batch& batch, const CausalLMDataset& dataset) {
  std::vector<std::int32_t> expected(batch.columns);
  for (std::uint64_t row = 0; row < batch.rows; ++row) {
    dataset.get(batch.indices[row], expected);
    if (std::memcmp(expected.data(), batch.tokens.data() + row * batch.columns,
                    batch.columns * sizeof(std::int32_t)) != 0) {
      return false;
    }
  }
  return true;
}

void loader_benchmark(const std::string& work, std::uint64_t total_tokens, std::uint64_t micro_batch,
                      int workers) {
  constexpr std::uint64_t kSeqLength = 2048;
  const std::string prefix = work + "/loader-shard";
  const std::uint64_t documents = total_tokens / 1000;
  if (!std::filesystem::exists(prefix + ".idx")) {
    const auto start = Clock::now();
    write_shard(prefix, random_lengths(total_tokens, documents, 42));
    std::printf("wrote %s.{bin,idx}: %llu tokens in %llu documents (%.1f s)\n", prefix.c_str(),
                static_cast<unsigned long long>(total_tokens), static_cast<unsigned long long>(documents),
                seconds_since(start));
  }
  std::shared_ptr<const IndexedDataset> shard = IndexedDataset::open(prefix, IndexImpl::kMmap);
  CausalLMOptions options;
  options.seq_length = kSeqLength;
  options.split.start_weight = 0.0;
  options.split.end_weight = 1.0;
  options.use_cache = false;
  auto dataset = std::make_shared<CausalLMDataset>(shard, options);
  const std::uint64_t batches = dataset->size() / micro_batch;
  const std::uint64_t bytes_per_batch = micro_batch * (kSeqLength + 1) * sizeof(std::uint16_t);

  // Correctness before timing.
  {
    dufu::dataprep::LoaderOptions loader_options{micro_batch, workers, 8};
    dufu::dataprep::InfiniteDataLoader loader(dataset, dufu::dataprep::make_random_sampler(dataset->size(), 1234),
                                              loader_options);
    for (int i = 0; i < 5; ++i) {
      if (!batch_matches_dataset(loader.next(), *dataset)) {
        std::fprintf(stderr, "loader batch %d does not match the dataset\n", i);
        std::exit(1);
      }
    }
  }

  // Warm the page cache so both measurements read memory, not disk.
  const auto bin = dufu::MappedFile::open(prefix + ".bin");
  volatile std::uint64_t checksum = 0;
  for (std::uint64_t i = 0; i < bin.size(); i += 4096) checksum = checksum + static_cast<std::uint64_t>(bin.data()[i]);

  dufu::dataprep::LoaderOptions loader_options{micro_batch, workers, 8};
  dufu::dataprep::InfiniteDataLoader loader(dataset, dufu::dataprep::make_random_sampler(dataset->size(), 1234),
                                            loader_options);
  auto start = Clock::now();
  std::vector<std::vector<std::uint64_t>> order;
  for (std::uint64_t b = 0; b < batches; ++b) {
    const auto batch = loader.next();
    order.push_back(batch.indices);
  }
  const double loader_seconds = seconds_since(start);

  // Baseline: memcpy of the same windows in the same order from the mapped .bin.
  std::vector<std::byte> buffer(bytes_per_batch);
  const std::uint64_t window = (kSeqLength + 1) * sizeof(std::uint16_t);
  std::vector<std::uint64_t> offsets;
  for (const auto& rows : order) {
    for (const auto index : rows) {
      const auto [doc_pos, token_offset] = dataset->sample_index_at(static_cast<std::uint64_t>(dataset->shuffle_index_at(index)));
      const auto sequence = static_cast<std::uint64_t>(dataset->document_index_at(static_cast<std::uint64_t>(doc_pos)));
      std::uint64_t byte = (shard->index().sequence_offset(sequence) + static_cast<std::uint64_t>(token_offset)) * 2;
      offsets.push_back(std::min(byte, bin.size() - window));
    }
  }
  start = Clock::now();
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    std::memcpy(buffer.data() + (i % micro_batch) * window, bin.data() + offsets[i], window);
    if (i % micro_batch == micro_batch - 1) checksum = checksum + static_cast<std::uint64_t>(buffer[i % 97]);
  }
  const double memcpy_seconds = seconds_since(start);

  const double tokens = static_cast<double>(batches * micro_batch * (kSeqLength + 1));
  const double bytes = static_cast<double>(batches * bytes_per_batch);
  std::printf("\nloader: seq_length %llu, micro_batch %llu, %d workers, random sampler, mmap shard of %llu tokens\n",
              static_cast<unsigned long long>(kSeqLength), static_cast<unsigned long long>(micro_batch), workers,
              static_cast<unsigned long long>(total_tokens));
  std::printf("  loader  %8.2f M tokens/s  %6.2f GB/s of shard bytes  (%llu batches in %.2f s)\n",
              tokens / loader_seconds / 1e6, bytes / loader_seconds / 1e9, static_cast<unsigned long long>(batches),
              loader_seconds);
  std::printf("  memcpy  %8.2f M tokens/s  %6.2f GB/s  (same windows, same order, one thread)\n",
              tokens / memcpy_seconds / 1e6, bytes / memcpy_seconds / 1e9);
  std::printf("  ratio loader/memcpy: %.3f\n", memcpy_seconds / loader_seconds);
}

void index_build_benchmark() {
  constexpr std::uint64_t kTokens = 1'000'000'000;
  constexpr std::uint64_t kDocuments = 1'000'000;
  const auto lengths = random_lengths(kTokens, kDocuments, 7);
  std::vector<std::int32_t> ids(kDocuments);
  for (std::uint64_t i = 0; i < kDocuments; ++i) ids[i] = static_cast<std::int32_t>(i);
  for (const std::optional<std::uint64_t> samples : {std::optional<std::uint64_t>{}, std::optional<std::uint64_t>{1'400'000}}) {
    const auto start = Clock::now();
    const auto indices = dufu::dataprep::build_causal_lm_indices(
        ids, [&](std::uint64_t sequence) { return lengths[sequence]; }, 2048, samples, 1234);
    const double seconds = seconds_since(start);
    std::printf("index build: 10^9 tokens, 10^6 documents, seq_length 2048, %s: %llu samples, %llu epochs in %.2f s\n",
                samples ? "1.4M samples" : "one epoch",
                static_cast<unsigned long long>(indices.shuffle_index.size()),
                static_cast<unsigned long long>(indices.num_epochs), seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string work = "/tmp/dufu-loader-bench";
  std::uint64_t tokens = 256'000'000;
  std::uint64_t micro_batch = 8;
  int workers = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokens" && i + 1 < argc) {
      tokens = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--micro-batch" && i + 1 < argc) {
      micro_batch = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--workers" && i + 1 < argc) {
      workers = std::atoi(argv[++i]);
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: loader_benchmark [WORK_DIR] [--tokens N] [--micro-batch B] [--workers W]\n");
      return 0;
    } else {
      work = arg;
    }
  }
  std::filesystem::create_directories(work);
  try {
    index_build_benchmark();
    loader_benchmark(work, tokens, micro_batch, workers);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loader_benchmark: %s\n", error.what());
    return 1;
  }
  return 0;
}
