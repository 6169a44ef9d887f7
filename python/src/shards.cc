// dufu.IndexedDataset: a shard (.bin + .idx) whose items are numpy arrays of the
// stored dtype. With impl "mmap" an item is a read-only view into a mapping of the
// .bin, with no copy; the view's base object holds the mapping, so items stay valid
// after the dataset is gone. "lazy" and "cached" items, and those of fairseq's TNTIDX
// (which stores id + 1, undone here), are fresh arrays.
//
// The view needs the mapping's address, which IndexedDataset does not expose; the
// binding maps the .bin a second time (read-only, the same page-cache pages) instead
// of reaching into the library.
#include <pybind11/stl.h>
#include <sys/stat.h>

#include <cerrno>
#include <optional>
#include <vector>

#include "bindings.h"
#include "dufu/common/error.h"
#include "dufu/common/mapped_file.h"

namespace dufu::python {
namespace {

using dataprep::IndexedDataset;

struct Shard {
  std::shared_ptr<const IndexedDataset> dataset;
  // The .bin mapped for zero-copy items; null when items are copies.
  std::shared_ptr<const MappedFile> bin;
};

std::shared_ptr<Shard> open_shard(const std::string& prefix, const std::string& impl_name) {
  const dataprep::IndexImpl impl = impl_from_name(impl_name);
  auto shard = std::make_shared<Shard>();
  {
    py::gil_scoped_release release;
    shard->dataset = IndexedDataset::open(prefix, impl);
    const bool ids_as_stored = dataprep::stored_id_offset(shard->dataset->index().layout()) == 0;
    if (impl == dataprep::IndexImpl::kMmap && ids_as_stored) {
      auto bin = std::make_shared<MappedFile>(MappedFile::open(dataprep::bin_path(prefix), /*keep_descriptor=*/true));
      if (bin->size() != shard->dataset->bin_size()) {
        DUFU_FAIL("'", dataprep::bin_path(prefix), "' changed size while being opened (", shard->dataset->bin_size(),
                  " then ", bin->size(), " bytes)");
      }
      shard->bin = std::move(bin);
    }
  }
  return shard;
}

// A view is handed out only while the .bin still has every byte it had when opened
// (as the library checks each read): numpy would read a truncated mapping with SIGBUS.
// A view already held when the file shrinks is beyond reach (docs/python.md).
void check_not_truncated(const MappedFile& bin) {
  struct stat st {};
  if (::fstat(bin.descriptor(), &st) != 0) DUFU_FAIL("cannot stat '", bin.path(), "': ", errno_message(errno));
  if (static_cast<std::uint64_t>(st.st_size) < bin.size()) {
    DUFU_FAIL("'", bin.path(), "' was truncated while open: it has ", st.st_size, " bytes, ", bin.size(),
              " when the dataset opened it; HINT: a shard must not be rewritten in place while it is read ",
              "(dufu's own tools replace files by renaming)");
  }
}

// A read-only numpy array over `count` items at `data`, owned by (a reference to) the
// mapping.
py::array mapped_view(const std::shared_ptr<const MappedFile>& bin, const py::dtype& dtype, const std::byte* data,
                      std::uint64_t count) {
  auto* owner = new std::shared_ptr<const MappedFile>(bin);
  py::capsule base(owner, [](void* pointer) { delete static_cast<std::shared_ptr<const MappedFile>*>(pointer); });
  py::array view(dtype, {static_cast<py::ssize_t>(count)}, {static_cast<py::ssize_t>(dtype.itemsize())}, data, base);
  py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return view;
}

// Tokens [offset, offset + length) of sequence `sequence` (Megatron's get()).
py::array read_item(const Shard& shard, std::uint64_t sequence, std::uint64_t offset,
                    std::optional<std::uint64_t> length) {
  const IndexedDataset& dataset = *shard.dataset;
  const std::uint64_t sequence_length = dataset.sequence_length(sequence);
  const std::uint64_t count = length.value_or(offset <= sequence_length ? sequence_length - offset : 0);
  if (offset > sequence_length || count > sequence_length - offset) {
    DUFU_FAIL("'", dataset.prefix(), "': tokens [", offset, ", ", offset + count, ") of sequence ", sequence,
              " are out of range (it has ", sequence_length, " tokens)");
  }
  const py::dtype dtype = numpy_dtype(dataset.dtype());
  const std::uint64_t item_size = dataprep::dtype_size(dataset.dtype());
  const std::uint64_t byte_offset = (dataset.index().sequence_offset(sequence) + offset) * item_size;
  if (shard.bin) {
    check_not_truncated(*shard.bin);
    return mapped_view(shard.bin, dtype, shard.bin->data() + byte_offset, count);
  }
  if (dataprep::stored_id_offset(dataset.index().layout()) != 0) {
    // read_tokens undoes the stored id + 1; the result is given back in the shard's dtype.
    py::array_t<std::int32_t> tokens(static_cast<py::ssize_t>(count));
    {
      py::gil_scoped_release release;
      dataset.read_tokens(sequence, offset, count, tokens.mutable_data());
    }
    return tokens.attr("astype")(dtype);
  }
  py::array out(dtype, std::vector<py::ssize_t>{static_cast<py::ssize_t>(count)});
  {
    py::gil_scoped_release release;
    dataset.read_bytes(byte_offset, count * item_size, static_cast<std::byte*>(out.mutable_data()));
  }
  return out;
}

py::array_t<std::int64_t> sequence_lengths(const Shard& shard) {
  const auto& index = shard.dataset->index();
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(index.num_sequences()));
  auto* data = out.mutable_data();
  for (std::uint64_t i = 0; i < index.num_sequences(); ++i)
    data[i] = static_cast<std::int64_t>(index.sequence_length(i));
  return out;
}

py::array_t<std::int64_t> document_indices(const Shard& shard) {
  const auto& index = shard.dataset->index();
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(index.num_document_entries()));
  auto* data = out.mutable_data();
  for (std::uint64_t i = 0; i < index.num_document_entries(); ++i) {
    data[i] = static_cast<std::int64_t>(index.document_index(i));
  }
  return out;
}

}  // namespace

