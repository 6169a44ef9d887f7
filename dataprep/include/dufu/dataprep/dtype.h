// Token dtypes and their on-disk codes (Megatron-core table, fairseq's 9 and 10).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dufu::dataprep {

enum class DType : std::uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
  kUInt32 = 9,
  kUInt64 = 10,
};

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// Throws dufu::Error naming `where` (a file) for an unknown code.
DType dtype_from_code(std::uint64_t code, std::string_view where);
bool dtype_is_integer(DType dtype);
// Megatron's rule: uint16 when vocab_size < 65500 (unpadded), else int32.
DType token_dtype_for_vocab(std::int64_t vocab_size);
// Parses "uint16", "int32", ... ; throws on unknown names.
DType parse_dtype(std::string_view name);

}  // namespace dufu::dataprep
