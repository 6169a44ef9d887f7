// Token dtypes: sizes, names and the on-disk codes shared by MMIDIDX and TNTIDX files
// (Megatron-core's table plus fairseq's 9 = uint32 and 10 = uint64).
#include "dufu/dataprep/dtype.h"

#include <array>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

struct DTypeInfo {
  DType dtype;
  std::size_t size;
  std::string_view name;
  bool integer;
};

// Indexed by code - 1; the codes are the file format, so this table is too.
constexpr std::array<DTypeInfo, 10> kDTypes{{
    {DType::kUInt8, 1, "uint8", true},
    {DType::kInt8, 1, "int8", true},
    {DType::kInt16, 2, "int16", true},
    {DType::kInt32, 4, "int32", true},
    {DType::kInt64, 8, "int64", true},
    {DType::kFloat64, 8, "float64", false},
    {DType::kFloat32, 4, "float32", false},
    {DType::kUInt16, 2, "uint16", true},
    {DType::kUInt32, 4, "uint32", true},
    {DType::kUInt64, 8, "uint64", true},
}};

const DTypeInfo& info(DType dtype) {
  const auto code = static_cast<std::size_t>(dtype);
  // An enum value outside the table can only come from a cast bug inside dufu.
  DUFU_CHECK(code >= 1 && code <= kDTypes.size(), "dtype code ", code);
  return kDTypes[code - 1];
}

}  // namespace

std::size_t dtype_size(DType dtype) { return info(dtype).size; }

std::string_view dtype_name(DType dtype) { return info(dtype).name; }

bool dtype_is_integer(DType dtype) { return info(dtype).integer; }

DType dtype_from_code(std::uint64_t code, std::string_view where) {
  if (code < 1 || code > kDTypes.size()) {
    DUFU_FAIL("unknown dtype code ", code, " in '", where,
              "' (known codes: 1-8 from Megatron, 9 = uint32 and 10 = uint64 from fairseq)");
  }
  return kDTypes[code - 1].dtype;
}

DType token_dtype_for_vocab(std::int64_t vocab_size) {
  if (vocab_size <= 0) DUFU_FAIL("vocabulary size must be positive, got ", vocab_size);
  // Megatron compares the unpadded vocabulary with 65500, not 65536; keeping its
  // threshold keeps our shards byte-identical to its preprocessor's.
  return vocab_size < 65500 ? DType::kUInt16 : DType::kInt32;
}

DType parse_dtype(std::string_view name) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  DUFU_FAIL("unknown dtype '", name,
            "' (expected one of uint8, int8, int16, uint16, int32, uint32, int64, uint64, "
            "float32, float64)");
}

}  // namespace dufu::dataprep
