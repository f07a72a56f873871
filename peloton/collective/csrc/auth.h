// The gang secret's handshake primitives: HMAC-SHA256 (OpenSSL's libcrypto, linked in
// statically by setup.py), fresh nonces, a constant-time comparison, and the record of
// connections the runtime refused (a stranger on a rank's port: logged once, counted).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace peloton {

constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32;
using Nonce = std::array<unsigned char, kNonceBytes>;
using Mac = std::array<unsigned char, kMacBytes>;

// 16 bytes from the operating system's random source (CollectiveError if it has none).
Nonce fresh_nonce();

// HMAC-SHA256 of `message` under `key`.
Mac hmac_sha256(const std::string& key, const std::vector<char>& message);

// Whether two MACs are equal, in time independent of where they differ.
bool same_mac(const Mac& a, const Mac& b);

// A connection this rank refused: one line on stderr naming the rank, the peer's address and
// the reason (never the secret, nor anything the peer sent), and one more in the count.
void refuse_connection(int rank, const std::string& address, const std::string& reason);

// Connections refused by this process so far.
uint64_t refused_connections();

}  // namespace peloton
