// Content digests for cache keys: a cache directory is named after the SHA-256 of a
// canonical description of every input that changes its contents.
#pragma once

#include <string>
#include <string_view>

namespace dufu {

// Lower-case hex SHA-256 of `bytes` (OpenSSL's libcrypto).
std::string sha256_hex(std::string_view bytes);

}  // namespace dufu
