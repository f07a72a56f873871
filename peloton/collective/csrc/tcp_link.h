// The TCP transport: the full mesh of connections a gang sets up (a data connection between
// every pair of ranks, a control connection from every worker to rank 0) and TcpLink, the link
// interface over the data connections.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "link.h"

namespace peloton {

// Every connection of one rank; -1 where there is none. The caller closes them (close()).
struct TcpMesh {
  std::vector<int> data;  // per peer
  std::vector<int> ctrl;  // rank 0: one per worker; a worker: [0] to the coordinator
  void close();
};

// Listens on this rank's address, dials the lower ranks (and rank 0's control channel) and
// accepts the higher ones (and, on rank 0, every worker's control channel), within `timeout`.
// Throws CollectiveError naming the ranks that did not connect. `mesh` holds one slot per rank.
// Every connection carries the gang's `generation` (elastic training re-forms gangs under new
// ones) and the acceptor answers with its own: a peer of another generation is refused on both
// sides with a CollectiveError naming both, so a stale rank fails at once instead of hanging.
//
// With a `secret` (the gang's PELOTON_GANG_SECRET) every connection is authenticated both ways
// before it counts: the dialler's hello carries a fresh nonce, the acceptor answers with its own
// nonce and an HMAC-SHA256 under the secret of the hello, its generation and its nonce (the
// dialler checks it: the acceptor holds the secret), and the dialler answers with an HMAC of the
// same under another label (the acceptor checks it: fresh nonces on both sides make a replayed
// handshake fail); the acceptor then acknowledges it with one byte. A connection that fails
// this (garbage, a wrong MAC, no secret, silence past kHandshakeTimeout) is closed, logged once
// and counted (refuse_connection), and the acceptor goes on waiting for its peers. An acceptor
// that cannot prove the secret fails the dialler with a CollectiveError. Without a secret the
// hello is unauthenticated (a runtime started outside peloton), and malformed ones are refused
// the same way.
void connect_mesh(TcpMesh& mesh, int rank, int size, const std::vector<std::string>& hosts,
                  const std::vector<int>& ports, std::chrono::milliseconds timeout, uint32_t generation = 0,
                  const std::string& secret = "");

// How long an accepted connection may take to complete its hello (and, with a secret, its
// answer) before it is refused as silent; at most the gang's timeout.
constexpr std::chrono::milliseconds kHandshakeTimeout{5000};

class TcpLink : public Link {
 public:
  // `fds`: one connected, non-blocking socket per peer (indexed by rank), owned by the caller and
  // read at each call. A side that makes no progress for `timeout` fails the transfer.
  TcpLink(const std::vector<int>& fds, std::chrono::milliseconds timeout, Watch watch)
      : fds_(fds), timeout_(timeout), watch_(std::move(watch)) {}

  // Sends and receives at once on non-blocking sockets (two ranks use one socket both ways).
  void exchange(int send_peer, const void* sbuf, size_t slen, int recv_peer, void* rbuf, size_t rlen, bool gate,
                const OnRecv& on_recv) override;

 private:
  const std::vector<int>& fds_;
  std::chrono::milliseconds timeout_;
  Watch watch_;
};

}  // namespace peloton