// For datasets.cc: the IndexedDataset behind a Python shard object.
std::shared_ptr<const IndexedDataset> shard_dataset(const py::handle& shard) {
  return shard.cast<const Shard&>().dataset;
}

void bind_shards(py::module_& module) {
  py::class_<Shard, std::shared_ptr<Shard>>(module, "IndexedDataset", R"doc(
A tokenized shard: PREFIX.bin and PREFIX.idx in Megatron's or fairseq's layouts.

impl decides how tokens are read: "mmap" (items are read-only numpy views into the
mapped .bin, no copy), "lazy" (pread per item) or "cached" (the whole .bin read into
memory once). dataset[i] is sequence i in the shard's dtype; len(dataset) is the
number of sequences.)doc")
      .def(py::init(&open_shard), py::arg("prefix"), py::arg("impl") = "mmap",
           "Opens PREFIX.bin/.idx; raises DufuError naming the file if either is missing or corrupt.")
      .def("__len__", [](const Shard& shard) { return shard.dataset->num_sequences(); })
      .def(
          "__getitem__",
          [](const Shard& shard, const py::object& index) {
            return read_item(shard, python_index(index, shard.dataset->num_sequences(), "sequence"), 0, std::nullopt);
          },
          py::arg("index"), "Sequence `index` (negative counts from the end) as a numpy array.")
      .def(
          "get",
          [](const Shard& shard, const py::object& index, std::uint64_t offset, std::optional<std::uint64_t> length) {
            return read_item(shard, python_index(index, shard.dataset->num_sequences(), "sequence"), offset, length);
          },
          py::arg("index"), py::arg("offset") = 0, py::arg("length") = py::none(),
          "Tokens [offset, offset + length) of sequence `index` (Megatron's get); length None: to its end.")
      .def_property_readonly("sequence_lengths", &sequence_lengths, "Tokens of every sequence (int64; a copy).")
      .def_property_readonly("document_indices", &document_indices,
                             "The .idx document index: documents + 1 sequence numbers (int64; a copy).")
      .def_property_readonly("num_sequences", [](const Shard& shard) { return shard.dataset->num_sequences(); })
      .def_property_readonly("num_documents", [](const Shard& shard) { return shard.dataset->num_documents(); })
      .def_property_readonly("total_tokens", [](const Shard& shard) { return shard.dataset->index().total_tokens(); })
      .def_property_readonly(
          "dtype", [](const Shard& shard) { return numpy_dtype(shard.dataset->dtype()); },
          "numpy dtype of the stored tokens.")
      .def_property_readonly("impl", [](const Shard& shard) { return std::string(impl_name(shard.dataset->impl())); })
      .def_property_readonly(
          "layout", [](const Shard& shard) { return std::string(layout_name(shard.dataset->index().layout())); },
          "The .idx layout read (MMIDIDX, TNTIDX, ...).")
      .def_property_readonly("prefix", [](const Shard& shard) { return shard.dataset->prefix(); })
      .def_property_readonly(
          "bin_buffer",
          [](const Shard& shard) -> py::object {
            if (!shard.bin) return py::none();
            check_not_truncated(*shard.bin);
            return mapped_view(shard.bin, py::dtype("u1"), shard.bin->data(), shard.bin->size());
          },
          "The mapped .bin as a read-only uint8 array (impl mmap), which the items view; else None.")
      .def("__repr__", [](const Shard& shard) {
        return str_cat("IndexedDataset('", shard.dataset->prefix(), "', impl='", impl_name(shard.dataset->impl()),
                       "', sequences=", shard.dataset->num_sequences(), ")");
      });
}

}  // namespace dufu::python
