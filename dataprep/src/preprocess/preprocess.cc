// The preprocessing pipeline. One reader thread groups documents into batches of
// about `batch_bytes` of text; worker threads tokenize whole batches; the calling
// thread writes finished batches strictly in reading order, which is why the output
// bytes do not depend on the worker count. A fixed number of batch slots bounds the
// memory in flight, so peak RSS is independent of the corpus size.
#include "dufu/dataprep/preprocess.h"

#include "preprocess_pipeline.h"
#include "preprocess_sidecar.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/common/human_units.h"
#include "dufu/common/log.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/shard_output.h"
#include "dufu/dataprep/tokenizer.h"

namespace dufu::dataprep {
namespace {

constexpr std::size_t kBytesCounter = 0;
constexpr std::size_t kDocumentsCounter = 1;
constexpr std::size_t kTokensCounter = 2;
// How often the writer looks at PreprocessOptions::stop while it waits for a batch.
constexpr std::chrono::milliseconds kStopPoll{20};

struct TextBatch {
  std::uint64_t sequence = 0;
  std::size_t num_records = 0;
  // fields[record * num_keys + key]
  std::vector<std::string> fields;
  // Each record's input and line there (Document::input, input_line), for messages.
  std::vector<std::pair<std::size_t, std::uint64_t>> places;
};

struct TokenBatch {
  std::uint64_t sequence = 0;
  std::size_t num_records = 0;
  // Per key: all tokens of the batch back to back, and each record's length (0 =
  // empty document, to be skipped).
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<std::uint64_t>> lengths;
  std::uint64_t text_bytes = 0;
};

// How far reading is: input bytes read and text bytes handed out in batches so far.
// The input bytes run ahead of the batches (a line reader's buffer, a decoder's: up
// to a few MiB), so the writer counts as done the input bytes read times the share
// of the text it has written: the percentage of progress follows the work done.
class ReadPosition {
 public:
  void set(std::uint64_t raw_bytes, std::uint64_t text_bytes) {
    std::lock_guard lock(mutex_);
    raw_bytes_ = raw_bytes;
    text_bytes_ = text_bytes;
  }
  std::uint64_t raw_bytes_done(std::uint64_t text_bytes_written) const {
    std::lock_guard lock(mutex_);
    if (text_bytes_ == 0 || text_bytes_written >= text_bytes_) return raw_bytes_;
    return static_cast<std::uint64_t>(static_cast<long double>(raw_bytes_) * text_bytes_written / text_bytes_);
  }

 private:
  mutable std::mutex mutex_;
  std::uint64_t raw_bytes_ = 0, text_bytes_ = 0;
};

// Shared state of one run: the work queue, the reorder buffer, the slot count and
// the first failure. One mutex is enough: each operation moves a whole batch.
class Pipeline {
 public:
  explicit Pipeline(std::size_t max_batches_in_flight) : max_in_flight_(max_batches_in_flight) {}

