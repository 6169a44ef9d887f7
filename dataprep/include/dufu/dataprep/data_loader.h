// The infinite loader (OSLO's InfiniteDataLoader, done right): batches of
// [micro_batch, seq_length + 1] tokens forever, the epoch advancing (and reshuffling)
// by itself, worker threads filling a bounded queue of prefetched batches, and a
// state that restores to the exact next batch after a restart.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dufu/dataprep/sampler.h"
#include "dufu/dataprep/token_dataset.h"

namespace dufu::dataprep {

struct Batch {
  std::uint64_t rows = 0;                 // micro_batch
  std::uint64_t columns = 0;              // seq_length + 1
  std::vector<std::int32_t> tokens;       // rows × columns, row-major
  std::vector<std::uint64_t> indices;     // the dataset index of each row
  SamplerPosition start;                  // where the batch's first row came from
  // Only with LoaderOptions::document_eod_id (packed_documents.h): each input token's
  // position in its document [rows, columns - 1], and where the documents of the
  // flattened inputs start (cu_seqlens, ending with rows × (columns - 1)).
  std::vector<std::int32_t> position_ids;
  std::vector<std::int32_t> cu_seqlens;
};

struct LoaderOptions {
  std::uint64_t micro_batch = 1;
  int workers = 2;             // threads reading samples
  int prefetch_batches = 4;    // bounded queue of ready batches
  // Set: batches carry their documents' boundaries and position ids, found by this
  // end-of-document token (document masking; packed_documents.h).
  std::optional<std::int32_t> document_eod_id = std::nullopt;
};

// The position of the next batch a loader will return; enough to restore it.
struct LoaderState {
  SamplerPosition next;
  std::uint64_t batches_served = 0;
  bool operator==(const LoaderState&) const = default;
  // "epoch=E position=P batches=B", parsed back by parse_loader_state.
  std::string to_string() const;
};
LoaderState parse_loader_state(const std::string& text);

class InfiniteDataLoader {
 public:
  InfiniteDataLoader(std::shared_ptr<const TokenDataset> dataset, std::unique_ptr<Sampler> sampler,
                     LoaderOptions options, LoaderState start = {});
  ~InfiniteDataLoader();  // stops and joins the workers
  InfiniteDataLoader(const InfiniteDataLoader&) = delete;
  InfiniteDataLoader& operator=(const InfiniteDataLoader&) = delete;

  // The next batch, in sampler order, whatever the number of workers. Rethrows a
  // worker's error (e.g. an IO error) here.
  Batch next();
  // next(), or nullopt when the batch is not ready within `timeout`: lets a caller
  // that must stay responsive (Python's Ctrl-C) wait in slices. Nothing is consumed
  // by a call that times out.
  std::optional<Batch> try_next(std::chrono::milliseconds timeout);
  // The state before the next call to next().
  LoaderState state() const;
  // Drops prefetched batches and continues from `state`.
  void restore(const LoaderState& state);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dufu::dataprep
