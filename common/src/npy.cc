// .npy writing and reading. The writer reproduces numpy.save's header byte for byte
// so that a cache written by dufu is indistinguishable from Megatron's; the reader
// parses just enough of the Python-literal header dict to accept every file numpy
// writes for the supported dtypes and rejects anything else with the file's name.
#include "dufu/common/npy.h"

#include <bit>
#include <cstring>
#include <optional>
#include <utility>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"

namespace dufu {

// The data is written and mapped as is; .npy stores these dtypes little-endian.
static_assert(std::endian::native == std::endian::little, "dufu's .npy code assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
// numpy pads magic + version + length + header to this so the data is aligned for
// any dtype and for mapping.
constexpr std::size_t kHeaderAlign = 64;
// numpy >= 1.23 leaves room for the first axis to grow to this many digits, so a
// file can be appended to in place; numpy.save output includes these spaces.
constexpr std::size_t kGrowthAxisMaxDigits = 21;
constexpr std::size_t kMaxDims = 2;

struct DescrInfo {
  std::string_view descr;
  std::size_t item_size;
};
constexpr DescrInfo kSupportedDescrs[] = {
    {"<i2", 2}, {"<u2", 2}, {"<i4", 4}, {"<u4", 4}, {"<i8", 8},
    {"<u8", 8}, {"<f4", 4}, {"<f8", 8}, {"|u1", 1}, {"|i1", 1},
};

// Product of the dimensions, or nullopt when it does not fit 64 bits.
std::optional<std::uint64_t> checked_product(std::span<const std::uint64_t> shape, std::uint64_t factor = 1) {
  std::uint64_t product = factor;
  for (const std::uint64_t dim : shape) {
    if (__builtin_mul_overflow(product, dim, &product)) return std::nullopt;
  }
  return product;
}

// Python's repr of a tuple of ints: "()", "(10,)", "(3, 2)".
std::string shape_repr(std::span<const std::uint64_t> shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ",";
  return out + ")";
}

// Recursive-descent parser for the header dict numpy writes, e.g.
// "{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }". It accepts any key
// order, either quote, any whitespace and Python 2's "10L" integers, which is what
// numpy's own reader tolerates for versions 1.0 and 2.0.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  struct Header {
    std::string descr;
    bool fortran_order = false;
    std::vector<std::uint64_t> shape;
  };

  Header parse() {
    Header header;
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        mark_seen(have_descr, key);
        header.descr = parse_string();
      } else if (key == "fortran_order") {
        mark_seen(have_order, key);
        header.fortran_order = parse_bool();
      } else if (key == "shape") {
        mark_seen(have_shape, key);
        header.shape = parse_shape();
      } else {
        fail(str_cat("unexpected key '", key, "'"));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the closing '}'");
    if (!have_descr || !have_order || !have_shape) {
      fail("the header must have the keys 'descr', 'fortran_order' and 'shape'");
    }
    return header;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void expect(char c) {
    if (peek() != c) fail(str_cat("expected '", c, "'"));
    ++pos_;
  }

  void mark_seen(bool& seen, const std::string& key) {
    if (seen) fail(str_cat("duplicate key '", key, "'"));
    seen = true;
  }

  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    const std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    if (value.find('\\') != std::string::npos) fail("escape sequences are not supported");
    pos_ = end + 1;
    return value;
  }

  bool parse_bool() {
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail("expected True or False");
  }

  std::uint64_t parse_int() {
    if (peek() < '0' || peek() > '9') fail("expected a non-negative integer");
    std::uint64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      if (__builtin_mul_overflow(value, 10u, &value) ||
          __builtin_add_overflow(value, static_cast<std::uint64_t>(peek() - '0'), &value)) {
        fail("dimension does not fit in 64 bits");
      }
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 long literal
    return value;
  }

  // A Python tuple: "()", "(10,)", "(3, 2)", "(3, 2,)". "(10)" is an int in Python,
  // not a tuple, and numpy rejects it; so do we.
  std::vector<std::uint64_t> parse_shape() {
    std::vector<std::uint64_t> shape;
    expect('(');
    bool trailing_comma = false;
    while (true) {
      skip_space();
      if (peek() == ')') break;
      shape.push_back(parse_int());
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
      } else if (peek() != ')') {
        fail("expected ',' or ')' in the shape");
      }
    }
    ++pos_;
    if (shape.size() == 1 && !trailing_comma) fail("the shape is not a tuple");
    return shape;
  }

  [[noreturn]] void fail(const std::string& what) const {
    // A 2.0 header can claim gigabytes; quote only what helps to recognise it.
    constexpr std::size_t kQuoted = 200;
    DUFU_FAIL(path_, ": malformed .npy header (", what, " at offset ", pos_, "): ", text_.substr(0, kQuoted),
              text_.size() > kQuoted ? "..." : "");
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

std::uint64_t read_le(const std::byte* bytes, std::size_t size) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < size; ++i) value |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return value;
}

}  // namespace

std::size_t npy_item_size(std::string_view descr) {
  for (const auto& supported : kSupportedDescrs) {
    if (supported.descr == descr) return supported.item_size;
  }
  return 0;
}

namespace detail {

void check_npy_shape(const std::string& path, std::span<const std::uint64_t> shape, std::uint64_t count) {
  const auto product = checked_product(shape);
  if (!product || *product != count) {
    DUFU_FAIL(path, ": .npy shape ", shape_repr(shape), " does not hold the ", count, " items given");
  }
}

}  // namespace detail

