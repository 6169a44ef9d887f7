// dufu.preprocess: `dataprep preprocess` from Python, with the tool's options. The job
// runs on its own thread without the GIL (interruptible.h: Ctrl-C and a failing
// callback stop it at the next batch); progress goes to the terminal (the tool's bar
// or lines on stderr), nowhere, or to a Python callable that the calling thread
// invokes about every `progress_interval` seconds with the counters so far, and once
// more with the final ones before the run commits anything (CommitGate), so that an
// exception from any call leaves the previous output as it was.
#include "dufu/dataprep/preprocess.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "bindings.h"
#include "interruptible.h"
#include "dufu/common/error.h"
#include "dufu/common/progress.h"
#include "dufu/dataprep/preprocess_part.h"

namespace dufu::python {
namespace {

using dataprep::PreprocessOptions;
using dataprep::PreprocessStats;

py::dict stats_dict(const PreprocessStats& stats) {
  py::dict out;
  out["documents"] = stats.documents;
  out["records"] = stats.records;
  out["empty_skipped"] = stats.empty_skipped;
  out["bad_skipped"] = stats.bad_skipped;
  out["first_errors"] = stats.first_errors;
  out["tokens"] = stats.tokens;
  out["input_bytes"] = stats.input_bytes;
  out["text_bytes"] = stats.text_bytes;
  out["output_bytes"] = stats.output_bytes;
  out["seconds"] = stats.seconds;
  out["workers"] = stats.workers;
  out["dtype"] = std::string(dataprep::dtype_name(stats.dtype));
  out["output_prefixes"] = stats.output_prefixes;
  return out;
}

py::dict progress_dict(const Progress& progress) {
  py::dict out;
  out["input_bytes"] = progress.value(0);
  out["documents"] = progress.value(1);
  out["tokens"] = progress.value(2);
  out["seconds"] = progress.elapsed_seconds();
  return out;
}

// The run's approval to commit, which the calling thread gives: the run waits in
// wait_for_approval() until the calling thread has made the last progress call (which
// may raise) and answered. It also looks at `stop` while it waits, so a Ctrl-C, after
// which the calling thread only waits for the run, cannot leave it waiting.
class CommitGate {
 public:
  explicit CommitGate(const std::atomic<bool>& stop) : stop_(stop) {}

  bool wait_for_approval() {
    std::unique_lock lock(mutex_);
    state_ = State::kAsked;
    while (state_ == State::kAsked) {
      if (stop_.load()) return false;
      answered_.wait_for(lock, kSignalPoll);
    }
    return state_ == State::kApproved;
  }
  bool asked() {
    const std::lock_guard lock(mutex_);
    return state_ == State::kAsked;
  }
  void answer(bool approved) {
    {
      const std::lock_guard lock(mutex_);
      state_ = approved ? State::kApproved : State::kRefused;
    }
    answered_.notify_all();
  }

