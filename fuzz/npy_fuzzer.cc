// The .npy reader (dataprep's index caches, numpy's own files): the header's Python
// dict literal, versions 1.0 and 2.0, shapes, dtypes and the data size. An array that
// opens must have its data inside the file, typed views only for its own dtype, and
// write back through write_npy into a file that opens to the same array.
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dufu/common/npy.h"
#include "fuzz_input.h"

namespace {

using dufu::NpyArray;
using dufu::fuzz::fuzz_require;
using dufu::fuzz::refused_cleanly_or_parsed;

// The array's bytes through the view of its own type; every other type is refused.
template <typename T>
void take_bytes(const NpyArray& array, std::vector<std::byte>* bytes, bool* matched) {
  std::span<const T> view;
  const bool viewed = refused_cleanly_or_parsed([&] { view = array.template view<T>(); });
  fuzz_require(viewed == (array.descr() == dufu::npy_descr<T>()), "a view of another dtype was given");
  if (!viewed) return;
  *matched = true;
  fuzz_require(view.size() == array.size(), "the view's size is not the shape's");
  fuzz_require(reinterpret_cast<std::uintptr_t>(view.data()) % alignof(T) == 0, "the view is not aligned");
  bytes->resize(view.size_bytes());
  if (!view.empty()) std::memcpy(bytes->data(), view.data(), view.size_bytes());
}

std::vector<std::byte> array_bytes(const NpyArray& array) {
  std::vector<std::byte> bytes;
  bool matched = false;
  take_bytes<std::int8_t>(array, &bytes, &matched);
  take_bytes<std::uint8_t>(array, &bytes, &matched);
  take_bytes<std::int16_t>(array, &bytes, &matched);
  take_bytes<std::uint16_t>(array, &bytes, &matched);
  take_bytes<std::int32_t>(array, &bytes, &matched);
  take_bytes<std::uint32_t>(array, &bytes, &matched);
  take_bytes<std::int64_t>(array, &bytes, &matched);
  take_bytes<std::uint64_t>(array, &bytes, &matched);
  take_bytes<float>(array, &bytes, &matched);
  take_bytes<double>(array, &bytes, &matched);
  fuzz_require(matched, "an array opened with a dtype no view takes");
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  const std::string path = write_input("index.npy", data, size);
  std::optional<NpyArray> array;
  if (!refused_cleanly_or_parsed([&] { array.emplace(NpyArray::open(path)); })) return 0;
  fuzz_require(array->item_size() > 0, "an array opened with an unknown dtype");
  fuzz_require(array->size() * array->item_size() <= size, "the data is larger than the file");
  const std::vector<std::byte> bytes = array_bytes(*array);

  const std::string copy_path = scratch_dir() + "/copy.npy";
  dufu::write_npy(copy_path, array->descr(), array->shape(), bytes.data(), array->item_size());
  const NpyArray copy = NpyArray::open(copy_path);
  fuzz_require(copy.descr() == array->descr() && copy.shape() == array->shape(), "the copy has another header");
  fuzz_require(array_bytes(copy) == bytes, "the copy holds other data");
  return 0;
}
