// Tests for write_npy and NpyArray: typed round trips, byte identity with numpy.save
// in both directions through the Debian numpy, header-parsing tolerance, and errors
// that name the file for corrupt, truncated and unsupported inputs.
#include "dufu/common/npy.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using dufu::testing::TempDir;

// Value i of every test array, so numpy can build the same data:
// (np.arange(n, dtype=np.int64) * 37 - 1000).astype(dtype). Both sides wrap the
// negative values modulo 2^bits for unsigned and narrow types.
template <typename T>
T value_at(std::uint64_t i) {
  return static_cast<T>(static_cast<std::int64_t>(i) * 37 - 1000);
}

template <typename T>
std::vector<T> make_values(std::uint64_t count) {
  std::vector<T> values;
  for (std::uint64_t i = 0; i < count; ++i) values.push_back(value_at<T>(i));
  return values;
}

// Calls f(T{}) for the C++ type of a supported descr.
template <typename F>
void visit_descr(const std::string& descr, F&& f) {
  if (descr == "<i2") return f(std::int16_t{});
  if (descr == "<u2") return f(std::uint16_t{});
  if (descr == "<i4") return f(std::int32_t{});
  if (descr == "<u4") return f(std::uint32_t{});
  if (descr == "<i8") return f(std::int64_t{});
  if (descr == "<u8") return f(std::uint64_t{});
  if (descr == "<f4") return f(float{});
  if (descr == "<f8") return f(double{});
  if (descr == "|u1") return f(std::uint8_t{});
  if (descr == "|i1") return f(std::int8_t{});
  FAIL() << "no C++ type for " << descr;
}

