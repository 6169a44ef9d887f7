// What the translation units of the _dufu module share: the functions that bind each
// topic, and the numpy dtype of a shard's token type. The module is split by topic
// (datasets, samplers, loader, preprocess) to keep pybind11's compile time per file low.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "dufu/dataprep/dtype.h"
#include "dufu/dataprep/indexed_dataset.h"

namespace dufu::python {

namespace py = pybind11;

void bind_shards(py::module_& module);
void bind_datasets(py::module_& module);
void bind_samplers(py::module_& module);
void bind_loader(py::module_& module);
void bind_preprocess(py::module_& module);

// The IndexedDataset behind a dufu.IndexedDataset object (shards.cc).
std::shared_ptr<const dataprep::IndexedDataset> shard_dataset(const py::handle& shard);

// numpy's dtype for a shard dtype (all little-endian, as the .bin stores them).
py::dtype numpy_dtype(dataprep::DType dtype);

// Python's negative indexing and an IndexError (not dufu's message) past the end, so
// `for item in dataset` and dataset[-1] behave as for a list: any int (numpy's too),
// however large, is an index in or out of range; anything else a TypeError naming it.
std::uint64_t python_index(const py::handle& index, std::uint64_t size, const char* what);

// A count or position read from a Python value (a state_dict's entry, an epoch): a
// DufuError naming `what` and the value unless it is an int in [0, 2**64).
std::uint64_t python_count(const py::handle& value, const std::string& what);

// "mmap" | "lazy" | "cached" (dufu's own error for anything else).
dataprep::IndexImpl impl_from_name(const std::string& name);

}  // namespace dufu::python
