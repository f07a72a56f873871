// TCP plumbing: listening, connecting with retries, tuned non-blocking sockets, framed messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace peloton {

// Listens at host:port (this rank's own address; every interface if it is not local); the
// caller owns the returned fd.
int listen_on(const std::string& host, int port);

// Connects to host:port, retrying refused connections until `deadline` (peers start in any order).
int connect_to(const std::string& host, int port, Clock::time_point deadline, int peer);

// Accepts one connection before `deadline`; returns -1 when it passes.
int accept_until(int listen_fd, Clock::time_point deadline);

// TCP_NODELAY, 4 MiB buffers, O_NONBLOCK: latency and bandwidth both matter here.
void tune_socket(int fd);

// Whole-buffer send/receive on a non-blocking socket; PeerError on close, reset or deadline.
void send_all(int fd, const void* buf, size_t len, Clock::time_point deadline, int peer);
void recv_all(int fd, void* buf, size_t len, Clock::time_point deadline, int peer);

// Little serialiser for control messages (both ends are this same build).
class Writer {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  const std::vector<char>& bytes() const { return buf_; }

 private:
  std::vector<char> buf_;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : buf_(b) {}
  uint8_t u8() { uint8_t v; raw(&v, 1); return v; }
  uint32_t u32() { uint32_t v; raw(&v, 4); return v; }
  int64_t i64() { int64_t v; raw(&v, 8); return v; }
  std::string str() {
    const uint32_t n = u32();
    std::string s(n, '\0');
    raw(s.data(), n);
    return s;
  }
  void raw(void* p, size_t n);

 private:
  const std::vector<char>& buf_;
  size_t pos_ = 0;
};

// A control message: [u32 length][u8 type][payload].
struct Message {
  uint8_t type = 0;
  std::vector<char> payload;
};
void send_message(int fd, uint8_t type, const Writer& w, Clock::time_point deadline, int peer);
// Returns false on a clean end of stream before the first byte of a message.
bool recv_message(int fd, Message* out, Clock::time_point deadline, int peer);

}  // namespace peloton
