// dufu._Loader: the infinite prefetching loader (C++ worker threads fill a bounded
// queue). next() waits without the GIL, so Python threads (and the training step,
// when torch releases the GIL) run meanwhile. Each batch's token buffer is moved into
// the numpy array that Python owns: no copy, writable, never reused by the loader, so
// torch.from_numpy takes it as is. dufu.DataLoader (python/dufu/__init__.py) wraps it.
#include <pybind11/stl.h>

#include "bindings.h"
#include "interruptible.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/data_loader.h"
#include "samplers.h"

namespace dufu::python {
namespace {

using dataprep::InfiniteDataLoader;
using dataprep::LoaderState;

// A vector moved to the heap and owned by a capsule: the base of a numpy array.
template <typename T>
py::array_t<T> owned_array(std::vector<T>&& values, std::vector<py::ssize_t> shape) {
  auto* owner = new std::vector<T>(std::move(values));
  py::capsule base(owner, [](void* pointer) { delete static_cast<std::vector<T>*>(pointer); });
  return py::array_t<T>(std::move(shape), owner->data(), base);
}

py::dict state_dict(const LoaderState& state) {
  py::dict out;
  out["epoch"] = state.next.epoch;
  out["position"] = state.next.position;
  out["batches_served"] = state.batches_served;
  return out;
}

LoaderState state_from_dict(const py::dict& state) {
  for (const char* key : {"epoch", "position", "batches_served"}) {
    if (!state.contains(key)) DUFU_FAIL("loader state_dict has no '", key, "' (keys: epoch, position, batches_served)");
  }
  LoaderState out;
  out.next.epoch = python_count(state["epoch"], "loader state_dict['epoch']");
  out.next.position = python_count(state["position"], "loader state_dict['position']");
  out.batches_served = python_count(state["batches_served"], "loader state_dict['batches_served']");
  return out;
}

std::unique_ptr<InfiniteDataLoader> make_loader(std::shared_ptr<dataprep::TokenDataset> dataset,
                                                const SamplerRecipe& sampler, std::uint64_t micro_batch, int workers,
                                                int prefetch_batches, const std::optional<py::dict>& state,
                                                std::optional<std::int32_t> eod_id) {
  if (workers < 1) DUFU_FAIL("workers must be at least 1, got ", workers);
  if (prefetch_batches < 1) DUFU_FAIL("prefetch_batches must be at least 1, got ", prefetch_batches);
  LoaderState start;
  start.next.epoch = sampler.instance->epoch();  // a set_epoch() before the loader counts
  if (state) start = state_from_dict(*state);
  auto made = sampler.make();
  if (made->size() == 0) DUFU_FAIL("the sampler yields no index per epoch (", sampler.description, ")");
  const dataprep::LoaderOptions options{micro_batch, workers, prefetch_batches, eod_id};
  py::gil_scoped_release release;
  return std::make_unique<InfiniteDataLoader>(std::move(dataset), std::move(made), options, start);
}

// Waits in slices, with Python's signal handlers run between them: a Ctrl-C while
// the workers read raises KeyboardInterrupt at once and consumes no batch.
py::tuple next_batch(InfiniteDataLoader& loader) {
  std::optional<dataprep::Batch> ready;
  while (true) {
    {
      py::gil_scoped_release release;
      ready = loader.try_next(kSignalPoll);
    }
    if (ready) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  dataprep::Batch& batch = *ready;
  std::vector<std::int64_t> indices(batch.indices.begin(), batch.indices.end());
  const auto rows = static_cast<py::ssize_t>(batch.rows);
  const auto columns = static_cast<py::ssize_t>(batch.columns);
  py::object positions = py::none();
  py::object cu_seqlens = py::none();
  if (!batch.cu_seqlens.empty()) {
    const auto documents = static_cast<py::ssize_t>(batch.cu_seqlens.size());
    positions = owned_array(std::move(batch.position_ids), {rows, columns - 1});
    cu_seqlens = owned_array(std::move(batch.cu_seqlens), {documents});
  }
  return py::make_tuple(owned_array(std::move(batch.tokens), {rows, columns}), owned_array(std::move(indices), {rows}),
                        positions, cu_seqlens);
}

}  // namespace

void bind_loader(py::module_& module) {
  py::class_<InfiniteDataLoader>(module, "_Loader", "The C++ loader behind dufu.DataLoader.")
      .def(py::init(&make_loader), py::arg("dataset"), py::arg("sampler"), py::arg("micro_batch"),
           py::arg("workers") = 2, py::arg("prefetch_batches") = 4, py::arg("state") = py::none(),
           py::arg("eod_id") = py::none())
      .def("next", &next_batch,
           "(tokens [micro_batch, seq_length + 1] int32, dataset indices int64, position_ids [micro_batch, "
           "seq_length] int32 or None, cu_seqlens int32 or None): the last two with eod_id")
      .def("state_dict", [](const InfiniteDataLoader& loader) { return state_dict(loader.state()); })
      .def(
          "load_state_dict",
          [](InfiniteDataLoader& loader, const py::dict& state) {
            const LoaderState restored = state_from_dict(state);
            py::gil_scoped_release release;
            loader.restore(restored);
          },
          py::arg("state"));
}

}  // namespace dufu::python
