// The .npy format (version 1.0): what Megatron-LM caches its indices in, so dufu's
// caches can be read by numpy and the other way round. Arrays are C-ordered,
// little-endian, at most 2-D.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dufu/common/mapped_file.h"

namespace dufu {

// numpy descr strings: "<i4", "<i8", "<u4", "<u2", "<i2", "<f4", "<f8", "|u1", "|i1".
template <typename T>
constexpr const char* npy_descr();
template <> constexpr const char* npy_descr<std::int16_t>() { return "<i2"; }
template <> constexpr const char* npy_descr<std::uint16_t>() { return "<u2"; }
template <> constexpr const char* npy_descr<std::int32_t>() { return "<i4"; }
template <> constexpr const char* npy_descr<std::uint32_t>() { return "<u4"; }
template <> constexpr const char* npy_descr<std::int64_t>() { return "<i8"; }
template <> constexpr const char* npy_descr<std::uint64_t>() { return "<u8"; }
template <> constexpr const char* npy_descr<float>() { return "<f4"; }
template <> constexpr const char* npy_descr<double>() { return "<f8"; }
template <> constexpr const char* npy_descr<std::uint8_t>() { return "|u1"; }
template <> constexpr const char* npy_descr<std::int8_t>() { return "|i1"; }

// Item size in bytes of a supported descr, 0 for any other.
std::size_t npy_item_size(std::string_view descr);

namespace detail {
// Throws dufu::Error naming `path` unless `shape` holds exactly `count` items.
void check_npy_shape(const std::string& path, std::span<const std::uint64_t> shape, std::uint64_t count);
}  // namespace detail

// Writes an .npy v1.0 file atomically (AtomicFile), byte for byte as numpy.save
// (numpy >= 1.23 header padding) would. `shape` is {n} or {rows, cols} (or {} for a
// 0-d array) and its product must equal data.size(). Throws dufu::Error naming the
// path for an unsupported descr, an item size that does not match it, a shape of
// more than 2 dimensions, or an IO failure.
void write_npy(const std::string& path, const std::string& descr, std::span<const std::uint64_t> shape,
               const void* data, std::size_t item_size);
template <typename T>
void write_npy(const std::string& path, std::span<const T> data, std::vector<std::uint64_t> shape = {}) {
  if (shape.empty()) shape = {data.size()};
  detail::check_npy_shape(path, shape, data.size());
  write_npy(path, npy_descr<T>(), shape, data.data(), sizeof(T));
}

// A mapped .npy file: header parsed and checked (version 1.0 or 2.0, C order,
// descr, data size matching the shape), data served zero-copy from the mapping.
class NpyArray {
 public:
  // Throws dufu::Error naming the file on any mismatch.
  static NpyArray open(const std::string& path);

  const std::string& descr() const { return descr_; }
  const std::vector<std::uint64_t>& shape() const { return shape_; }
  std::uint64_t size() const;  // product of the shape
  std::size_t item_size() const { return npy_item_size(descr_); }
  const std::string& path() const { return file_.path(); }
  // Typed view; throws unless `T` matches descr(). The data offset is 64-byte
  // aligned in files dufu writes and numpy writes, so the view is aligned.
  template <typename T>
  std::span<const T> view() const {
    check_descr(npy_descr<T>());
    return {reinterpret_cast<const T*>(file_.data() + data_offset_), static_cast<std::size_t>(size())};
  }

 private:
  NpyArray(MappedFile file, std::string descr, std::vector<std::uint64_t> shape, std::uint64_t data_offset);
  void check_descr(const char* expected) const;

  MappedFile file_;
  std::string descr_;
  std::vector<std::uint64_t> shape_;
  std::uint64_t data_offset_ = 0;
};

}  // namespace dufu
