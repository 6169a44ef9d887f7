// The infinite loader: worker threads read batches ahead into a bounded window while
// the consumer takes them strictly in order. A worker claims the next batch number and
// its sampler indices under the lock (cheap), reads the samples outside it (the
// expensive part), and files the batch under its number; next() waits for batch k
// only. The state is the stream position where the next returned batch starts, so a
// restore drops whatever was prefetched and rereads from there.
#include "dufu/dataprep/data_loader.h"

#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/packed_documents.h"

namespace dufu::dataprep {

std::string LoaderState::to_string() const {
  return str_cat("epoch=", next.epoch, " position=", next.position, " batches=", batches_served);
}

LoaderState parse_loader_state(const std::string& text) {
  const auto fail = [&text]() {
    DUFU_FAIL("malformed loader state '", text, "': expected 'epoch=E position=P batches=B'");
  };
  std::string_view rest(text);
  const auto field = [&](std::string_view name, bool last) -> std::uint64_t {
    if (!rest.starts_with(name) || rest.size() == name.size() || rest[name.size()] != '=') fail();
    rest.remove_prefix(name.size() + 1);
    std::uint64_t value = 0;
    const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (error != std::errc() || end == rest.data()) fail();
    rest.remove_prefix(static_cast<std::size_t>(end - rest.data()));
    if (last) {
      if (!rest.empty()) fail();
    } else {
      if (!rest.starts_with(' ')) fail();
      rest.remove_prefix(1);
    }
    return value;
  };
  LoaderState state;
  state.next.epoch = field("epoch", false);
  state.next.position = field("position", false);
  state.batches_served = field("batches", true);
  return state;
}

struct InfiniteDataLoader::Impl {
  // A batch claimed by a worker: ready when `done`, failed when `error` is set.
  struct Slot {
    Batch batch;
    SamplerPosition end;  // stream position after the batch's last row
    std::exception_ptr error;
    bool done = false;
  };

  Impl(std::shared_ptr<const TokenDataset> dataset_, std::unique_ptr<Sampler> sampler,
       LoaderOptions options_, LoaderState start)
      : dataset(std::move(dataset_)),
        options(options_),
        columns(dataset->sample_length()),
        stream(std::move(sampler), start.next),
        next_position(stream.position()),
        batches_served(start.batches_served) {}

  void start_workers() {
    stopping = false;
    for (int i = 0; i < options.workers; ++i) workers.emplace_back([this] { work(); });
  }

  void stop_workers() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    space.notify_all();
    for (std::thread& worker : workers) worker.join();
    workers.clear();
    slots.clear();
    next_claim = 0;
    next_return = 0;
  }

  void work() {
    std::unique_lock lock(mutex);
    while (true) {
      space.wait(lock, [this] {
        return stopping || next_claim - next_return < static_cast<std::uint64_t>(options.prefetch_batches);
      });
      if (stopping) return;
      const std::uint64_t number = next_claim++;
      Slot& slot = slots[number];  // std::map: the reference stays valid while others insert
      Batch& batch = slot.batch;
      batch.rows = options.micro_batch;
      batch.columns = columns;
      try {
        batch.start = stream.position();
        batch.indices.resize(options.micro_batch);
        for (std::uint64_t& index : batch.indices) index = stream.next();
        slot.end = stream.position();
      } catch (...) {
        slot.error = std::current_exception();
        slot.done = true;
        ready.notify_all();
        continue;
      }

      lock.unlock();
      std::exception_ptr error;
      try {
        read(batch);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      slot.error = error;
      slot.done = true;
      ready.notify_all();
    }
  }

  void read(Batch& batch) const {
    const std::uint64_t size = dataset->size();
    batch.tokens.resize(batch.rows * batch.columns);
    for (std::uint64_t row = 0; row < batch.rows; ++row) {
      const std::uint64_t index = batch.indices[row];
      if (index >= size) {
        DUFU_FAIL("data loader: the sampler gave index ", index, " but the dataset has ", size,
                  " samples (", dataset->describe(), ")");
      }
      dataset->get(index, std::span<std::int32_t>(batch.tokens).subspan(row * batch.columns, batch.columns));
    }
    if (options.document_eod_id) {
      PackedDocuments documents = find_packed_documents(batch.tokens, batch.rows, batch.columns, *options.document_eod_id);
      batch.position_ids = std::move(documents.position_ids);
      batch.cu_seqlens = std::move(documents.cu_seqlens);
    }
  }

  Batch next() { return *try_next(std::chrono::milliseconds::max()); }

  std::optional<Batch> try_next(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex);
    const auto next_is_done = [this] {
      const auto it = slots.find(next_return);
      return it != slots.end() && it->second.done;
    };
    if (timeout == std::chrono::milliseconds::max()) {
      ready.wait(lock, next_is_done);
    } else if (!ready.wait_for(lock, timeout, next_is_done)) {
      return std::nullopt;
    }
    const auto it = slots.find(next_return);
    // A failed batch stays failed: every call rethrows until restore().
    if (it->second.error) std::rethrow_exception(it->second.error);
    Batch batch = std::move(it->second.batch);
    next_position = it->second.end;
    slots.erase(it);
    ++next_return;
    ++batches_served;
    lock.unlock();
    space.notify_all();
    return batch;
  }