  // Reader side: blocks while every slot is taken. False when the run is aborting.
  bool push_work(TextBatch batch) {
    std::unique_lock lock(mutex_);
    slot_free_.wait(lock, [&] { return aborted_ || in_flight_ < max_in_flight_; });
    if (aborted_) return false;
    ++in_flight_;
    work_.push_back(std::move(batch));
    work_ready_.notify_one();
    return true;
  }
  void finish_reading(std::uint64_t total_batches) {
    std::lock_guard lock(mutex_);
    total_batches_ = total_batches;
    reading_done_ = true;
    work_ready_.notify_all();
    result_ready_.notify_all();
  }
  // Worker side: false when there is no more work.
  bool pop_work(TextBatch* batch) {
    std::unique_lock lock(mutex_);
    work_ready_.wait(lock, [&] { return aborted_ || !work_.empty() || reading_done_; });
    if (aborted_ || work_.empty()) return false;
    *batch = std::move(work_.front());
    work_.pop_front();
    return true;
  }
  void push_result(TokenBatch batch) {
    std::lock_guard lock(mutex_);
    const auto sequence = batch.sequence;
    results_.emplace(sequence, std::move(batch));
    result_ready_.notify_all();
  }
  enum class Popped { kBatch, kAllDone, kTimedOut };
  // Writer side: the batch with `sequence`; kAllDone when all were written (or the run
  // is aborting); kTimedOut when `deadline` passed first.
  Popped pop_result(std::uint64_t sequence, TokenBatch* batch,
                    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
    std::unique_lock lock(mutex_);
    const auto ready = [&] {
      return aborted_ || results_.contains(sequence) || (reading_done_ && sequence >= total_batches_);
    };
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      result_ready_.wait(lock, ready);
    } else if (!result_ready_.wait_until(lock, deadline, ready)) {
      return Popped::kTimedOut;
    }
    if (aborted_) return Popped::kAllDone;
    auto found = results_.find(sequence);
    if (found == results_.end()) return Popped::kAllDone;
    *batch = std::move(found->second);
    results_.erase(found);
    return Popped::kBatch;
  }
  void release_slot() {
    std::lock_guard lock(mutex_);
    --in_flight_;
    slot_free_.notify_one();
  }
  // Read without the lock by workers between documents, so that a failure or a stop
  // does not wait for the batches they are tokenizing.
  bool aborting() const { return aborted_.load(std::memory_order_relaxed); }
  void abort(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!first_error_) first_error_ = error;
    aborted_ = true;
    slot_free_.notify_all();
    work_ready_.notify_all();
    result_ready_.notify_all();
  }
  std::exception_ptr first_error() {
    std::lock_guard lock(mutex_);
    return first_error_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable slot_free_, work_ready_, result_ready_;
  std::deque<TextBatch> work_;
  std::map<std::uint64_t, TokenBatch> results_;
  std::size_t max_in_flight_;
  std::size_t in_flight_ = 0;
  bool reading_done_ = false;
  std::uint64_t total_batches_ = 0;
  std::atomic<bool> aborted_{false};
  std::exception_ptr first_error_;
};

struct ReaderTotals {
  std::uint64_t records = 0;
  std::uint64_t input_bytes = 0;
  std::uint64_t bad_records = 0;
  std::vector<std::string> first_errors;
};

void read_batches(DocumentReader& reader, std::size_t num_keys, std::size_t batch_bytes, Pipeline& pipeline,
                  ReadPosition* position, ReaderTotals* totals) {
  std::uint64_t sequence = 0;
  std::uint64_t text_read = 0;
  Document document;
  TextBatch batch;
  std::size_t batch_text = 0;
  auto flush = [&] {
    text_read += batch_text;
    position->set(reader.raw_bytes_read(), text_read);
    batch.sequence = sequence++;
    const bool accepted = pipeline.push_work(std::move(batch));
    batch = TextBatch{};
    batch_text = 0;
    return accepted;
  };
  while (reader.next(&document)) {
    ++totals->records;
    batch.places.emplace_back(document.input, document.input_line);
    for (std::size_t key = 0; key < num_keys; ++key) {
      batch_text += document.fields[key].size();
      batch.fields.push_back(std::move(document.fields[key]));
    }
    ++batch.num_records;
    if (batch_text >= batch_bytes && !flush()) return;
  }
  if (batch.num_records > 0 && !flush()) return;
  totals->input_bytes = reader.raw_bytes_read();
  position->set(totals->input_bytes, text_read);
  totals->bad_records = reader.bad_records();
  totals->first_errors = reader.reported_errors();
  pipeline.finish_reading(sequence);
}

void tokenize_batches(const Tokenizer& tokenizer, std::size_t num_keys, std::optional<int> eod,
                      const DocumentReader& reader, Pipeline& pipeline) {
  const auto encoder = tokenizer.make_encoder();  // one per worker: it keeps a cache
  std::vector<std::int32_t> ids;
  TextBatch text;
  while (pipeline.pop_work(&text)) try {
    TokenBatch result;
    result.sequence = text.sequence;
    result.num_records = text.num_records;
    result.tokens.resize(num_keys);
    result.lengths.resize(num_keys);
    for (std::size_t key = 0; key < num_keys; ++key) {
      result.lengths[key].reserve(text.num_records);
    }
    for (std::size_t record = 0; record < text.num_records; ++record) {
      if (pipeline.aborting()) return;
      for (std::size_t key = 0; key < num_keys; ++key) {
        const std::string& field = text.fields[record * num_keys + key];
        result.text_bytes += field.size();
        try {
          encoder->encode(field, &ids);
        } catch (const Error& error) {
          // A pre-tokenizer pattern that gives up (PCRE2's match limit) on one document.
          const auto& [input, line] = text.places[record];
          DUFU_FAIL(reader.place(input, line), ": ", error.what());
        }
        if (!ids.empty() && eod) ids.push_back(*eod);
        result.tokens[key].insert(result.tokens[key].end(), ids.begin(), ids.end());
        result.lengths[key].push_back(ids.size());
      }
    }
    pipeline.push_result(std::move(result));
  } catch (const std::bad_alloc&) {
    std::size_t bytes = 0, longest = 0;
    for (const auto& field : text.fields) {
      bytes += field.size();
      longest = std::max(longest, field.size());
    }
    DUFU_FAIL("not enough memory to tokenize a batch of ", human_bytes(static_cast<double>(bytes)),
              " (its longest document has ", human_bytes(static_cast<double>(longest)),
              "; sentencepiece takes about 55 bytes per byte of a document); lower `max_document_bytes` or `workers`");
  }
}

}  // namespace

