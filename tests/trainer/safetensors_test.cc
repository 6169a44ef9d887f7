// Tests for safetensors::write and safetensors::File: round trips of every dtype,
// byte identity with the format as the reference implementation writes it (its own
// published test vectors, hand-written files, and the Python package when the
// reference interpreter has it), and refusal of truncated or corrupt files with a
// message naming the file.
#include "dufu/trainer/checkpoint/safetensors.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace dufu::trainer::safetensors {
namespace {

using dufu::testing::error_of;

using dufu::testing::TempDir;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\"\ndoes not contain\n\"" << part << "\"";
}


std::string error_of_open(const std::string& path) {
  return error_of([&] { File::open(path); });
}

std::string le64(std::uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

// A file with an arbitrary header (padded with spaces to a multiple of 8 unless told
// otherwise) and data section.
std::string make_file(const std::string& header, const std::string& data, bool pad = true) {
  std::string padded = header;
  if (pad) padded.append((8 - padded.size() % 8) % 8, ' ');
  return le64(padded.size()) + padded + data;
}

template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string as_string(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(Safetensors, DtypeNamesAndSizes) {
  const std::pair<const char*, std::size_t> expected[] = {
      {"BOOL", 1}, {"U8", 1},   {"I8", 1},   {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4},  {"U32", 4},  {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
  };
  for (const auto& [name, size] : expected) {
    const auto dtype = parse_dtype(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(dtype_name(*dtype), name);
    EXPECT_EQ(dtype_size(*dtype), size) << name;
  }
  EXPECT_FALSE(parse_dtype("F31").has_value());
  EXPECT_FALSE(parse_dtype("f32").has_value());
}

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<float> wte = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const std::vector<double> scalar = {3.141592653589793};
  const std::vector<std::int32_t> tokens = {1, -2, 2147483647, -2147483647 - 1};
  const std::vector<std::int64_t> step = {1234567890123LL};
  const std::vector<std::uint8_t> bytes = {0, 1, 255};
  const std::vector<std::uint16_t> half = {0x3c00, 0xc000};  // 1.0 and -2.0 as F16 bits
  const std::vector<float> empty;
  const std::vector<TensorRef> tensors = {
      {"wte", Dtype::kF32, {2, 3}, wte.data()},
      {"scalar", Dtype::kF64, {}, scalar.data()},
      {"tokens", Dtype::kI32, {4}, tokens.data()},
      {"step", Dtype::kI64, {1}, step.data()},
      {"bytes", Dtype::kU8, {3}, bytes.data()},
      {"half", Dtype::kF16, {2}, half.data()},
      {"empty", Dtype::kF32, {0, 5}, nullptr},
  };
  const Metadata metadata = {{"format", "pt"}, {"config", "[model]\nn_layer = 2\n"}, {"quote\"", "\\ \t é"}};
  write(path, tensors, metadata);
  EXPECT_EQ(dir.list(), (std::set<std::string>{"model.safetensors"}));  // no temporary left behind

  const File file = File::open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), metadata);
  std::vector<std::string> names;
  for (const TensorView& tensor : file.tensors()) names.push_back(tensor.name);
  EXPECT_EQ(names, (std::vector<std::string>{"bytes", "empty", "half", "scalar", "step", "tokens", "wte"}));

  const auto wte_view = file.view<float>("wte");
  EXPECT_EQ(std::vector<float>(wte_view.begin(), wte_view.end()), wte);
  EXPECT_EQ(file.tensor("wte").shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(file.tensor("wte").element_count(), 6U);
  EXPECT_EQ(file.view<double>("scalar")[0], scalar[0]);
  EXPECT_TRUE(file.tensor("scalar").shape.empty());
  const auto tokens_view = file.view<std::int32_t>("tokens");
  EXPECT_EQ(std::vector<std::int32_t>(tokens_view.begin(), tokens_view.end()), tokens);
  EXPECT_EQ(file.view<std::int64_t>("step")[0], step[0]);
  const auto bytes_view = file.view<std::uint8_t>("bytes");
  EXPECT_EQ(std::vector<std::uint8_t>(bytes_view.begin(), bytes_view.end()), bytes);
  EXPECT_EQ(file.tensor("half").dtype, Dtype::kF16);
  EXPECT_EQ(as_string(file.tensor("half").bytes), bytes_of(half));
  EXPECT_EQ(file.tensor("empty").shape, (std::vector<std::uint64_t>{0, 5}));
  EXPECT_TRUE(file.view<float>("empty").empty());
  EXPECT_EQ(file.find("missing"), nullptr);

  // Views are zero-copy: they point into the mapping, and each is aligned for its
  // dtype because the header is padded and the largest dtypes come first.
  for (const TensorView& tensor : file.tensors()) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(tensor.bytes.data()) % dtype_size(tensor.dtype), 0U) << tensor.name;
  }
}

