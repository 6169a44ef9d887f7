// The _dufu extension module: dufu's errors as one Python exception type, then the
// bindings of each topic. The Python package (python/dufu) re-exports everything.
#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "bindings.h"
#include "dufu/common/error.h"

namespace dufu::python {

py::dtype numpy_dtype(dataprep::DType dtype) {
  switch (dtype) {
    case dataprep::DType::kUInt8:
      return py::dtype("<u1");
    case dataprep::DType::kInt8:
      return py::dtype("<i1");
    case dataprep::DType::kInt16:
      return py::dtype("<i2");
    case dataprep::DType::kInt32:
      return py::dtype("<i4");
    case dataprep::DType::kInt64:
      return py::dtype("<i8");
    case dataprep::DType::kFloat64:
      return py::dtype("<f8");
    case dataprep::DType::kFloat32:
      return py::dtype("<f4");
    case dataprep::DType::kUInt16:
      return py::dtype("<u2");
    case dataprep::DType::kUInt32:
      return py::dtype("<u4");
    case dataprep::DType::kUInt64:
      return py::dtype("<u8");
  }
  DUFU_FAIL("unknown token dtype code ", static_cast<int>(dtype));
}

namespace {

std::string type_name_of(const py::handle& value) { return py::str(py::type::handle_of(value).attr("__name__")); }

}  // namespace

std::uint64_t python_index(const py::handle& index, std::uint64_t size, const char* what) {
  if (!PyIndex_Check(index.ptr())) {
    throw py::type_error(str_cat(what, " indices must be integers, not ", type_name_of(index)));
  }
  const py::int_ integer = py::reinterpret_steal<py::int_>(PyNumber_Index(index.ptr()));
  if (!integer) throw py::error_already_set();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(integer.ptr(), &overflow);
  if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
  const std::int64_t signed_size = static_cast<std::int64_t>(size);
  const std::int64_t resolved = value < 0 ? value + signed_size : value;
  if (overflow != 0 || resolved < 0 || resolved >= signed_size) {
    throw py::index_error(str_cat(what, " index ", std::string(py::repr(integer)), " is out of range (", size,
                                  " items)"));
  }
  return static_cast<std::uint64_t>(resolved);
}

std::uint64_t python_count(const py::handle& value, const std::string& what) {
  // bool is an int to Python, but True as an epoch is a mistake.
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    DUFU_FAIL(what, " must be a non-negative integer, not ", type_name_of(value), " (",
              std::string(py::repr(value)), ")");
  }
  const py::int_ integer = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (!integer) throw py::error_already_set();
  const unsigned long long result = PyLong_AsUnsignedLongLong(integer.ptr());
  if (result == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    DUFU_FAIL(what, " must be an integer from 0 to 2**64 - 1, got ", std::string(py::repr(integer)));
  }
  return result;
}

dataprep::IndexImpl impl_from_name(const std::string& name) { return dataprep::parse_impl(name); }

}  // namespace dufu::python

PYBIND11_MODULE(_dufu, module) {
  namespace py = pybind11;
  module.doc() = "dufu's datasets, blends, samplers, loader and preprocess (C++ bindings; import dufu instead)";
  // Every dufu::Error (bad input, IO) arrives in Python as dufu.DufuError carrying
  // dufu's one-line message; it derives from RuntimeError.
  py::register_exception<dufu::Error>(module, "DufuError", PyExc_RuntimeError);
  // A dufu::InternalError (a failed DUFU_CHECK: a bug in dufu, not bad input) is not a
  // DufuError, so code catching bad input does not swallow it: a plain RuntimeError
  // whose message starts "internal error: " and says to report it.
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const dufu::InternalError& bug) {
      PyErr_SetString(PyExc_RuntimeError, (std::string("internal error: ") + bug.what()).c_str());
    }
  });
  dufu::python::bind_shards(module);
  dufu::python::bind_datasets(module);
  dufu::python::bind_samplers(module);
  dufu::python::bind_loader(module);
  dufu::python::bind_preprocess(module);
}
