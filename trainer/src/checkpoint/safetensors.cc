// safetensors writing and reading. The writer reproduces the reference
// implementation's bytes (order, compact JSON, padding) so files can be compared
// byte for byte; the reader trusts nothing in the header, because a checkpoint that
// was cut short or damaged must be refused with a message, not read out of bounds.
#include "dufu/trainer/checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <iterator>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include <simdjson.h>

#include "json_type_name.h"

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"

namespace dufu::trainer::safetensors {

// Tensor bytes are written and mapped as they are in memory; the format is
// little-endian.
static_assert(std::endian::native == std::endian::little, "dufu's safetensors code assumes a little-endian host");

namespace {

// The reference implementation refuses larger headers; so does dufu, so that a
// corrupt length cannot make it allocate and parse gigabytes.
constexpr std::uint64_t kMaxHeaderSize = 100'000'000;
constexpr std::uint64_t kLengthSize = 8;

struct DtypeInfo {
  Dtype dtype;
  std::string_view name;
  std::size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBool, "BOOL", 1}, {Dtype::kU8, "U8", 1},   {Dtype::kI8, "I8", 1},   {Dtype::kF8_E5M2, "F8_E5M2", 1},
    {Dtype::kF8_E4M3, "F8_E4M3", 1}, {Dtype::kI16, "I16", 2}, {Dtype::kU16, "U16", 2}, {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2}, {Dtype::kI32, "I32", 4}, {Dtype::kU32, "U32", 4}, {Dtype::kF32, "F32", 4},
    {Dtype::kF64, "F64", 8},   {Dtype::kI64, "I64", 8}, {Dtype::kU64, "U64", 8},
};

const DtypeInfo& info(Dtype dtype) {
  const auto index = static_cast<std::size_t>(dtype);
  DUFU_CHECK(index < std::size(kDtypes) && kDtypes[index].dtype == dtype, "unknown safetensors dtype ", index);
  return kDtypes[index];
}

// Element count times item size, or nullopt when it does not fit 64 bits.
std::optional<std::uint64_t> byte_size(std::span<const std::uint64_t> shape, Dtype dtype) {
  std::uint64_t size = dtype_size(dtype);
  for (const std::uint64_t dim : shape) {
    if (__builtin_mul_overflow(size, dim, &size)) return std::nullopt;
  }
  return size;
}

std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += str_cat(i > 0 ? ", " : "", shape[i]);
  return out + "]";
}

// A JSON string as serde_json writes it, which is what the reference implementation
// uses: only '"', '\\' and control characters are escaped, lowercase hex.
void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[static_cast<unsigned char>(c) >> 4];
          out += kHex[static_cast<unsigned char>(c) & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}


struct TensorEntry {
  TensorView view;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// Checks one file's header and builds its tensor views; every failure names the file.
class HeaderReader {
 public:
  explicit HeaderReader(const MappedFile& file) : file_(file) {}

  template <typename... Parts>
  [[noreturn]] void fail(Parts&&... parts) const {
    DUFU_FAIL(file_.path(), ": invalid safetensors file: ", std::forward<Parts>(parts)...);
  }

  void read(Metadata& metadata, std::vector<TensorView>& tensors) {
    const std::uint64_t file_size = file_.size();
    if (file_size < kLengthSize) {
      fail("it has ", file_size, " bytes, fewer than the 8-byte header length that starts the format ",
           "(truncated or not a safetensors file)");
    }
    std::uint64_t header_size = 0;
    std::memcpy(&header_size, file_.data(), kLengthSize);
    if (header_size > kMaxHeaderSize) {
      fail("the header length ", header_size, " is implausible (the limit is ", kMaxHeaderSize,
           " bytes): the file is corrupt or not a safetensors file");
    }
    if (header_size > file_size - kLengthSize) {
      fail("truncated: the header length is ", header_size, " bytes, but only ", file_size - kLengthSize,
           " bytes follow it");
    }
    const char* header = reinterpret_cast<const char*>(file_.data()) + kLengthSize;
    if (header_size < 2 || header[0] != '{') fail("the header does not start with '{'");
    data_begin_ = file_.data() + kLengthSize + header_size;
    data_size_ = file_size - kLengthSize - header_size;

    simdjson::dom::parser parser;
    simdjson::dom::element root;
    // The header is copied into a padded buffer: simdjson reads past the end of its
    // input, and the end of the header is the middle of the mapping.
    if (const auto error = parser.parse(header, header_size, /*realloc_if_needed=*/true).get(root); error) {
      if (error == simdjson::UTF8_ERROR) fail("the header is not valid UTF-8");
      fail("the header is not valid JSON (", simdjson::error_message(error), ")");
    }
    simdjson::dom::object object;
    if (root.get_object().get(object)) fail("the header is ", json_type_name(root.type()), ", not a JSON object");

    std::set<std::string_view> seen;
    std::vector<TensorEntry> entries;
    for (const auto field : object) {
      if (!seen.insert(field.key).second) fail("the header has two entries named \"", field.key, "\"");
      if (field.key == "__metadata__") {
        read_metadata(field.value, metadata);
      } else {
        entries.push_back(read_tensor(field.key, field.value));
      }
    }
    check_layout(entries);
    std::sort(entries.begin(), entries.end(),
              [](const TensorEntry& a, const TensorEntry& b) { return a.view.name < b.view.name; });
    for (TensorEntry& entry : entries) tensors.push_back(std::move(entry.view));
  }

