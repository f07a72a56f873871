#include "tcp_link.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "net.h"

namespace peloton {
namespace {

constexpr uint32_t kMagic = 0x504c5432;      // "PLT2": the hello carries the generation
constexpr uint32_t kMagicAuth = 0x504c5433;  // "PLT3": ... and a nonce; the gang secret's handshake
constexpr uint8_t kData = 0, kControl = 1;
constexpr size_t kMaxIo = 1 << 20;  // bytes per send/recv call: keeps both directions moving

}  // namespace

void TcpMesh::close() {
  for (int& fd : data) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  for (int& fd : ctrl) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

namespace {

// How an accepted connection's bytes came in: "" when all of them did, else why not.
std::string read_exact(int fd, void* buf, size_t len, Clock::time_point deadline, std::chrono::milliseconds limit) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::recv(fd, p + got, len - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return "it closed the connection after " + std::to_string(got) + " of " + std::to_string(len) + " bytes";
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return std::string("connection error (") + std::strerror(errno) + ")";
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, ms_left(deadline));
    if (r == 0) return "it was silent past the " + seconds_str(limit) + " handshake timeout";
    if (r < 0 && errno != EINTR) return std::string("poll: ") + std::strerror(errno);
  }
  return "";
}

// The bytes the two MACs of a handshake cover: a label (which side speaks), the dialler's hello
// (its rank, size, channel, generation and nonce), the acceptor's generation and nonce.
std::vector<char> transcript(const char* label, const std::vector<char>& hello, uint32_t generation,
                             const Nonce& nonce) {
  Writer w;
  w.str(label);
  w.raw(hello.data(), hello.size());
  w.u32(generation);
  w.raw(nonce.data(), nonce.size());
  return w.bytes();
}

constexpr const char* kAcceptorLabel = "peloton gang handshake v1: acceptor";
constexpr const char* kDiallerLabel = "peloton gang handshake v1: dialler";
constexpr size_t kHelloBytes = 17;  // magic, rank, size, channel, generation
constexpr size_t kAnswerBytes = 4 + kNonceBytes + kMacBytes;  // generation, nonce, MAC

// A connection refused: why, for refuse_connection.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

void connect_mesh(TcpMesh& mesh, int rank, int size, const std::vector<std::string>& hosts,
                  const std::vector<int>& ports, std::chrono::milliseconds timeout, uint32_t generation,
                  const std::string& secret) {
  const auto deadline = Clock::now() + timeout;
  const bool authenticated = !secret.empty();
  const uint32_t magic = authenticated ? kMagicAuth : kMagic;
  const auto handshake_limit = std::min(timeout, kHandshakeTimeout);
  auto stale = [&](int peer, uint32_t theirs) {
    return CollectiveError("rank " + std::to_string(rank) + " of generation " + std::to_string(generation) +
                           ": rank " + std::to_string(peer) + " is of generation " + std::to_string(theirs) +
                           " (a stale rank of an earlier gang, or this one is stale: re-join the gang)");
  };
  const auto self = static_cast<size_t>(rank);
  const int lfd = listen_on(hosts[self], ports[self]);
  auto hello = [&](int fd, uint8_t channel, int peer) {
    Writer w;
    w.u32(magic);
    w.u32(static_cast<uint32_t>(rank));
    w.u32(static_cast<uint32_t>(size));
    w.u8(channel);
    w.u32(generation);
    if (!authenticated) {
      send_all(fd, w.bytes().data(), w.bytes().size(), deadline, peer);
      // The acceptor answers with its generation: a dialler of another one learns it here.
      uint32_t theirs = 0;
      recv_all(fd, &theirs, sizeof theirs, deadline, peer);
      if (theirs != generation) throw stale(peer, theirs);
      return;
    }
    const Nonce mine = fresh_nonce();
    w.raw(mine.data(), mine.size());
    const std::vector<char> sent = w.bytes();
    send_all(fd, sent.data(), sent.size(), deadline, peer);
    char answer[kAnswerBytes];
    recv_all(fd, answer, sizeof answer, deadline, peer);
    uint32_t theirs;
    Nonce nonce;
    Mac mac;
    std::memcpy(&theirs, answer, 4);
    std::memcpy(nonce.data(), answer + 4, nonce.size());
    std::memcpy(mac.data(), answer + 4 + nonce.size(), mac.size());
    if (!same_mac(mac, hmac_sha256(secret, transcript(kAcceptorLabel, sent, theirs, nonce)))) {
      throw CollectiveError("rank " + std::to_string(rank) + ": whoever listens at rank " + std::to_string(peer) +
                            "'s address " + hosts[static_cast<size_t>(peer)] + ":" +
                            std::to_string(ports[static_cast<size_t>(peer)]) +
                            " does not hold the gang's secret (PELOTON_GANG_SECRET): not a rank of this gang");
    }
    // Answered even to an acceptor of another generation: it learns of the stale rank from an
    // authenticated peer, as this rank does below.
    const Mac proof = hmac_sha256(secret, transcript(kDiallerLabel, sent, theirs, nonce));
    send_all(fd, proof.data(), proof.size(), deadline, peer);
    if (theirs != generation) throw stale(peer, theirs);
    char ack = 0;
    recv_all(fd, &ack, 1, deadline, peer);
  };
  // The dialler of an accepted connection, once its hello (and proof) checked out: its rank and
  // channel. Refused for a connection that is no rank of this gang.
  auto admit = [&](int fd) -> std::pair<uint32_t, uint8_t> {
    const auto limit = std::min(deadline, Clock::now() + handshake_limit);
    std::vector<char> got(kHelloBytes);
    // The magic first: garbage is refused as soon as its first 4 bytes are in.
    std::string why = read_exact(fd, got.data(), 4, limit, handshake_limit);
    if (!why.empty()) throw Refused("an incomplete hello: " + why);
    uint32_t theirs_magic, peer, psize, theirs;
    std::memcpy(&theirs_magic, got.data(), 4);
    if (theirs_magic != magic) {
      if (theirs_magic == kMagic) throw Refused("an unauthenticated hello (the peer has no gang secret)");
      if (theirs_magic == kMagicAuth) throw Refused("an authenticated hello, but this rank has no gang secret");
      throw Refused("not a peloton hello");
    }
    why = read_exact(fd, got.data() + 4, kHelloBytes - 4, limit, handshake_limit);
    if (!why.empty()) throw Refused("an incomplete hello: " + why);
    std::memcpy(&peer, got.data() + 4, 4);
    std::memcpy(&psize, got.data() + 8, 4);
    const auto channel = static_cast<uint8_t>(got[12]);
    std::memcpy(&theirs, got.data() + 13, 4);
    if (authenticated) {
      got.resize(kHelloBytes + kNonceBytes);
      why = read_exact(fd, got.data() + kHelloBytes, kNonceBytes, limit, handshake_limit);
      if (!why.empty()) throw Refused("an incomplete hello: " + why);
      const Nonce nonce = fresh_nonce();
      const Mac mac = hmac_sha256(secret, transcript(kAcceptorLabel, got, generation, nonce));
      Writer w;
      w.u32(generation);
      w.raw(nonce.data(), nonce.size());
      w.raw(mac.data(), mac.size());
      try {
        send_all(fd, w.bytes().data(), w.bytes().size(), limit, -1);
      } catch (const PeerError&) {
        throw Refused("it did not take the challenge (closed or stalled)");
      }
      Mac proof;
      why = read_exact(fd, proof.data(), proof.size(), limit, handshake_limit);
      if (!why.empty()) throw Refused("no answer to the challenge: " + why);
      if (!same_mac(proof, hmac_sha256(secret, transcript(kDiallerLabel, got, generation, nonce)))) {
        throw Refused("a wrong MAC (not of this gang's secret, or a replayed handshake)");
      }
    } else {
      try {
        send_all(fd, &generation, sizeof generation, limit, -1);
      } catch (const PeerError&) {
        throw Refused("it did not take the answer to its hello (closed or stalled)");
      }
    }
    // A rank of this gang from here on (or a peer that copied an unauthenticated hello).
    if (theirs != generation) throw stale(static_cast<int>(peer), theirs);
    if (peer >= static_cast<uint32_t>(size) || static_cast<int>(psize) != size) {
      throw CollectiveError("rank " + std::to_string(rank) + ": a peer connected with a different gang (size " +
                            std::to_string(psize) + ", expected " + std::to_string(size) + ")");
    }
    if (authenticated) {
      const char ack = 1;
      send_all(fd, &ack, 1, deadline, static_cast<int>(peer));
    }
    return {peer, channel};
  };
  try {
    // Lower ranks are dialled (their listen backlog completes the connect), higher ranks dial us.
    for (int j = 0; j < rank; ++j) {
      const int fd =
          connect_to(hosts[static_cast<size_t>(j)], ports[static_cast<size_t>(j)], deadline, j, generation);
      tune_socket(fd);
      mesh.data[static_cast<size_t>(j)] = fd;
      hello(fd, kData, j);
    }
    if (rank > 0) {
      const int fd = connect_to(hosts[0], ports[0], deadline, 0, generation);
      tune_socket(fd);
      mesh.ctrl[0] = fd;
      hello(fd, kControl, 0);
    }
    int expected = (size - 1 - rank) + (rank == 0 ? size - 1 : 0);
    while (expected > 0) {
      std::string address;
      const int fd = accept_until(lfd, deadline, generation, &address);
      if (fd < 0) {
        std::vector<int> missing;
        for (int j = rank + 1; j < size; ++j) {
          if (mesh.data[static_cast<size_t>(j)] < 0) missing.push_back(j);
        }
        throw CollectiveError("rank " + std::to_string(rank) + ": ranks " + ranks_str(missing) +
                              " did not connect within " + seconds_str(timeout));
      }
      tune_socket(fd);
      std::pair<uint32_t, uint8_t> who;
      try {
        who = admit(fd);
      } catch (const Refused& r) {
        ::close(fd);
        refuse_connection(rank, address, r.what());
        continue;
      } catch (...) {
        ::close(fd);
        throw;
      }
      const auto [peer, channel] = who;
      auto& slot = channel == kControl ? mesh.ctrl[peer] : mesh.data[peer];
      if (slot >= 0) ::close(slot);
      else --expected;
      slot = fd;
    }
  } catch (...) {
    ::close(lfd);
    throw;
  }
  ::close(lfd);
}

// A side that makes no progress for the timeout, a closed peer, or a watched control channel
// whose message reports a failure ends the transfer with an exception.
void TcpLink::exchange(int sp, const void* sbuf_v, size_t slen, int rp, void* rbuf_v, size_t rlen, bool gate,
                       const OnRecv& on_recv) {
  const char* sbuf = static_cast<const char*>(sbuf_v);
  char* rbuf = static_cast<char*>(rbuf_v);
  const int sfd = sp >= 0 ? fds_[static_cast<size_t>(sp)] : -1;
  const int rfd = rp >= 0 ? fds_[static_cast<size_t>(rp)] : -1;
  size_t sd = 0, rd = 0;
  auto last = Clock::now();
  if (sp < 0) slen = 0;
  if (rp < 0) rlen = 0;
  while (sd < slen || rd < rlen) {
    bool moved = false;
    if (rd < rlen) {
      const ssize_t n = ::recv(rfd, rbuf + rd, std::min(rlen - rd, kMaxIo), 0);
      if (n > 0) {
        rd += static_cast<size_t>(n);
        moved = true;
        if (on_recv) on_recv(rd);
      } else if (n == 0) {
        throw PeerError(rp, "rank " + std::to_string(rp) + " closed the connection mid-transfer");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw PeerError(rp, "connection to rank " + std::to_string(rp) + " lost (" + std::strerror(errno) + ")");
      }
    }
    const size_t avail = gate ? std::min(rd, slen) : slen;
    if (sd < avail) {
      const ssize_t n = ::send(sfd, sbuf + sd, std::min(avail - sd, kMaxIo), MSG_NOSIGNAL);
      if (n > 0) {
        sd += static_cast<size_t>(n);
        moved = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw PeerError(sp, "connection to rank " + std::to_string(sp) + " lost (" + std::strerror(errno) + ")");
      }
    }
    if (moved) {
      last = Clock::now();
      continue;
    }
    std::vector<pollfd> fds;
    const bool want_out = sd < avail, want_in = rd < rlen;
    if (want_in && want_out && sfd == rfd) {
      fds.push_back({sfd, POLLIN | POLLOUT, 0});
    } else {
      if (want_in) fds.push_back({rfd, POLLIN, 0});
      if (want_out) fds.push_back({sfd, POLLOUT, 0});
    }
    const size_t ndata = fds.size();
    std::vector<int> peers;
    if (watch_.fds) {
      for (const auto& [fd, peer] : watch_.fds()) {
        fds.push_back({fd, POLLIN, 0});
        peers.push_back(peer);
      }
    }
    const int r = ::poll(fds.data(), fds.size(), ms_left(last + timeout_));
    if (r < 0 && errno != EINTR) throw CollectiveError(std::string("poll: ") + std::strerror(errno));
    if (r == 0) {
      const int who = want_in ? rp : sp;
      throw PeerError(who, std::string("rank ") + std::to_string(who) + (want_in ? " sent nothing" : " received nothing") +
                               " for " + seconds_str(timeout_) + " (stalled; missing ranks [" + std::to_string(who) + "])");
    }
    for (size_t i = ndata; i < fds.size(); ++i) {
      if (fds[i].revents) watch_.ready(peers[i - ndata]);
    }
  }
}

}  // namespace peloton