std::vector<std::string> output_prefixes_for(const std::string& prefix,
                                             const std::vector<std::string>& json_keys) {
  if (json_keys.size() <= 1) return {prefix};
  std::vector<std::string> prefixes;
  for (const auto& key : json_keys) prefixes.push_back(prefix + "_" + key + "_document");
  return prefixes;
}

IndexLayout output_layout(const PreprocessOptions& options) {
  return layout_for_impl(options.impl, options.layout);
}

PreprocessSetup set_up_preprocess(const PreprocessOptions& options) {
  if (options.inputs.empty()) DUFU_FAIL("no input files given");
  if (options.output_prefix.empty()) DUFU_FAIL("no output prefix given");
  check_output_prefix(options.output_prefix);
  if (options.reader.json_keys.empty()) DUFU_FAIL("at least one JSON key is needed");
  std::set<std::string> keys;
  for (const auto& key : options.reader.json_keys) {
    if (!keys.insert(key).second) {
      DUFU_FAIL("JSON key '", key, "' is given twice (`json_keys`); each key writes its own output");
    }
  }
  if (options.workers < 0 || options.workers > kMaxWorkers) {
    DUFU_FAIL("`workers` ", options.workers, " is out of range: use 1 to ", kMaxWorkers, ", or 0 for all cores");
  }
  if (options.batch_bytes == 0 || options.batch_bytes > kMaxBatchBytes) {
    DUFU_FAIL("`batch_bytes` ", options.batch_bytes, " is out of range: use 1 to ", kMaxBatchBytes);
  }
  std::vector<std::string> output_prefixes = output_prefixes_for(options.output_prefix, options.reader.json_keys);
  std::vector<std::string> inputs = expand_inputs(options.inputs);
  for (const auto& prefix : output_prefixes) refuse_output_that_is_an_input(prefix, inputs);

  const Tokenizer tokenizer = Tokenizer::load(options.tokenizer);
  DUFU_LOG_INFO("preprocess", "tokenizer: ", tokenizer.name());
  if (options.eod_id && (*options.eod_id < 0 || *options.eod_id >= tokenizer.vocab_size())) {
    DUFU_FAIL("`eod_id` ", *options.eod_id, " is not a token of '", options.tokenizer.model, "': its ",
              tokenizer.vocab_size(), " pieces have ids 0 to ", tokenizer.vocab_size() - 1);
  }
  std::optional<int> eod;
  if (options.append_eod) {
    eod = options.eod_id ? *options.eod_id : tokenizer.eos_id();
    if (*eod < 0) {
      DUFU_FAIL("the model '", options.tokenizer.model,
                "' has no end-of-document token (</s>, <|endoftext|>); pass `eod_id` to choose its id");
    }
  }
  // fairseq's lazy/cached reader cannot take uint16 (the writer says why): that layout
  // defaults to int32, as fairseq's own builder writes; the others to Megatron's rule.
  const DType dtype = options.dtype                                          ? *options.dtype
                      : output_layout(options) == IndexLayout::kFairseqTNTIDX ? DType::kInt32
                                                                             : token_dtype_for_vocab(tokenizer.vocab_size());
  const int workers = options.workers > 0
                          ? options.workers
                          : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U,
                                                        static_cast<unsigned>(kMaxWorkers)));
  return PreprocessSetup{.inputs = std::move(inputs),
                         .output_prefixes = std::move(output_prefixes),
                         .tokenizer = tokenizer,
                         .tokenizer_record = record_tokenizer(options.tokenizer),
                         .eod = eod,
                         .dtype = dtype,
                         .workers = workers};
}