void write_npy(const std::string& path, const std::string& descr, std::span<const std::uint64_t> shape,
               const void* data, std::size_t item_size) {
  const std::size_t expected_item_size = npy_item_size(descr);
  if (expected_item_size == 0) DUFU_FAIL(path, ": unsupported .npy dtype '", descr, "'");
  if (item_size != expected_item_size) {
    DUFU_FAIL(path, ": .npy dtype ", descr, " has ", expected_item_size, "-byte items, not ", item_size);
  }
  if (shape.size() > kMaxDims) {
    DUFU_FAIL(path, ": .npy shape ", shape_repr(shape), " has more than ", kMaxDims, " dimensions");
  }
  const auto data_bytes = checked_product(shape, item_size);
  if (!data_bytes) DUFU_FAIL(path, ": .npy shape ", shape_repr(shape), " is too large");

  // numpy's _write_array_header: keys sorted, values repr'd, growth room, then
  // spaces and '\n' up to the alignment (a full 64 spaces when already aligned).
  std::string dict = str_cat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape_repr(shape), ", }");
  if (!shape.empty()) dict.append(kGrowthAxisMaxDigits - std::to_string(shape[0]).size(), ' ');
  const std::size_t prefix_size = kMagicSize + 2 + 2;  // magic, version, u16 length
  const std::size_t padding = kHeaderAlign - (prefix_size + dict.size() + 1) % kHeaderAlign;
  const std::size_t header_length = dict.size() + padding + 1;
  dict.append(padding, ' ');
  dict.push_back('\n');

  std::string prefix(kMagic, kMagicSize);
  prefix.push_back('\x01');
  prefix.push_back('\x00');
  prefix.push_back(static_cast<char>(header_length & 0xff));
  prefix.push_back(static_cast<char>(header_length >> 8));

  AtomicFile file(path);
  file.write(prefix.data(), prefix.size());
  file.write(dict.data(), dict.size());
  // An empty array may come with a null pointer, which memcpy must not see.
  if (*data_bytes > 0) file.write(data, static_cast<std::size_t>(*data_bytes));
  file.commit();
}

NpyArray::NpyArray(MappedFile file, std::string descr, std::vector<std::uint64_t> shape, std::uint64_t data_offset)
    : file_(std::move(file)), descr_(std::move(descr)), shape_(std::move(shape)), data_offset_(data_offset) {}

NpyArray NpyArray::open(const std::string& path) {
  MappedFile file = MappedFile::open(path);
  const std::byte* bytes = file.data();
  const std::uint64_t file_size = file.size();
  if (file_size < kMagicSize + 2 || std::memcmp(bytes, kMagic, kMagicSize) != 0) {
    DUFU_FAIL(path, ": not an .npy file (it does not start with \\x93NUMPY)");
  }
  const auto major = static_cast<unsigned>(bytes[kMagicSize]);
  const auto minor = static_cast<unsigned>(bytes[kMagicSize + 1]);
  std::size_t length_size = 0;
  if (major == 1 && minor == 0) {
    length_size = 2;
  } else if (major == 2 && minor == 0) {
    length_size = 4;
  } else {
    DUFU_FAIL(path, ": .npy version ", major, ".", minor, " is not supported (dufu reads 1.0 and 2.0)");
  }
  const std::uint64_t header_start = kMagicSize + 2 + length_size;
  if (file_size < header_start) DUFU_FAIL(path, ": truncated .npy file (", file_size, " bytes, header length missing)");
  const std::uint64_t header_length = read_le(bytes + kMagicSize + 2, length_size);
  const std::uint64_t data_offset = header_start + header_length;
  if (file_size < data_offset) {
    DUFU_FAIL(path, ": truncated .npy file (", file_size, " bytes, but the header claims to end at byte ", data_offset,
              ")");
  }

  const std::string_view text(reinterpret_cast<const char*>(bytes + header_start), header_length);
  HeaderParser::Header header = HeaderParser(text, path).parse();

  const std::size_t item_size = npy_item_size(header.descr);
  if (item_size == 0) {
    DUFU_FAIL(path, ": .npy dtype '", header.descr,
              "' is not supported (dufu reads little-endian <i2 <u2 <i4 <u4 <i8 <u8 <f4 <f8 |i1 |u1)");
  }
  if (header.fortran_order) {
    DUFU_FAIL(path, ": .npy array is in Fortran order; dufu reads C-ordered arrays only (save a C-contiguous copy)");
  }
  if (header.shape.size() > kMaxDims) {
    DUFU_FAIL(path, ": .npy shape ", shape_repr(header.shape), " has more than ", kMaxDims, " dimensions");
  }
  const auto data_bytes = checked_product(header.shape, item_size);
  std::uint64_t expected_size = 0;
  if (!data_bytes || __builtin_add_overflow(data_offset, *data_bytes, &expected_size)) {
    DUFU_FAIL(path, ": .npy shape ", shape_repr(header.shape), " is too large");
  }
  if (file_size != expected_size) {
    DUFU_FAIL(path, ": .npy file is ", file_size, " bytes, but a ", header.descr, " array of shape ",
              shape_repr(header.shape), " after a ", data_offset, "-byte header needs ", expected_size,
              file_size < expected_size ? " (truncated?)" : " (trailing bytes)");
  }
  // view<T>() hands out typed pointers into the mapping, whose base is page-aligned.
  if (data_offset % item_size != 0) {
    DUFU_FAIL(path, ": .npy data starts at byte ", data_offset, ", which is not aligned for ", header.descr);
  }
  return NpyArray(std::move(file), std::move(header.descr), std::move(header.shape), data_offset);
}

std::uint64_t NpyArray::size() const {
  std::uint64_t product = 1;
  for (const std::uint64_t dim : shape_) product *= dim;  // checked in open()
  return product;
}

void NpyArray::check_descr(const char* expected) const {
  if (descr_ != expected) {
    DUFU_FAIL(file_.path(), ": .npy array has dtype ", descr_, " but was read as ", expected);
  }
}

}  // namespace dufu
