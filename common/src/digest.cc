// SHA-256 through OpenSSL's one-shot EVP interface: cache keys are short strings, so
// there is no streaming API to maintain.
#include "dufu/common/digest.h"

#include <openssl/evp.h>

#include "dufu/common/error.h"

namespace dufu {

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    DUFU_FAIL("SHA-256 failed inside OpenSSL (EVP_Digest); is libcrypto's default provider available?");
  }
  static constexpr char kHexDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHexDigits[digest[i] >> 4]);
    hex.push_back(kHexDigits[digest[i] & 0x0f]);
  }
  return hex;
}

}  // namespace dufu