void run_pipeline(const PreprocessOptions& options, const PreprocessSetup& setup, DocumentReader& reader,
                  std::vector<std::unique_ptr<IndexedDatasetWriter>>& writers, Progress* progress,
                  PreprocessStats* stats, const PipelineTick* tick) {
  const std::size_t num_keys = options.reader.json_keys.size();
  stats->workers = setup.workers;
  Pipeline pipeline(static_cast<std::size_t>(2 * setup.workers + 2));
  ReaderTotals totals;
  ReadPosition position;
  std::uint64_t bytes_reported = 0;  // of the progress's bytes counter
  auto bytes_done_since_last = [&] {
    const std::uint64_t done = std::max(bytes_reported, position.raw_bytes_done(stats->text_bytes));
    return done - std::exchange(bytes_reported, done);
  };
  std::thread reader_thread([&] {
    try {
      read_batches(reader, num_keys, options.batch_bytes, pipeline, &position, &totals);
    } catch (...) {
      pipeline.abort(std::current_exception());
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < setup.workers; ++i) {
    try {
      workers.emplace_back([&] {
        try {
          tokenize_batches(setup.tokenizer, num_keys, setup.eod, reader, pipeline);
        } catch (...) {
          pipeline.abort(std::current_exception());
        }
      });
    } catch (const std::system_error& error) {
      // Out of threads (ulimit -u, memory): stop cleanly rather than with terminate().
      pipeline.abort(std::make_exception_ptr(Error(str_cat(
          "cannot start tokenizer thread ", i + 1, " of ", setup.workers, ": ", error.what(),
          "; use fewer `workers`"))));
      break;
    }
  }

  try {
    TokenBatch batch;
    auto next_tick = std::chrono::steady_clock::now() + (tick ? tick->interval : std::chrono::milliseconds(0));
    for (std::uint64_t sequence = 0;;) {
      auto deadline = tick ? next_tick : std::chrono::steady_clock::time_point::max();
      if (options.stop != nullptr) deadline = std::min(deadline, std::chrono::steady_clock::now() + kStopPoll);
      const Pipeline::Popped popped = pipeline.pop_result(sequence, &batch, deadline);
      if (options.stop != nullptr && options.stop->load()) {
        DUFU_FAIL("preprocess was stopped before its end; its outputs are not written");
      }
      if (tick && (popped == Pipeline::Popped::kAllDone || std::chrono::steady_clock::now() >= next_tick)) {
        tick->call();
        next_tick = std::chrono::steady_clock::now() + tick->interval;
      }
      if (popped == Pipeline::Popped::kAllDone) break;
      if (popped == Pipeline::Popped::kTimedOut) continue;
      ++sequence;
      std::uint64_t documents = 0, tokens = 0;
      for (std::size_t key = 0; key < num_keys; ++key) {
        const std::int32_t* next = batch.tokens[key].data();
        for (const std::uint64_t length : batch.lengths[key]) {
          if (length == 0) {
            ++stats->empty_skipped;
            continue;
          }
          writers[key]->add_document({next, static_cast<std::size_t>(length)});
          next += length;
          tokens += length;
          ++documents;
        }
      }
      stats->documents += documents;
      stats->tokens += tokens;
      stats->text_bytes += batch.text_bytes;
      static_assert(kBytesCounter == 0 && kDocumentsCounter == 1 && kTokensCounter == 2);
      if (progress) progress->add_each({bytes_done_since_last(), documents, tokens});
      pipeline.release_slot();
    }
  } catch (...) {
    pipeline.abort(std::current_exception());
  }
  reader_thread.join();
  for (auto& worker : workers) worker.join();
  if (auto error = pipeline.first_error()) std::rethrow_exception(error);
  if (progress) progress->add(kBytesCounter, bytes_done_since_last());  // input after the last document
  // Asked after the last batch, before any commit.
  if ((options.stop != nullptr && options.stop->load()) || (options.approve_commit && !options.approve_commit())) {
    DUFU_FAIL("preprocess was stopped before its end; its outputs are not written");
  }
  stats->records = totals.records;
  stats->input_bytes = totals.input_bytes;
  stats->bad_skipped = totals.bad_records;
  stats->first_errors = totals.first_errors;
}

PreprocessStats preprocess(const PreprocessOptions& options, Progress* progress) {
  const auto start = std::chrono::steady_clock::now();
  const PreprocessSetup setup = set_up_preprocess(options);
  PreprocessStats stats;
  stats.output_prefixes = setup.output_prefixes;
  stats.dtype = setup.dtype;

  DocumentReader reader(setup.inputs, options.reader);
  if (progress) progress->set_total(reader.total_input_bytes());
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const auto& prefix : stats.output_prefixes) {
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, output_layout(options), stats.dtype));
  }
  run_pipeline(options, setup, reader, writers, progress, &stats);
  for (std::size_t key = 0; key < writers.size(); ++key) {
    stats.output_bytes += writers[key]->commit();
    publish_shard_sidecar(stats.output_prefixes[key], preprocess_sidecar(options, setup, key));
  }
  if (progress) progress->finish();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace dufu::dataprep
