// dufu's samplers in Python. A C++ sampler is owned by whoever walks it (a loader,
// or the distributed proxy wrapping it), so a Python Sampler keeps the recipe that
// makes it: passing one to DataLoader or DistributedProxySampler builds a fresh C++
// sampler from the recipe, and the Python object's own instance (for len, at,
// set_epoch and iteration) is never shared with a loader's threads.
#include "samplers.h"

#include <pybind11/stl.h>

#include "bindings.h"
#include "dufu/common/error.h"

namespace dufu::python {
namespace {

using dataprep::Sampler;

std::shared_ptr<SamplerRecipe> recipe(std::function<std::unique_ptr<Sampler>()> make, std::string description) {
  auto result = std::make_shared<SamplerRecipe>();
  result->make = std::move(make);
  result->description = std::move(description);
  result->instance = result->make();
  return result;
}

}  // namespace

void bind_samplers(py::module_& module) {
  py::class_<SamplerRecipe, std::shared_ptr<SamplerRecipe>>(module, "Sampler", R"doc(
Which dataset indices a rank reads, epoch by epoch; random access within an epoch.
Iterating yields the current epoch's indices; set_epoch(e) picks epoch e's order.)doc")
      .def(
          "__len__", [](const SamplerRecipe& self) { return self.instance->size(); }, "Indices per epoch.")
      .def(
          "set_epoch",
          [](SamplerRecipe& self, const py::object& epoch) { self.instance->set_epoch(python_count(epoch, "epoch")); },
          py::arg("epoch"))
      .def_property_readonly("epoch", [](const SamplerRecipe& self) { return self.instance->epoch(); })
      .def(
          "at",
          [](const SamplerRecipe& self, const py::object& position) {
            return self.instance->at(python_index(position, self.instance->size(), "sampler position"));
          },
          py::arg("position"), "The dataset index at `position` of the current epoch.")
      .def("__iter__",
           [](const SamplerRecipe& self) {
             py::array_t<std::uint64_t> order(static_cast<py::ssize_t>(self.instance->size()));
             std::uint64_t* data = order.mutable_data();
             for (std::uint64_t i = 0; i < self.instance->size(); ++i) data[i] = self.instance->at(i);
             return py::iter(order.attr("tolist")());
           })
      .def("__repr__", [](const SamplerRecipe& self) { return self.description; });

  module.def(
      "SequentialSampler",
      [](std::uint64_t dataset_size) {
        return recipe([=] { return dataprep::make_sequential_sampler(dataset_size); },
                      str_cat("SequentialSampler(", dataset_size, ")"));
      },
      py::arg("dataset_size"), "0, 1, ..., n-1 every epoch.");
  module.def(
      "RandomSampler",
      [](std::uint64_t dataset_size, std::uint32_t seed) {
        return recipe([=] { return dataprep::make_random_sampler(dataset_size, seed); },
                      str_cat("RandomSampler(", dataset_size, ", seed=", seed, ")"));
      },
      py::arg("dataset_size"), py::arg("seed") = 0,
      "A permutation per epoch: numpy.random.RandomState(seed + epoch).permutation(n).");
  module.def(
      "MegatronPretrainingSampler",
      [](std::uint64_t dataset_size, std::uint64_t micro_batch, std::uint64_t data_parallel_rank,
         std::uint64_t data_parallel_size) {
        auto made = recipe(
            [=] {
              return dataprep::make_megatron_pretraining_sampler(dataset_size, micro_batch, data_parallel_rank,
                                                                 data_parallel_size);
            },
            str_cat("MegatronPretrainingSampler(", dataset_size, ", micro_batch=", micro_batch,
                    ", rank=", data_parallel_rank, " of ", data_parallel_size, ")"));
        return made;
      },
      py::arg("dataset_size"), py::arg("micro_batch"), py::arg("data_parallel_rank"), py::arg("data_parallel_size"),
      R"doc(Megatron's pretraining sampler: global batches of micro_batch x data_parallel_size
consecutive indices, rank r taking the r-th micro_batch slice of each.)doc");
  module.def(
      "DistributedProxySampler",
      [](const SamplerRecipe& inner, std::uint64_t num_replicas, std::uint64_t rank, bool shuffle, std::uint32_t seed,
         bool drop_last) {
        const dataprep::DistributedOptions options{num_replicas, rank, shuffle, seed, drop_last};
        auto make_inner = inner.make;
        return recipe([=] { return dataprep::make_distributed_proxy_sampler(make_inner(), options); },
                      str_cat("DistributedProxySampler(", inner.description, ", rank=", rank, " of ", num_replicas,
                              ", shuffle=", shuffle ? "True" : "False", ", seed=", seed,
                              ", drop_last=", drop_last ? "True" : "False", ")"));
      },
      py::arg("sampler"), py::arg("num_replicas"), py::arg("rank"), py::arg("shuffle") = true, py::arg("seed") = 0,
      py::arg("drop_last") = false, R"doc(OSLO's DistributedProxySampler: torch's DistributedSampler
over the positions of `sampler`; call set_epoch(e) as with torch's.)doc");
}

}  // namespace dufu::python
