// HuggingFace's safetensors format, so dufu's checkpoints load in transformers and
// PyTorch (and theirs in dufu) without conversion. A file is an 8-byte little-endian
// header length N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
// padded with spaces to a multiple of 8, then the tensors' bytes back to back
// (offsets are relative to the end of the header). Files are written atomically and
// read through a mapping, so a tensor view costs no copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dufu/common/mapped_file.h"

namespace dufu::trainer::safetensors {

// In the reference implementation's order, which is also non-decreasing item size:
// writing tensors from the largest dtype down keeps every tensor aligned.
enum class Dtype : std::uint8_t {
  kBool, kU8, kI8, kF8_E5M2, kF8_E4M3, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64
};

std::string_view dtype_name(Dtype dtype);  // "F32", "BF16", "F8_E4M3", ...
std::size_t dtype_size(Dtype dtype);       // bytes per element
std::optional<Dtype> parse_dtype(std::string_view name);

// The dtype of the C++ types with an exact counterpart; F16, BF16, FP8 and BOOL have
// none and are reached through TensorView::bytes.
template <typename T>
constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<float>() { return Dtype::kF32; }
template <> constexpr Dtype dtype_of<double>() { return Dtype::kF64; }
template <> constexpr Dtype dtype_of<std::int8_t>() { return Dtype::kI8; }
template <> constexpr Dtype dtype_of<std::uint8_t>() { return Dtype::kU8; }
template <> constexpr Dtype dtype_of<std::int16_t>() { return Dtype::kI16; }
template <> constexpr Dtype dtype_of<std::uint16_t>() { return Dtype::kU16; }
template <> constexpr Dtype dtype_of<std::int32_t>() { return Dtype::kI32; }
template <> constexpr Dtype dtype_of<std::uint32_t>() { return Dtype::kU32; }
template <> constexpr Dtype dtype_of<std::int64_t>() { return Dtype::kI64; }
template <> constexpr Dtype dtype_of<std::uint64_t>() { return Dtype::kU64; }

using Metadata = std::map<std::string, std::string>;

// One tensor to write: `data` holds product(shape) × dtype_size(dtype) bytes, C order,
// little-endian. An empty shape is a scalar (one element).
struct TensorRef {
  std::string name;
  Dtype dtype;
  std::vector<std::uint64_t> shape;
  const void* data;
};

// Writes `tensors` and `metadata` (omitted from the header when empty) to `path`
// through an AtomicFile, byte for byte as the reference implementation would:
// tensors ordered by dtype (largest first) then name, compact JSON, header padded
// with spaces to a multiple of 8. Throws dufu::Error naming the path for a duplicate
// tensor name, the reserved name "__metadata__", a shape whose size overflows, or an
// IO failure; no file appears under `path` then.
void write(const std::string& path, std::span<const TensorRef> tensors, const Metadata& metadata = {});

// A tensor inside an open File: its bytes are in the file's mapping.
struct TensorView {
  std::string name;
  Dtype dtype;
  std::vector<std::uint64_t> shape;
  std::span<const std::byte> bytes;
  std::uint64_t element_count() const { return bytes.size() / dtype_size(dtype); }
};

class File {
 public:
  // Maps the file and checks it strictly: the header length is at least 2, at most
  // 100 MB and within the file; the header is a UTF-8 JSON object whose entries are
  // "__metadata__" (strings only) or tensors with exactly dtype, shape and
  // data_offsets; each tensor's size is product(shape) × dtype size; the tensors
  // cover the data section exactly, without gap or overlap. Throws dufu::Error
  // naming the file and what is wrong, e.g. a truncated or corrupt checkpoint.
  static File open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const Metadata& metadata() const { return metadata_; }
  // Sorted by name.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when there is no such tensor.
  const TensorView* find(std::string_view name) const;
  // Throws dufu::Error naming the file when there is no such tensor.
  const TensorView& tensor(std::string_view name) const;
  // The tensor's elements, zero-copy. Throws dufu::Error naming the file unless the
  // tensor exists, its dtype is dtype_of<T>() and its bytes are aligned for T (they
  // are in every file written by dufu or the reference implementation).
  template <typename T>
  std::span<const T> view(std::string_view name) const {
    const TensorView& tensor = checked_tensor(name, dtype_of<T>(), alignof(T));
    return {reinterpret_cast<const T*>(tensor.bytes.data()), tensor.bytes.size() / sizeof(T)};
  }

 private:
  File(MappedFile file, Metadata metadata, std::vector<TensorView> tensors);
  const TensorView& checked_tensor(std::string_view name, Dtype dtype, std::size_t alignment) const;

  MappedFile file_;
  Metadata metadata_;
  std::vector<TensorView> tensors_;
};

}  // namespace dufu::trainer::safetensors
