// TCP plumbing: listening, connecting with retries, tuned non-blocking sockets, framed messages
// (their payloads are written and read with wire.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "wire.h"

namespace peloton {

// Listens at host:port (this rank's own address; every interface if it is not local); the
// caller owns the returned fd.
int listen_on(const std::string& host, int port);

// Connects to host:port, retrying refused connections until `deadline` (peers start in any order);
// gives up at once (CollectiveError) when `generation` ends meanwhile (see end_generation).
int connect_to(const std::string& host, int port, Clock::time_point deadline, int peer, uint32_t generation = 0);

// Accepts one connection before `deadline`; returns -1 when it passes. Gives up like connect_to.
// `address`, if given, is set to the peer's "ip:port".
int accept_until(int listen_fd, Clock::time_point deadline, uint32_t generation = 0,
                 std::string* address = nullptr);

// Elastic gangs: the membership of `generation` ended, say a member died while the others were
// still connecting. A rank connecting for that generation stops waiting for its peers (which may
// never come) and raises, so it can re-join the next one at once.
void end_generation(uint32_t generation);

// TCP_NODELAY, 4 MiB buffers, O_NONBLOCK: latency and bandwidth both matter here.
void tune_socket(int fd);

// Whole-buffer send/receive on a non-blocking socket; PeerError on close, reset or deadline.
void send_all(int fd, const void* buf, size_t len, Clock::time_point deadline, int peer);
void recv_all(int fd, void* buf, size_t len, Clock::time_point deadline, int peer);

// A control message: [u32 length][u8 type][payload].
struct Message {
  uint8_t type = 0;
  std::vector<char> payload;
};
void send_message(int fd, uint8_t type, const Writer& w, Clock::time_point deadline, int peer);
// Returns false on a clean end of stream before the first byte of a message.
bool recv_message(int fd, Message* out, Clock::time_point deadline, int peer);

}  // namespace peloton