 private:
  void read_metadata(simdjson::dom::element value, Metadata& metadata) const {
    simdjson::dom::object object;
    if (value.get_object().get(object)) fail("__metadata__ is ", json_type_name(value.type()), ", not an object");
    for (const auto field : object) {
      std::string_view text;
      if (field.value.get_string().get(text)) {
        fail("__metadata__ entry \"", field.key, "\" is ", json_type_name(field.value.type()),
             "; metadata values must be strings");
      }
      if (!metadata.emplace(field.key, text).second) fail("__metadata__ has two entries named \"", field.key, "\"");
    }
  }

  TensorEntry read_tensor(std::string_view name, simdjson::dom::element value) const {
    simdjson::dom::object object;
    if (value.get_object().get(object)) {
      fail("tensor \"", name, "\" is described by ", json_type_name(value.type()), ", not an object");
    }
    TensorEntry entry;
    entry.view.name = std::string(name);
    bool have_dtype = false, have_shape = false, have_offsets = false;
    for (const auto field : object) {
      if (field.key == "dtype") {
        mark_seen(have_dtype, name, field.key);
        std::string_view dtype_text;
        if (field.value.get_string().get(dtype_text)) fail("tensor \"", name, "\": dtype is not a string");
        const std::optional<Dtype> dtype = parse_dtype(dtype_text);
        if (!dtype) fail("tensor \"", name, "\": unknown dtype \"", dtype_text, "\"");
        entry.view.dtype = *dtype;
      } else if (field.key == "shape") {
        mark_seen(have_shape, name, field.key);
        entry.view.shape = read_integers(field.value, name, "shape must be an array of non-negative integers");
      } else if (field.key == "data_offsets") {
        mark_seen(have_offsets, name, field.key);
        constexpr const char* kExpected = "data_offsets must be two non-negative integers [begin, end]";
        const std::vector<std::uint64_t> offsets = read_integers(field.value, name, kExpected);
        if (offsets.size() != 2) fail("tensor \"", name, "\": ", kExpected);
        entry.begin = offsets[0];
        entry.end = offsets[1];
      } else {
        fail("tensor \"", name, "\" has the unknown field \"", field.key, "\" (expected dtype, shape, data_offsets)");
      }
    }
    if (!have_dtype || !have_shape || !have_offsets) {
      fail("tensor \"", name, "\" must have the fields dtype, shape and data_offsets");
    }

    const std::string offsets = str_cat("data_offsets [", entry.begin, ", ", entry.end, "]");
    if (entry.end < entry.begin) fail("tensor \"", name, "\": ", offsets, " end before they begin");
    const std::optional<std::uint64_t> expected = byte_size(entry.view.shape, entry.view.dtype);
    if (!expected) fail("tensor \"", name, "\": the size of shape ", shape_text(entry.view.shape), " overflows");
    if (entry.end - entry.begin != *expected) {
      fail("tensor \"", name, "\": ", offsets, " hold ", entry.end - entry.begin, " bytes, but shape ",
           shape_text(entry.view.shape), " of ", dtype_name(entry.view.dtype), " needs ", *expected);
    }
    if (entry.end > data_size_) {
      fail("tensor \"", name, "\": ", offsets, " run past the end of the data section (", data_size_,
           " bytes): the file is truncated or corrupt");
    }
    entry.view.bytes = {data_begin_ + entry.begin, static_cast<std::size_t>(entry.end - entry.begin)};
    return entry;
  }

  void mark_seen(bool& seen, std::string_view tensor, std::string_view field) const {
    if (seen) fail("tensor \"", tensor, "\" has two \"", field, "\" fields");
    seen = true;
  }

  std::vector<std::uint64_t> read_integers(simdjson::dom::element value, std::string_view tensor,
                                           const char* expected) const {
    simdjson::dom::array array;
    if (value.get_array().get(array)) fail("tensor \"", tensor, "\": ", expected);
    std::vector<std::uint64_t> integers;
    for (const simdjson::dom::element item : array) {
      std::uint64_t integer = 0;
      if (item.get_uint64().get(integer)) fail("tensor \"", tensor, "\": ", expected);
      integers.push_back(integer);
    }
    return integers;
  }