TEST(Safetensors, TypedAccessChecksTheDtypeAndTheName) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const std::vector<float> values = {1, 2};
  write(path, std::vector<TensorRef>{{"w", Dtype::kF32, {2}, values.data()}});
  const File file = File::open(path);
  const std::string wrong = error_of([&] { file.view<std::int32_t>("w"); });
  EXPECT_TRUE(Contains(wrong, path));
  EXPECT_TRUE(Contains(wrong, "tensor \"w\" is F32, read as I32"));
  const std::string missing = error_of([&] { file.tensor("v"); });
  EXPECT_TRUE(Contains(missing, path));
  EXPECT_TRUE(Contains(missing, "no tensor named \"v\""));
}

// The reference implementation's own test vectors (safetensors/src/tensor.rs:
// test_serialization_forced_alignement and test_empty), byte for byte.
TEST(Safetensors, MatchesTheReferenceImplementationsTestVectors) {
  TempDir dir;
  const std::vector<float> data = {0, 1, 2, 3, 4, 5};
  write(dir.file("attn0"), std::vector<TensorRef>{{"attn0", Dtype::kF32, {1, 1, 2, 3}, data.data()}});
  const unsigned char attn0[] = {
      72,  0,   0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 48,  34,  58,  123, 34,  100, 116,
      121, 112, 101, 34,  58,  34,  70,  51,  50,  34,  44,  34,  115, 104, 97,  112, 101, 34,  58,  91,  49,
      44,  49,  44,  50,  44,  51,  93,  44,  34,  100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115,
      34,  58,  91,  48,  44,  50,  52,  93,  125, 125, 32,  32,  32,  32,  32,  32,  32,  0,   0,   0,   0,
      0,   0,   128, 63,  0,   0,   0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
  EXPECT_EQ(testing::read_all(dir.file("attn0")), std::string(reinterpret_cast<const char*>(attn0), sizeof(attn0)));

  write(dir.file("empty"), std::span<const TensorRef>{});
  const unsigned char empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
  EXPECT_EQ(testing::read_all(dir.file("empty")), std::string(reinterpret_cast<const char*>(empty), sizeof(empty)));

  write(dir.file("metadata"), std::span<const TensorRef>{}, Metadata{{"framework", "pt"}});
  const unsigned char metadata[] = {40,  0,   0,   0,   0,   0,   0,   0,   123, 34, 95, 95, 109, 101, 116, 97,
                                    100, 97,  116, 97,  95,  95,  34,  58,  123, 34, 102, 114, 97, 109, 101, 119,
                                    111, 114, 107, 34,  58,  34,  112, 116, 34,  125, 125, 32, 32,  32,  32,  32};
  EXPECT_EQ(testing::read_all(dir.file("metadata")),
            std::string(reinterpret_cast<const char*>(metadata), sizeof(metadata)));
  for (const char* name : {"attn0", "empty", "metadata"}) EXPECT_NO_THROW(File::open(dir.file(name))) << name;
}

// Hand-written from the format description: tensors of several dtypes go largest
// dtype first, then by name, after the metadata; the header is padded with spaces.
TEST(Safetensors, WritesTheSpecifiedBytesForMixedDtypes) {
  TempDir dir;
  const std::vector<float> b = {1.0f, 2.0f};
  const std::vector<std::int64_t> a = {7};
  const std::vector<std::uint8_t> c = {1, 2, 3};
  const std::vector<float> d = {-1.0f};
  write(dir.file("mixed"),
        std::vector<TensorRef>{{"c", Dtype::kU8, {3}, c.data()},
                               {"d", Dtype::kF32, {1}, d.data()},
                               {"b", Dtype::kF32, {2}, b.data()},
                               {"a", Dtype::kI64, {1, 1}, a.data()}},
        Metadata{{"step", "10"}, {"format", "pt"}});
  const std::string header =
      R"({"__metadata__":{"format":"pt","step":"10"},)"
      R"("a":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("d":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
      R"("c":{"dtype":"U8","shape":[3],"data_offsets":[20,23]}})"
      "  ";  // 262 bytes of JSON + 2 spaces = 264, a multiple of 8
  ASSERT_EQ(header.size(), 264U);
  const std::string expected = std::string("\x08\x01\0\0\0\0\0\0", 8) + header +
                               std::string("\x07\0\0\0\0\0\0\0", 8) +  // a = 7 (I64)
                               std::string("\0\0\x80\x3f\0\0\0\x40", 8) +  // b = 1.0, 2.0 (F32)
                               std::string("\0\0\x80\xbf", 4) +  // d = -1.0 (F32)
                               std::string("\x01\x02\x03", 3);  // c (U8)
  EXPECT_EQ(testing::read_all(dir.file("mixed")), expected);
}

TEST(Safetensors, EscapesNamesAsJson) {
  TempDir dir;
  const std::vector<std::uint8_t> x = {9};
  write(dir.file("escaped"), std::vector<TensorRef>{{"a\"b\\c\nd\x01é", Dtype::kU8, {1}, x.data()}});
  const std::string header = R"({"a\"b\\c\nd\u0001é":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_EQ(testing::read_all(dir.file("escaped")), make_file(header, "\x09"));
  EXPECT_EQ(File::open(dir.file("escaped")).tensors().at(0).name, "a\"b\\c\nd\x01é");
}

// Byte identity with files written by the Python package, when the reference
// interpreter can import it (Debian does not package it).
TEST(Safetensors, MatchesThePythonPackageWhenAvailable) {
  const std::string python = DUFU_REFERENCE_PYTHON;
  if (std::system((python + " -c 'import safetensors.numpy' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << python << " cannot import safetensors; the hand-written and reference vectors cover the format";
  }
  TempDir dir;
  const std::string script = dir.file("write.py");
  testing::write_all(script,
                     "import sys, numpy as np\n"
                     "from safetensors.numpy import save_file\n"
                     "save_file({'b': np.array([1.0, 2.0], dtype=np.float32),\n"
                     "           'a': np.array([[7]], dtype=np.int64),\n"
                     "           'c': np.array([1, 2, 3], dtype=np.uint8)}, sys.argv[1], metadata={'format': 'pt'})\n");
  ASSERT_EQ(std::system((python + " " + script + " " + dir.file("python")).c_str()), 0);
  const std::vector<float> b = {1.0f, 2.0f};
  const std::vector<std::int64_t> a = {7};
  const std::vector<std::uint8_t> c = {1, 2, 3};
  write(dir.file("dufu"),
        std::vector<TensorRef>{{"b", Dtype::kF32, {2}, b.data()},
                               {"a", Dtype::kI64, {1, 1}, a.data()},
                               {"c", Dtype::kU8, {3}, c.data()}},
        Metadata{{"format", "pt"}});
  EXPECT_EQ(testing::read_all(dir.file("dufu")), testing::read_all(dir.file("python")));
}

TEST(Safetensors, WriterRefusesBadInputAndLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::vector<float> x = {1};
  const std::string duplicate = error_of([&] {
    write(path, std::vector<TensorRef>{{"x", Dtype::kF32, {1}, x.data()}, {"x", Dtype::kI32, {1}, x.data()}});
  });
  EXPECT_TRUE(Contains(duplicate, path));
  EXPECT_TRUE(Contains(duplicate, "two tensors are named \"x\""));
  EXPECT_TRUE(Contains(
      error_of([&] { write(path, std::vector<TensorRef>{{"__metadata__", Dtype::kF32, {1}, x.data()}}); }),
      "\"__metadata__\" is reserved"));
  EXPECT_TRUE(Contains(error_of([&] {
                         write(path, std::vector<TensorRef>{{"huge", Dtype::kF32, {1ULL << 40, 1ULL << 40}, x.data()}});
                       }),
                       "overflows"));
  EXPECT_TRUE(Contains(error_of([&] { write(path, std::vector<TensorRef>{{"x", Dtype::kF32, {1}, nullptr}}); }),
                       "has no data"));
  EXPECT_TRUE(dir.list().empty());
  EXPECT_TRUE(Contains(error_of([&] { write(dir.file("no/such/dir.safetensors"), std::span<const TensorRef>{}); }),
                       dir.file("no/such/dir.safetensors")));
}

class SafetensorsCorrupt : public ::testing::Test {
 protected:
  // The message of opening a file with these bytes; it must name the file.
  std::string open_error(const std::string& bytes) {
    const std::string path = dir_.file("corrupt.safetensors");
    testing::write_all(path, bytes);
    const std::string message = error_of_open(path);
    EXPECT_TRUE(Contains(message, path + ": invalid safetensors file: "));
    return message;
  }

  TempDir dir_;
};

const char kTwoTensors[] =
    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]}})";

