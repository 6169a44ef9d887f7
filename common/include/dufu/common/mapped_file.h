// A read-only memory mapping of a whole file (Boost.Interprocess). Empty files map
// to an empty span instead of failing, since empty shards are legal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace dufu {

class MappedFile {
 public:
  // Throws dufu::Error naming the path if the file cannot be opened or mapped. With
  // `keep_descriptor` the file stays open for descriptor() (one descriptor each).
  static MappedFile open(const std::string& path, bool keep_descriptor = false);

  MappedFile(MappedFile&&) noexcept;
  MappedFile& operator=(MappedFile&&) noexcept;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<std::size_t>(size_)}; }
  const std::string& path() const { return path_; }
  // The mapped file's descriptor, when opened with keep_descriptor (else -1): fstat on
  // it tells whether the file shrank under the mapping, where reading raises SIGBUS.
  int descriptor() const;

 private:
  struct Mapping;
  MappedFile(std::string path, std::unique_ptr<Mapping> mapping, const std::byte* data,
             std::uint64_t size);

  std::string path_;
  std::unique_ptr<Mapping> mapping_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace dufu