  // The tensors must tile the data section: in offset order each begins where the
  // previous ended, the first at 0 and the last at the end, as the reference
  // implementation requires; so no byte is shared and none is unaccounted for.
  void check_layout(std::vector<TensorEntry>& entries) const {
    std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
      return std::tie(a.begin, a.end, a.view.name) < std::tie(b.begin, b.end, b.view.name);
    });
    std::uint64_t covered = 0;
    const TensorEntry* previous = nullptr;
    for (const TensorEntry& entry : entries) {
      if (entry.begin < covered) {
        fail("tensors \"", previous->view.name, "\" [", previous->begin, ", ", previous->end, "] and \"",
             entry.view.name, "\" [", entry.begin, ", ", entry.end, "] overlap");
      }
      if (entry.begin > covered) {
        fail("bytes [", covered, ", ", entry.begin, ") of the data section belong to no tensor");
      }
      covered = entry.end;
      previous = &entry;
    }
    if (covered != data_size_) {
      fail("bytes [", covered, ", ", data_size_, ") of the data section belong to no tensor");
    }
  }

  const MappedFile& file_;
  const std::byte* data_begin_ = nullptr;
  std::uint64_t data_size_ = 0;
};

}  // namespace

std::string_view dtype_name(Dtype dtype) { return info(dtype).name; }

std::size_t dtype_size(Dtype dtype) { return info(dtype).size; }

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const DtypeInfo& entry : kDtypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

void write(const std::string& path, std::span<const TensorRef> tensors, const Metadata& metadata) {
  std::vector<std::uint64_t> sizes;
  std::set<std::string_view> names;
  for (const TensorRef& tensor : tensors) {
    if (tensor.name == "__metadata__") DUFU_FAIL(path, ": \"__metadata__\" is reserved and cannot name a tensor");
    if (!names.insert(tensor.name).second) DUFU_FAIL(path, ": two tensors are named \"", tensor.name, "\"");
    const std::optional<std::uint64_t> size = byte_size(tensor.shape, tensor.dtype);
    if (!size) {
      DUFU_FAIL(path, ": tensor \"", tensor.name, "\": the size of shape ", shape_text(tensor.shape), " overflows");
    }
    if (*size > 0 && tensor.data == nullptr) DUFU_FAIL(path, ": tensor \"", tensor.name, "\" has no data");
    sizes.push_back(*size);
  }
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, key);
      header += ':';
      append_json_string(header, value);
    }
    header += '}';
  }
  std::uint64_t offset = 0;
  for (const std::size_t i : order) {
    const TensorRef& tensor = tensors[i];
    if (header.size() > 1) header += ',';
    append_json_string(header, tensor.name);
    header += str_cat(":{\"dtype\":\"", dtype_name(tensor.dtype), "\",\"shape\":[");
    for (std::size_t d = 0; d < tensor.shape.size(); ++d) header += str_cat(d > 0 ? "," : "", tensor.shape[d]);
    header += str_cat("],\"data_offsets\":[", offset, ",", offset + sizes[i], "]}");
    offset += sizes[i];
  }
  header += '}';
  // Padding makes the data section start 8-byte aligned, so mapped tensors can be
  // used in place.
  header.append((kLengthSize - header.size() % kLengthSize) % kLengthSize, ' ');

  AtomicFile out(path);
  out.write_value<std::uint64_t>(header.size());
  out.write(header.data(), header.size());
  for (const std::size_t i : order) {
    if (sizes[i] > 0) out.write(tensors[i].data, sizes[i]);
  }
  out.commit();
}

File::File(MappedFile file, Metadata metadata, std::vector<TensorView> tensors)
    : file_(std::move(file)), metadata_(std::move(metadata)), tensors_(std::move(tensors)) {}

File File::open(const std::string& path) {
  MappedFile file = MappedFile::open(path);
  Metadata metadata;
  std::vector<TensorView> tensors;
  HeaderReader(file).read(metadata, tensors);
  // The views point into the mapping itself, which stays put when `file` is moved.
  return File(std::move(file), std::move(metadata), std::move(tensors));
}

const TensorView* File::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const TensorView& tensor, std::string_view key) { return tensor.name < key; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

const TensorView& File::tensor(std::string_view name) const {
  const TensorView* tensor = find(name);
  if (tensor == nullptr) DUFU_FAIL(path(), ": no tensor named \"", name, "\"");
  return *tensor;
}

const TensorView& File::checked_tensor(std::string_view name, Dtype dtype, std::size_t alignment) const {
  const TensorView& view = tensor(name);
  if (view.dtype != dtype) {
    DUFU_FAIL(path(), ": tensor \"", name, "\" is ", dtype_name(view.dtype), ", read as ", dtype_name(dtype));
  }
  if (reinterpret_cast<std::uintptr_t>(view.bytes.data()) % alignment != 0) {
    DUFU_FAIL(path(), ": tensor \"", name, "\" is not aligned for ", dtype_name(dtype),
              " (the writer did not pad the header to a multiple of 8); copy its bytes instead");
  }
  return view;
}

}  // namespace dufu::trainer::safetensors