  std::shared_ptr<const TokenDataset> dataset;
  LoaderOptions options;
  std::uint64_t columns;

  mutable std::mutex mutex;
  std::condition_variable space;  // workers wait for room in the prefetch window
  std::condition_variable ready;  // the consumer waits for batch `next_return`
  bool stopping = false;
  SamplerStream stream;            // claimed rows advance it
  std::map<std::uint64_t, Slot> slots;
  std::uint64_t next_claim = 0;   // number of the next batch a worker will claim
  std::uint64_t next_return = 0;  // number of the next batch next() returns
  SamplerPosition next_position;  // stream position of batch `next_return`
  std::uint64_t batches_served;
  std::vector<std::thread> workers;
};

InfiniteDataLoader::InfiniteDataLoader(std::shared_ptr<const TokenDataset> dataset,
                                       std::unique_ptr<Sampler> sampler, LoaderOptions options,
                                       LoaderState start) {
  if (!dataset) DUFU_FAIL("data loader: no dataset");
  if (!sampler) DUFU_FAIL("data loader: no sampler");
  if (dataset->size() == 0) DUFU_FAIL("data loader: the dataset is empty (", dataset->describe(), ")");
  if (options.micro_batch == 0) DUFU_FAIL("data loader: micro_batch must be at least 1");
  if (options.workers < 1) DUFU_FAIL("data loader: workers must be at least 1, got ", options.workers);
  if (options.prefetch_batches < 1) {
    DUFU_FAIL("data loader: prefetch_batches must be at least 1, got ", options.prefetch_batches);
  }
  impl_ = std::make_unique<Impl>(std::move(dataset), std::move(sampler), options, start);
  impl_->start_workers();
}

InfiniteDataLoader::~InfiniteDataLoader() { impl_->stop_workers(); }

Batch InfiniteDataLoader::next() { return impl_->next(); }

std::optional<Batch> InfiniteDataLoader::try_next(std::chrono::milliseconds timeout) {
  return impl_->try_next(timeout);
}

LoaderState InfiniteDataLoader::state() const {
  std::lock_guard lock(impl_->mutex);
  return {impl_->next_position, impl_->batches_served};
}

void InfiniteDataLoader::restore(const LoaderState& state) {
  impl_->stop_workers();
  try {
    impl_->stream.restore(state.next);
  } catch (...) {
    // Keep the loader usable where it was: reread from the last returned batch.
    impl_->stream.restore(impl_->next_position);
    impl_->start_workers();
    throw;
  }
  impl_->next_position = impl_->stream.position();
  impl_->batches_served = state.batches_served;
  impl_->start_workers();
}

}  // namespace dufu::dataprep
