#include "net.h"

#include <algorithm>
#include <atomic>

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace peloton {
namespace {

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30));
}

std::string errno_str(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Waits for `events` on fd; false when the deadline passed first.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_until(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw CollectiveError(errno_str("poll"));
  }
}

}  // namespace

namespace {

// The IPv4 address `host` names, if it resolves.
bool resolve(const std::string& host, in_addr* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  *out = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return true;
}

bool bind_to(int fd, in_addr ip, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr = ip;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

}  // namespace

int listen_on(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw CollectiveError(errno_str("socket"));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // This rank's own address first: hosts that share a machine (several loopback addresses, one
  // port range) then don't collide. An address that is not local (NAT) falls back to all.
  in_addr ip{};
  bool bound = false;
  bool fallback = true;
  if (resolve(host, &ip)) {
    bound = bind_to(fd, ip, port);
    fallback = !bound && errno == EADDRNOTAVAIL;
  }
  if (!bound && fallback) {
    ip.s_addr = htonl(INADDR_ANY);
    bound = bind_to(fd, ip, port);
  }
  if (!bound) {
    const std::string msg =
        "cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(errno);
    ::close(fd);
    throw CollectiveError(msg);
  }
  if (::listen(fd, 128) != 0) {
    ::close(fd);
    throw CollectiveError(errno_str("listen"));
  }
  return fd;
}

namespace {

// The generation that ended last (elastic gangs). Exactly that one: a process may take part in
// several gangs one after another (whose numbers need not increase), and a rank only ever
// connects for the generation it joined last.
std::atomic<int64_t> g_ended{-1};
// How often a wait for peers checks whether its generation ended.
constexpr auto kGenerationPoll = std::chrono::milliseconds(50);

void check_generation(uint32_t generation) {
  if (generation > 0 && g_ended.load() == static_cast<int64_t>(generation)) {
    throw CollectiveError("generation " + std::to_string(generation) +
                          " ended while this rank was connecting to its peers: re-join the gang");
  }
}

}  // namespace

void end_generation(uint32_t generation) { g_ended.store(generation); }

int connect_to(const std::string& host, int port, Clock::time_point deadline, int peer, uint32_t generation) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    throw CollectiveError("cannot resolve rank " + std::to_string(peer) + "'s host '" + host +
                          "': " + ::gai_strerror(rc));
  }
  sockaddr_in addr{};
  std::memcpy(&addr, res->ai_addr, sizeof addr);
  ::freeaddrinfo(res);
  std::string last = "no attempt";
  while (Clock::now() < deadline) {
    check_generation(generation);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw CollectiveError(errno_str("socket"));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    last = std::strerror(errno);
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the peer is not listening yet
  }
  throw PeerError(peer, "cannot connect to rank " + std::to_string(peer) + " at " + host + ":" +
                            std::to_string(port) + " (" + last + ")");
}

int accept_until(int listen_fd, Clock::time_point deadline, uint32_t generation, std::string* address) {
  for (;;) {
    check_generation(generation);
    // In slices, so that a generation that ends is noticed while waiting.
    const auto slice = generation > 0 ? std::min(deadline, Clock::now() + kGenerationPoll) : deadline;
    if (!wait_fd(listen_fd, POLLIN, slice)) {
      if (Clock::now() >= deadline) return -1;
      continue;
    }
    sockaddr_in from{};
    socklen_t from_len = sizeof from;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    if (fd >= 0) {
      if (address != nullptr) {
        char ip[INET_ADDRSTRLEN] = "?";
        ::inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
        *address = std::string(ip) + ":" + std::to_string(ntohs(from.sin_port));
      }
      return fd;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) throw CollectiveError(errno_str("accept"));
  }
}

void tune_socket(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Socket buffers are left to the kernel: a fixed SO_SNDBUF/SO_RCVBUF turns off its autotuning
  // (up to tcp_wmem/tcp_rmem max), which measured 1.5x slower at 64 MiB on loopback.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void send_all(int fd, const void* buf, size_t len, Clock::time_point deadline, int peer) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) {
        throw PeerError(peer, "rank " + std::to_string(peer) + " stopped receiving (timed out)");
      }
      continue;
    }
    throw PeerError(peer, "connection to rank " + std::to_string(peer) + " lost (" + std::strerror(errno) + ")");
  }
}

void recv_all(int fd, void* buf, size_t len, Clock::time_point deadline, int peer) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    const ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw PeerError(peer, "rank " + std::to_string(peer) + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) {
        throw PeerError(peer, "rank " + std::to_string(peer) + " sent nothing (timed out)");
      }
      continue;
    }
    throw PeerError(peer, "connection to rank " + std::to_string(peer) + " lost (" + std::strerror(errno) + ")");
  }
}

void send_message(int fd, uint8_t type, const Writer& w, Clock::time_point deadline, int peer) {
  std::vector<char> frame(5 + w.bytes().size());
  const uint32_t len = static_cast<uint32_t>(w.bytes().size());
  std::memcpy(frame.data(), &len, 4);
  frame[4] = static_cast<char>(type);
  if (!w.bytes().empty()) std::memcpy(frame.data() + 5, w.bytes().data(), w.bytes().size());
  send_all(fd, frame.data(), frame.size(), deadline, peer);
}

bool recv_message(int fd, Message* out, Clock::time_point deadline, int peer) {
  char head[5];
  ssize_t n;
  do {
    n = ::recv(fd, head, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return false;
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
    if (errno == ECONNRESET) return false;
    throw PeerError(peer, "connection to rank " + std::to_string(peer) + " lost (" + std::strerror(errno) + ")");
  }
  if (n < 0) recv_all(fd, head, 1, deadline, peer);
  recv_all(fd, head + 1, 4, deadline, peer);
  uint32_t len;
  std::memcpy(&len, head, 4);
  out->type = static_cast<uint8_t>(head[4]);
  out->payload.resize(len);
  if (len) recv_all(fd, out->payload.data(), len, deadline, peer);
  return true;
}

}  // namespace peloton
