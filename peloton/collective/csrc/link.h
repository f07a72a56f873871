// The link interface: how the algorithms move bytes between ranks. The algorithms (ring_*.cc,
// broadcast_chain.cc, allreduce_local.cc) are written over it and hold no socket code; the
// transports (tcp_link.*, tests/mem_link.h) implement it.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

namespace peloton {

// Called with the number of bytes received so far, each time it grows (a receiver can start
// reducing what has landed while the rest is still moving).
using OnRecv = std::function<void(size_t received)>;

// Point-to-point links from this rank to each of its peers (peers are global ranks).
class Link {
 public:
  virtual ~Link() = default;

  // Sends `slen` bytes to `send_peer` while receiving `rlen` bytes from `recv_peer`, at once
  // (a ring step sends right and receives left; both may be the same peer). A peer of -1 means
  // no transfer that way. With `gate`, only bytes already received may be sent on: the send
  // buffer is the receive buffer, forwarded along a chain. Throws PeerError when a peer fails.
  virtual void exchange(int send_peer, const void* sbuf, size_t slen, int recv_peer, void* rbuf, size_t rlen,
                        bool gate, const OnRecv& on_recv) = 0;

  void send(int peer, const void* buf, size_t len) { exchange(peer, buf, len, -1, nullptr, 0, false, nullptr); }
  void recv(int peer, void* buf, size_t len) { exchange(-1, nullptr, 0, peer, buf, len, false, nullptr); }
};

// Ranks taking part in one ring, in ring order, and where this rank sits in it. The world ring
// is every rank; the hierarchical path's cross-host ring holds one rank per host.
struct Ring {
  std::vector<int> members;  // global ranks
  int me = 0;                // this rank's position in `members`

  int size() const { return static_cast<int>(members.size()); }
  int right() const { return members[static_cast<size_t>((me + 1) % size())]; }
  int left() const { return members[static_cast<size_t>((me - 1 + size()) % size())]; }
  static Ring world(int rank, int size) {
    Ring r;
    for (int j = 0; j < size; ++j) r.members.push_back(j);
    r.me = rank;
    return r;
  }
};

// For the transports: what else a transfer or barrier watches while it waits (the runtime's
// control channels, on which an abort or a failed peer arrives while the data is stuck).
struct Watch {
  std::function<std::vector<std::pair<int, int>>()> fds;  // (fd, peer) pairs to poll for input
  std::function<void(int peer)> ready;                    // one of them is readable (may throw)
};

}  // namespace peloton
