// Tests for sha256_hex against the FIPS 180-2 vectors and bytes that a naive
// C-string implementation would get wrong (embedded NULs, every byte value).
#include "dufu/common/digest.h"

#include <string>

#include <gtest/gtest.h>

namespace dufu {
namespace {

TEST(Digest, Empty) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string_view()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Digest, Abc) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Digest, TwoBlockMessage) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Digest, MillionAs) {
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Digest, EmbeddedNulsAndEveryByteValue) {
  // Expected values from Python's hashlib.
  std::string nuls;
  for (int i = 0; i < 1000; ++i) nuls.append("a\0b", 3);
  EXPECT_EQ(sha256_hex(nuls), "e14d7405cd7567c6e59d03921812d352e2693fb48251471208e7225865711bf3");
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes.push_back(static_cast<char>(i));
  EXPECT_EQ(sha256_hex(all_bytes), "40aff2e9d2d8922e47afd4648e6967497158785fbd1da870e7110266bf944880");
}

TEST(Digest, LowerCaseHexOf64Characters) {
  const std::string hex = sha256_hex("dufu");
  ASSERT_EQ(hex.size(), 64u);
  for (const char c : hex) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << hex;
}

}  // namespace
}  // namespace dufu
