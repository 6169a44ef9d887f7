// MappedFile: read-only whole-file mappings through Boost.Interprocess, with errors
// that name the file, and empty files served as an empty span.
#include "dufu/common/mapped_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/file_mapping.hpp>
#include <boost/interprocess/mapped_region.hpp>

#include "dufu/common/error.h"

namespace dufu {

namespace bip = boost::interprocess;

struct MappedFile::Mapping {
  // The region keeps the pages mapped on its own; the file_mapping (and its
  // descriptor) is kept only when asked for (descriptor()).
  bip::file_mapping file;
  bip::mapped_region region;
};

namespace {

// Boost's messages do not name the file, and its native error is the errno we want.
std::string describe(const bip::interprocess_exception& e) {
  const int native = e.get_native_error();
  return native != 0 ? errno_message(native) : std::string(e.what());
}

}  // namespace

MappedFile MappedFile::open(const std::string& path, bool keep_descriptor) {
  // stat first: Boost would report a missing file or a directory less clearly, and
  // the size decides whether there is anything to map at all.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    DUFU_FAIL("cannot open '", path, "': ", errno_message(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    DUFU_FAIL("cannot open '", path, "': ", errno_message(EISDIR));
  }
  if (!S_ISREG(st.st_mode)) {
    DUFU_FAIL("cannot map '", path, "': not a regular file");
  }

  bip::file_mapping file;
  try {
    // Opened even when empty, so an unreadable empty file still fails here.
    file = bip::file_mapping(path.c_str(), bip::read_only);
  } catch (const bip::interprocess_exception& e) {
    DUFU_FAIL("cannot open '", path, "': ", describe(e));
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->file = std::move(file);
  if (st.st_size == 0) {
    // Boost refuses to map zero bytes, and empty shards are legal.
    if (!keep_descriptor) mapping->file = bip::file_mapping();
    return MappedFile(path, std::move(mapping), nullptr, 0);
  }

  try {
    mapping->region = bip::mapped_region(mapping->file, bip::read_only);
  } catch (const bip::interprocess_exception& e) {
    DUFU_FAIL("cannot map '", path, "' (", st.st_size, " bytes): ", describe(e));
  }
  if (!keep_descriptor) mapping->file = bip::file_mapping();
  // The region's size is authoritative: the file may have changed since stat.
  const auto* data = static_cast<const std::byte*>(mapping->region.get_address());
  const std::uint64_t size = mapping->region.get_size();
  return MappedFile(path, std::move(mapping), data, size);
}

MappedFile::MappedFile(std::string path, std::unique_ptr<Mapping> mapping, const std::byte* data,
                       std::uint64_t size)
    : path_(std::move(path)), mapping_(std::move(mapping)), data_(data), size_(size) {}

// Hand-written so a moved-from object reads as empty rather than pointing at pages
// that now belong to someone else.
MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::move(other.mapping_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    path_ = std::move(other.path_);
    mapping_ = std::move(other.mapping_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() = default;

int MappedFile::descriptor() const {
  // A default-constructed file_mapping holds -1 (Boost's invalid handle).
  return mapping_ ? mapping_->file.get_mapping_handle().handle : -1;
}

}  // namespace dufu
