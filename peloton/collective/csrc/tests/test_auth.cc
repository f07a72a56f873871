// The gang handshake's primitives (auth.h): HMAC-SHA256 against RFC 4231's test vectors, the
// constant-time comparison, fresh nonces.
#include "auth.h"

#include <cstdio>
#include <string>
#include <vector>

#include "doctest/doctest.h"

using namespace peloton;

namespace {

std::string hex(const Mac& mac) {
  std::string out;
  char byte[3];
  for (const unsigned char c : mac) {
    std::snprintf(byte, sizeof byte, "%02x", c);
    out += byte;
  }
  return out;
}

std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

}  // namespace

TEST_CASE("hmac_sha256 gives RFC 4231's HMAC-SHA-256 test vectors") {
  CHECK(hex(hmac_sha256(std::string(20, '\x0b'), bytes("Hi There"))) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hex(hmac_sha256("Jefe", bytes("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than SHA-256's block is hashed first.
  CHECK(hex(hmac_sha256(std::string(131, '\xaa'), bytes("Test Using Larger Than Block-Size Key - Hash Key First"))) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("same_mac tells equal MACs from MACs that differ anywhere") {
  const Mac a = hmac_sha256("k", bytes("m"));
  CHECK(same_mac(a, a));
  for (size_t i = 0; i < a.size(); i += 31) {
    Mac b = a;
    b[i] ^= 1;
    CHECK_FALSE(same_mac(a, b));
  }
}

TEST_CASE("fresh nonces differ") {
  CHECK(fresh_nonce() != fresh_nonce());
}