std::uint64_t product(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::string error_of_open(const std::string& path) {
  try {
    NpyArray::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// An .npy file with an arbitrary header dict, padded the way numpy pads.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1) {
  const std::size_t prefix = 6 + 2 + (major == 1 ? 2 : 4);
  std::string header = dict;
  header.append(64 - (prefix + header.size() + 1) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

template <typename T>
std::string raw_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
class NpyRoundTrip : public ::testing::Test {};
using NpyTypes = ::testing::Types<std::int8_t, std::uint8_t, std::int16_t, std::uint16_t, std::int32_t,
                                  std::uint32_t, std::int64_t, std::uint64_t, float, double>;
TYPED_TEST_SUITE(NpyRoundTrip, NpyTypes);

TYPED_TEST(NpyRoundTrip, OneAndTwoDimensions) {
  using T = TypeParam;
  TempDir dir;
  std::vector<T> values = make_values<T>(12);
  values.push_back(std::numeric_limits<T>::lowest());
  values.push_back(std::numeric_limits<T>::max());
  values.push_back(std::numeric_limits<T>::min());
  values.push_back(T{0});

  write_npy(dir.file("flat.npy"), std::span<const T>(values));
  const NpyArray flat = NpyArray::open(dir.file("flat.npy"));
  EXPECT_EQ(flat.descr(), npy_descr<T>());
  EXPECT_EQ(flat.item_size(), sizeof(T));
  EXPECT_EQ(flat.path(), dir.file("flat.npy"));
  EXPECT_EQ(flat.shape(), (std::vector<std::uint64_t>{16}));
  EXPECT_EQ(flat.size(), 16u);
  const auto view = flat.view<T>();
  EXPECT_EQ(std::vector<T>(view.begin(), view.end()), values);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(view.data()) % 64, 0u);

  write_npy(dir.file("grid.npy"), std::span<const T>(values), {8, 2});
  const NpyArray grid = NpyArray::open(dir.file("grid.npy"));
  EXPECT_EQ(grid.shape(), (std::vector<std::uint64_t>{8, 2}));
  const auto grid_view = grid.view<T>();
  EXPECT_EQ(std::vector<T>(grid_view.begin(), grid_view.end()), values);

  // Nothing but the two finished files: the atomic writer left no temporaries.
  EXPECT_EQ(dir.list(), (std::set<std::string>{"flat.npy", "grid.npy"}));
}

TEST(Npy, HeaderBytesForInt32Arange) {
  TempDir dir;
  const auto values = make_values<std::int32_t>(10);
  write_npy(dir.file("a.npy"), std::span<const std::int32_t>(values));
  const std::string bytes = testing::read_all(dir.file("a.npy"));
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }";
  dict.append(128 - 10 - dict.size() - 1, ' ');
  const std::string expected_header = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict + "\n";
  ASSERT_EQ(bytes.size(), 128u + 40u);
  EXPECT_EQ(bytes.substr(0, 128), expected_header);
  EXPECT_EQ(bytes.substr(128), raw_bytes(values));
}

TEST(Npy, ShapeFormatting) {
  TempDir dir;
  const std::vector<std::int64_t> six = make_values<std::int64_t>(6);
  write_npy(dir.file("grid.npy"), std::span<const std::int64_t>(six), {3, 2});
  EXPECT_NE(testing::read_all(dir.file("grid.npy")).find("'shape': (3, 2), }"), std::string::npos);

  const std::vector<std::uint32_t> none;
  write_npy(dir.file("empty.npy"), std::span<const std::uint32_t>(none));
  const std::string empty = testing::read_all(dir.file("empty.npy"));
  EXPECT_NE(empty.find("'shape': (0,), }"), std::string::npos);
  EXPECT_EQ(empty.size(), 128u);
  const NpyArray array = NpyArray::open(dir.file("empty.npy"));
  EXPECT_EQ(array.shape(), (std::vector<std::uint64_t>{0}));
  EXPECT_TRUE(array.view<std::uint32_t>().empty());
}

TEST(Npy, WriteRejectsBadArguments) {
  TempDir dir;
  const auto values = make_values<std::int32_t>(6);
  const std::string path = dir.file("bad.npy");
  auto error_of = [&](auto&& write) -> std::string {
    try {
      write();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  std::string error = error_of([&] { write_npy(path, std::span<const std::int32_t>(values), {4, 2}); });
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("(4, 2)"), std::string::npos) << error;

  const std::uint64_t three_d[] = {1, 2, 3};
  error = error_of([&] { write_npy(path, "<i4", three_d, values.data(), 4); });
  EXPECT_NE(error.find("more than 2 dimensions"), std::string::npos) << error;

  const std::uint64_t six[] = {6};
  error = error_of([&] { write_npy(path, ">i4", six, values.data(), 4); });
  EXPECT_NE(error.find("unsupported .npy dtype '>i4'"), std::string::npos) << error;
  error = error_of([&] { write_npy(path, "<i8", six, values.data(), 4); });
  EXPECT_NE(error.find("8-byte items"), std::string::npos) << error;

  error = error_of([&] { write_npy(dir.file("missing/dir/a.npy"), std::span<const std::int32_t>(values)); });
  EXPECT_NE(error.find(dir.file("missing/dir/a.npy")), std::string::npos) << error;
  EXPECT_TRUE(dir.list().empty());
}

TEST(Npy, ViewOfWrongTypeNamesFile) {
  TempDir dir;
  const auto values = make_values<std::int32_t>(4);
  write_npy(dir.file("a.npy"), std::span<const std::int32_t>(values));
  const NpyArray array = NpyArray::open(dir.file("a.npy"));
  try {
    array.view<std::uint32_t>();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(dir.file("a.npy")), std::string::npos) << message;
    EXPECT_NE(message.find("<i4"), std::string::npos) << message;
    EXPECT_NE(message.find("<u4"), std::string::npos) << message;
  }
}

TEST(Npy, ParsesHeaderVariants) {
  TempDir dir;
  const auto values = make_values<std::int64_t>(6);
  const std::string data = raw_bytes(values);
  const char* variants[] = {
      "{'shape': (3, 2), 'fortran_order': False, 'descr': '<i8'}",
      "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (3, 2,)}",
      "{ 'descr' : '<i8' ,\t'fortran_order':False,'shape':( 3 ,2 ) , }",
      "{'descr': '<i8', 'fortran_order': False, 'shape': (3L, 2L), }",
  };
  for (const char* dict : variants) {
    testing::write_all(dir.file("v.npy"), make_npy(dict, data));
    const NpyArray array = NpyArray::open(dir.file("v.npy"));
    EXPECT_EQ(array.shape(), (std::vector<std::uint64_t>{3, 2})) << dict;
    const auto view = array.view<std::int64_t>();
    EXPECT_EQ(std::vector<std::int64_t>(view.begin(), view.end()), values) << dict;
  }
  // Version 2.0 differs only in its 4-byte header length.
  testing::write_all(dir.file("v2.npy"), make_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (6,), }", data, 2));
  EXPECT_EQ(NpyArray::open(dir.file("v2.npy")).shape(), (std::vector<std::uint64_t>{6}));
  // A 0-d array holds one item.
  testing::write_all(dir.file("scalar.npy"), make_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", data.substr(0, 8)));
  const NpyArray scalar = NpyArray::open(dir.file("scalar.npy"));
  EXPECT_TRUE(scalar.shape().empty());
  EXPECT_EQ(scalar.size(), 1u);
  EXPECT_EQ(scalar.view<std::int64_t>()[0], values[0]);
}

TEST(Npy, CorruptFilesErrorWithPath) {
  TempDir dir;
  const auto values = make_values<std::int32_t>(10);
  write_npy(dir.file("good.npy"), std::span<const std::int32_t>(values));
  const std::string good = testing::read_all(dir.file("good.npy"));
  const std::string data = raw_bytes(values);
  const std::string ok_dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }";

  struct Case {
    const char* name;
    std::string bytes;
    const char* reason;  // a fragment the message must contain
  };
  const Case cases[] = {
      {"empty", "", "not an .npy file"},
      {"magic", "\x93NUMPZ" + good.substr(6), "not an .npy file"},
      {"only_magic", good.substr(0, 8), "truncated"},
      {"version", good.substr(0, 6) + std::string("\x03\x00", 2) + good.substr(8), "version 3.0"},
      {"header_cut", good.substr(0, 100), "truncated"},
      {"data_short", good.substr(0, good.size() - 1), "truncated?"},
      {"data_long", good + "x", "trailing bytes"},
      {"fortran", make_npy("{'descr': '<i4', 'fortran_order': True, 'shape': (10,), }", data), "Fortran order"},
      {"big_endian", make_npy("{'descr': '>i4', 'fortran_order': False, 'shape': (10,), }", data), "'>i4' is not supported"},
      {"bool", make_npy("{'descr': '|b1', 'fortran_order': False, 'shape': (40,), }", data), "'|b1' is not supported"},
      {"three_d", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2, 5), }", data), "more than 2 dimensions"},
      {"missing_key", make_npy("{'descr': '<i4', 'shape': (10,), }", data), "must have the keys"},
      {"extra_key", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (10,), 'x': 1}", data), "unexpected key 'x'"},
      {"duplicate_key", make_npy("{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (10,)}", data), "duplicate key"},
      {"negative_dim", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (-10,), }", data), "non-negative integer"},
      {"not_tuple", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (10), }", data), "not a tuple"},
      {"huge_dim", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999999,), }", data), "64 bits"},
      {"overflow", make_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", data), "too large"},
      {"bad_bool", make_npy("{'descr': '<i4', 'fortran_order': Nope, 'shape': (10,), }", data), "True or False"},
      {"unterminated", make_npy("{'descr': '<i4, 'fortran_order': False, 'shape': (10,), }", data), "malformed"},
      {"not_dict", make_npy("[1, 2]", data), "expected '{'"},
      {"trailing_text", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (10,)} x", data), "after the closing"},
      {"misaligned", std::string("\x93NUMPY\x01\x00", 8) + std::string("\x3d\x00", 2) + ok_dict + "  \n" + data, "not aligned"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.file(std::string(c.name) + ".npy");
    testing::write_all(path, c.bytes);
    const std::string message = error_of_open(path);
    EXPECT_NE(message.find(path), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find(c.reason), std::string::npos) << c.name << ": " << message;
  }
  const std::string missing = error_of_open(dir.file("missing.npy"));
  EXPECT_NE(missing.find(dir.file("missing.npy")), std::string::npos) << missing;
}

// The arrays compared with numpy: every dtype, empty arrays, a first axis of
// several digit counts (numpy pads the header for it to grow) and a 0-d array.
struct NumpyCase {
  const char* name;
  const char* descr;
  std::vector<std::uint64_t> shape;
};
const std::vector<NumpyCase>& numpy_cases() {
  static const std::vector<NumpyCase> cases = {
      {"i4_10", "<i4", {10}},         {"i8_3x2", "<i8", {3, 2}},         {"u4_empty", "<u4", {0}},
      {"i4_0x2", "<i4", {0, 2}},      {"f4_0xwide", "<f4", {0, 12345678901234}},
      {"u1_long", "|u1", {100000}},   {"i1_7", "|i1", {7}},              {"i2_5x3", "<i2", {5, 3}},
      {"u2_4", "<u2", {4}},           {"u8_6", "<u8", {6}},              {"f4_9", "<f4", {9}},
      {"f8_2x5", "<f8", {2, 5}},      {"i8_1", "<i8", {1}},              {"u4_1x1", "<u4", {1, 1}},
      {"i4_wide", "<i4", {2, 1001}},  {"i4_scalar", "<i4", {}},
  };
  return cases;
}

std::string shape_literal(const std::vector<std::uint64_t>& shape) {
  std::string out = "(";
  for (const auto d : shape) out += std::to_string(d) + ",";
  return out + ")";
}

// numpy writes every case as numpy_<name>.npy (and a 2.0 copy as numpy2_<name>.npy),
// or checks that dufu_<name>.npy loads as the expected array.
std::string numpy_script() {
  std::string cases = "CASES = [\n";
  for (const auto& c : numpy_cases()) {
    cases += str_cat("    ('", c.name, "', '", c.descr, "', ", shape_literal(c.shape), "),\n");
  }
  cases += "]\n";
  return cases + R"PY(
import os, sys
import numpy as np

def expected(descr, shape):
    count = int(np.prod(shape, dtype=np.int64))
    return (np.arange(count, dtype=np.int64) * 37 - 1000).astype(np.dtype(descr)).reshape(shape)

mode, folder = sys.argv[1], sys.argv[2]
for name, descr, shape in CASES:
    array = expected(descr, shape)
    if mode == 'write':
        np.save(os.path.join(folder, 'numpy_' + name + '.npy'), array)
        with open(os.path.join(folder, 'numpy2_' + name + '.npy'), 'wb') as f:
            np.lib.format.write_array(f, array, version=(2, 0))
    else:
        loaded = np.load(os.path.join(folder, 'dufu_' + name + '.npy'))
        assert loaded.dtype == array.dtype, (name, loaded.dtype)
        assert loaded.shape == array.shape, (name, loaded.shape)
        assert np.array_equal(loaded, array), name
if mode == 'write':
    np.save(os.path.join(folder, 'numpy_fortran.npy'), np.asfortranarray(expected('<i4', (3, 2))))
    np.save(os.path.join(folder, 'numpy_big_endian.npy'), expected('>i4', (4,)))
    np.save(os.path.join(folder, 'numpy_bool.npy'), np.zeros(3, dtype=bool))
    np.save(os.path.join(folder, 'numpy_three_d.npy'), expected('<i4', (1, 2, 3)))
)PY";
}

void run_numpy(const TempDir& dir, const std::string& mode) {
  const std::string script = dir.file("numpy_npy.py");
  testing::write_all(script, numpy_script());
  const std::string command = str_cat(DUFU_REFERENCE_PYTHON, " ", script, " ", mode, " ", dir.path());
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

void write_case(const std::string& path, const NumpyCase& c) {
  visit_descr(c.descr, [&](auto zero) {
    using T = decltype(zero);
    const std::vector<T> values = make_values<T>(product(c.shape));
    write_npy(path, c.descr, c.shape, values.data(), sizeof(T));
  });
}

void expect_case_contents(const NpyArray& array, const NumpyCase& c) {
  EXPECT_EQ(array.descr(), c.descr) << c.name;
  EXPECT_EQ(array.shape(), c.shape) << c.name;
  visit_descr(c.descr, [&](auto zero) {
    using T = decltype(zero);
    const auto view = array.view<T>();
    EXPECT_EQ(std::vector<T>(view.begin(), view.end()), make_values<T>(product(c.shape))) << c.name;
  });
}

TEST(Npy, ByteIdenticalToNumpySave) {
  TempDir dir;
  run_numpy(dir, "write");
  for (const auto& c : numpy_cases()) {
    const std::string ours = dir.file(str_cat("dufu_", c.name, ".npy"));
    write_case(ours, c);
    const std::string theirs = testing::read_all(dir.file(str_cat("numpy_", c.name, ".npy")));
    EXPECT_EQ(testing::read_all(ours), theirs) << c.name << ": header numpy wrote: " << theirs.substr(0, 128);
  }
  // And numpy loads what dufu wrote as the same arrays.
  run_numpy(dir, "check");
}

TEST(Npy, ReadsNumpyFiles) {
  TempDir dir;
  run_numpy(dir, "write");
  for (const auto& c : numpy_cases()) {
    expect_case_contents(NpyArray::open(dir.file(str_cat("numpy_", c.name, ".npy"))), c);
    expect_case_contents(NpyArray::open(dir.file(str_cat("numpy2_", c.name, ".npy"))), c);
  }
  const std::pair<const char*, const char*> rejected[] = {
      {"numpy_fortran.npy", "Fortran order"},
      {"numpy_big_endian.npy", "'>i4' is not supported"},
      {"numpy_bool.npy", "'|b1' is not supported"},
      {"numpy_three_d.npy", "more than 2 dimensions"},
  };
  for (const auto& [name, reason] : rejected) {
    const std::string message = error_of_open(dir.file(name));
    EXPECT_NE(message.find(dir.file(name)), std::string::npos) << message;
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace dufu
