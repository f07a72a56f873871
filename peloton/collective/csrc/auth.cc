#include "auth.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common.h"

namespace peloton {
namespace {

std::atomic<uint64_t> g_refused{0};

// libcrypto is linked in statically and runs inside arbitrary task images: it must not read
// the image's openssl.cnf (another OpenSSL's, which may name modules this one cannot load).
void init_crypto() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (OPENSSL_init_crypto(OPENSSL_INIT_NO_LOAD_CONFIG, nullptr) != 1) {
      throw CollectiveError("cannot initialize OpenSSL's libcrypto for the gang handshake");
    }
  });
}

}  // namespace

Nonce fresh_nonce() {
  init_crypto();
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    throw CollectiveError("no random bytes for the gang handshake's nonce");
  }
  return n;
}

Mac hmac_sha256(const std::string& key, const std::vector<char>& message) {
  init_crypto();
  Mac mac{};
  unsigned int len = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(message.data());
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data, message.size(), mac.data(), &len) ==
          nullptr ||
      len != mac.size()) {
    throw CollectiveError("HMAC-SHA256 failed in the gang handshake");
  }
  return mac;
}

bool same_mac(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

void refuse_connection(int rank, const std::string& address, const std::string& reason) {
  g_refused.fetch_add(1);
  std::fprintf(stderr, "peloton collective: rank %d refused a connection from %s: %s\n", rank, address.c_str(),
               reason.c_str());
  std::fflush(stderr);
}

uint64_t refused_connections() { return g_refused.load(); }

}  // namespace peloton