TEST_F(SafetensorsCorrupt, AValidFileOpens) {
  const std::string path = dir_.file("ok.safetensors");
  testing::write_all(path, make_file(kTwoTensors, std::string(16, '\x01')));
  EXPECT_EQ(File::open(path).tensors().size(), 2U);
}

TEST_F(SafetensorsCorrupt, TruncatedFilesAreRefusedAtEveryLength) {
  TempDir dir;
  const std::vector<float> values = {1, 2, 3, 4};
  write(dir.file("full"), std::vector<TensorRef>{{"w", Dtype::kF32, {4}, values.data()}});
  const std::string full = testing::read_all(dir.file("full"));
  for (std::size_t size = 0; size < full.size(); ++size) {
    const std::string message = open_error(full.substr(0, size));
    if (size < 8) {
      EXPECT_TRUE(Contains(message, "fewer than the 8-byte header length")) << size;
    } else if (size < full.size() - 16) {
      EXPECT_TRUE(Contains(message, "truncated: the header length is")) << size;
    } else {
      EXPECT_TRUE(Contains(message, "run past the end of the data section")) << size;
      EXPECT_TRUE(Contains(message, "the file is truncated or corrupt")) << size;
    }
  }
}

TEST_F(SafetensorsCorrupt, BadJsonIsRefused) {
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32",)", "")), "the header is not valid JSON"));
  EXPECT_TRUE(Contains(open_error(make_file("{\"a\xff\":1}", "")), "not valid UTF-8"));
  EXPECT_TRUE(Contains(open_error(make_file("[1, 2]", "")), "does not start with '{'"));
  EXPECT_TRUE(Contains(open_error(make_file(" {}", "")), "does not start with '{'"));
  EXPECT_TRUE(Contains(open_error(le64(0)), "does not start with '{'"));
  EXPECT_TRUE(Contains(open_error(le64(1ULL << 40) + "{}"), "header length 1099511627776 is implausible"));
}

