#include "tcp_link.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"

namespace peloton {
namespace {

constexpr uint32_t kMagic = 0x504c5432;  // "PLT2": the hello carries the generation
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

void connect_mesh(TcpMesh& mesh, int rank, int size, const std::vector<std::string>& hosts,
                  const std::vector<int>& ports, std::chrono::milliseconds timeout, uint32_t generation) {
  const auto deadline = Clock::now() + timeout;
  auto stale = [&](int peer, uint32_t theirs) {
    return CollectiveError("rank " + std::to_string(rank) + " of generation " + std::to_string(generation) +
                           ": rank " + std::to_string(peer) + " is of generation " + std::to_string(theirs) +
                           " (a stale rank of an earlier gang, or this one is stale: re-join the gang)");
  };
  const auto self = static_cast<size_t>(rank);
  const int lfd = listen_on(hosts[self], ports[self]);
  auto hello = [&](int fd, uint8_t channel, int peer) {
    Writer w;
    w.u32(kMagic);
    w.u32(static_cast<uint32_t>(rank));
    w.u32(static_cast<uint32_t>(size));
    w.u8(channel);
    w.u32(generation);
    send_all(fd, w.bytes().data(), w.bytes().size(), deadline, peer);
    // The acceptor answers with its generation: a dialler of another one learns it here.
    uint32_t theirs = 0;
    recv_all(fd, &theirs, sizeof theirs, deadline, peer);
    if (theirs != generation) throw stale(peer, theirs);
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
      const int fd = accept_until(lfd, deadline, generation);
      if (fd < 0) {
        std::vector<int> missing;
        for (int j = rank + 1; j < size; ++j) {
          if (mesh.data[static_cast<size_t>(j)] < 0) missing.push_back(j);
        }
        throw CollectiveError("rank " + std::to_string(rank) + ": ranks " + ranks_str(missing) +
                              " did not connect within " + seconds_str(timeout));
      }
      tune_socket(fd);
      char buf[17];
      recv_all(fd, buf, sizeof buf, deadline, -1);
      uint32_t magic, peer, psize;
      std::memcpy(&magic, buf, 4);
      std::memcpy(&peer, buf + 4, 4);
      std::memcpy(&psize, buf + 8, 4);
      const uint8_t channel = static_cast<uint8_t>(buf[12]);
      uint32_t theirs;
      std::memcpy(&theirs, buf + 13, 4);
      if (magic != kMagic || peer >= static_cast<uint32_t>(size) || static_cast<int>(psize) != size) {
        ::close(fd);
        throw CollectiveError("rank " + std::to_string(rank) + ": a peer connected with a different gang (size " +
                              std::to_string(psize) + ", expected " + std::to_string(size) + ")");
      }
      try {
        send_all(fd, &generation, sizeof generation, deadline, static_cast<int>(peer));
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (theirs != generation) {
        ::close(fd);
        throw stale(static_cast<int>(peer), theirs);
      }
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