 private:
  enum class State { kRunning, kAsked, kApproved, kRefused };
  const std::atomic<bool>& stop_;
  std::mutex mutex_;
  std::condition_variable answered_;
  State state_ = State::kRunning;
};

PreprocessStats run(const PreprocessOptions& options, const std::optional<std::string>& shard, Progress* progress) {
  if (shard) return dataprep::preprocess_part(options, dataprep::parse_shard(*shard), progress);
  return dataprep::preprocess(options, progress);
}

py::dict preprocess(std::vector<std::string> inputs, std::string output_prefix, std::string tokenizer_model,
                    std::string tokenizer_merges, std::string tokenizer_pattern, std::vector<std::string> json_keys,
                    const std::string& impl, const std::string& layout, bool append_eod, std::optional<int> eod_id,
                    std::optional<std::string> dtype, int workers, std::size_t batch_bytes,
                    std::size_t max_document_bytes, const std::string& on_error, const std::string& txt_document,
                    const std::string& stdin_format, std::optional<std::string> shard, const py::object& progress,
                    double progress_interval) {
  PreprocessOptions options;
  options.inputs = std::move(inputs);
  options.output_prefix = std::move(output_prefix);
  options.tokenizer = dataprep::TokenizerSpec{
      .model = std::move(tokenizer_model), .merges = std::move(tokenizer_merges), .pattern = std::move(tokenizer_pattern)};
  options.reader.json_keys = std::move(json_keys);
  options.reader.max_document_bytes = max_document_bytes;
  options.impl = impl_from_name(impl);
  options.layout = dataprep::parse_layout_family(layout);
  options.append_eod = append_eod;
  options.eod_id = eod_id;
  if (dtype) options.dtype = dataprep::parse_dtype(*dtype);
  options.workers = workers;
  options.batch_bytes = batch_bytes;
  // The tool's flags accept exactly these names.
  if (on_error != "fail" && on_error != "skip") DUFU_FAIL("on_error must be 'fail' or 'skip', got '", on_error, "'");
  options.reader.skip_bad_records = on_error == "skip";
  if (txt_document != "line" && txt_document != "file") {
    DUFU_FAIL("txt_document must be 'line' or 'file', got '", txt_document, "'");
  }
  options.reader.txt_document = txt_document == "file" ? dataprep::TxtDocument::kFile : dataprep::TxtDocument::kLine;
  if (stdin_format != "jsonl" && stdin_format != "txt") {
    DUFU_FAIL("stdin_format must be 'jsonl' or 'txt', got '", stdin_format, "'");
  }
  options.reader.stdin_format = stdin_format == "txt" ? dataprep::InputFormat::kTxt : dataprep::InputFormat::kJsonl;

  const bool callback = PyCallable_Check(progress.ptr()) != 0;
  const bool terminal = !callback && progress.is(py::bool_(true));
  if (!callback && !terminal && !progress.is_none() && !progress.is(py::bool_(false))) {
    throw py::type_error("progress must be True (terminal), False or None (quiet) or a callable taking a dict");
  }
  Progress meter("preprocess", {{"MB", 1e6}, {"docs", 1}, {"tokens", 1}}, ProgressOptions{.quiet = !terminal});
  std::atomic<bool> stop{false};
  options.stop = &stop;
  CommitGate gate(stop);
  if (callback) options.approve_commit = [&gate] { return gate.wait_for_approval(); };
  const auto interval = std::chrono::duration<double>(std::max(progress_interval, 0.01));
  auto next_call = std::chrono::steady_clock::now() + interval;
  const std::function<void()> call_back = [&] {
    if (!callback) return;
    if (gate.asked()) {  // the last call, with the final counters, before the commit
      try {
        progress(progress_dict(meter));
      } catch (...) {
        gate.answer(false);
        throw;
      }
      gate.answer(true);
      return;
    }
    if (std::chrono::steady_clock::now() < next_call) return;
    progress(progress_dict(meter));
    next_call = std::chrono::steady_clock::now() + interval;
  };
  // A Ctrl-C or an exception from the callback stops the job at its next batch or at
  // its commit; the previous output, if any, stays as it was.
  const PreprocessStats stats =
      run_interruptibly(stop, [&options, &shard, &meter] { return run(options, shard, &meter); }, call_back);
  meter.finish();
  return stats_dict(stats);
}

}  // namespace

void bind_preprocess(py::module_& module) {
  module.def("preprocess", &preprocess, py::arg("inputs"), py::arg("output_prefix"), py::arg("tokenizer_model"),
             py::kw_only(), py::arg("tokenizer_merges") = "", py::arg("tokenizer_pattern") = "",
             py::arg("json_keys") = std::vector<std::string>{"text"}, py::arg("impl") = "mmap",
             py::arg("layout") = "megatron", py::arg("append_eod") = false, py::arg("eod_id") = py::none(),
             py::arg("dtype") = py::none(), py::arg("workers") = 0, py::arg("batch_bytes") = std::size_t{1} << 20,
             py::arg("max_document_bytes") = dataprep::kDefaultMaxDocumentBytes, py::arg("on_error") = "fail",
             py::arg("txt_document") = "line", py::arg("stdin_format") = "jsonl", py::arg("shard") = py::none(),
             py::arg("progress") = false, py::arg("progress_interval") = 0.5);
}

}  // namespace dufu::python