TEST_F(SafetensorsCorrupt, BadTensorEntriesAreRefused) {
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", "xxxx")),
                       "tensor \"a\": unknown dtype \"F31\""));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx")),
                       "tensor \"a\": shape must be an array of non-negative integers"));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", "xxxx")),
                       "shape must be an array of non-negative integers"));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "xxxx")),
                       "data_offsets must be two non-negative integers"));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1]}})", "xxxx")),
                       "must have the fields dtype, shape and data_offsets"));
  EXPECT_TRUE(Contains(
      open_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", "xxxx")),
      "unknown field \"extra\""));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx")),
                       "data_offsets [0, 4] hold 4 bytes, but shape [2] of F32 needs 8"));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "xxxx")),
                       "data_offsets [4, 0] end before they begin"));
  EXPECT_TRUE(Contains(open_error(make_file(
                           R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", "xxxx")),
                       "overflows"));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":[1]})", "")), "tensor \"a\" is described by an array"));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                            "xxxxxxxx")),
                       "two entries named \"a\""));
  EXPECT_TRUE(Contains(open_error(make_file(R"({"__metadata__":{"n":1}})", "")),
                       "__metadata__ entry \"n\" is an integer; metadata values must be strings"));
}

TEST_F(SafetensorsCorrupt, OverlappingOffsetsAreRefused) {
  const std::string message = open_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                                   std::string(12, 'x')));
  EXPECT_TRUE(Contains(message, "tensors \"a\" [0, 8] and \"b\" [4, 12] overlap"));
  // The same range twice is an overlap too.
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                            std::string(8, 'x'))),
                       "overlap"));
}

TEST_F(SafetensorsCorrupt, OffsetsPastTheEndAreRefused) {
  const std::string message = open_error(make_file(kTwoTensors, std::string(12, 'x')));
  EXPECT_TRUE(Contains(message, "tensor \"b\": data_offsets [8, 16] run past the end of the data section (12 bytes)"));
}

TEST_F(SafetensorsCorrupt, GapsAndTrailingBytesAreRefused) {
  EXPECT_TRUE(Contains(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "xxxxxxxx")),
                       "bytes [0, 4) of the data section belong to no tensor"));
  EXPECT_TRUE(Contains(open_error(make_file(kTwoTensors, std::string(20, 'x'))),
                       "bytes [16, 20) of the data section belong to no tensor"));
  EXPECT_TRUE(Contains(open_error(make_file("{}", "x")), "bytes [0, 1) of the data section belong to no tensor"));
}

TEST(Safetensors, UnpaddedFilesOpenButRefuseMisalignedTypedViews) {
  TempDir dir;
  const std::string path = dir.file("unpadded.safetensors");
  // Older writers did not pad the header: here the data section starts 8 + 54 + 7
  // bytes into the (page-aligned) mapping, so the float is misaligned.
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ASSERT_EQ(header.size(), 54U);
  testing::write_all(path, make_file(header + "       ", std::string("\0\0\x80\x3f", 4), /*pad=*/false));
  const File file = File::open(path);
  EXPECT_EQ(as_string(file.tensor("w").bytes), std::string("\0\0\x80\x3f", 4));
  const std::string message = error_of([&] { file.view<float>("w"); });
  EXPECT_TRUE(Contains(message, path));
  EXPECT_TRUE(Contains(message, "is not aligned for F32"));
}

}  // namespace
}  // namespace dufu::trainer::safetensors
