#include "runtime.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "reduce.h"

namespace peloton {
namespace {

constexpr uint32_t kMagic = 0x504c5431;  // "PLT1"
constexpr uint8_t kData = 0, kControl = 1;
enum Msg : uint8_t { REQUEST = 1, RESPONSE = 2, FAIL = 3, ABORT = 4, BYE = 5, BYE_ACK = 6 };
constexpr size_t kMaxIo = 1 << 20;       // bytes per send/recv call: keeps both directions moving
constexpr size_t kReduceChunk = 64 << 10;  // reduce as soon as this much has arrived
constexpr size_t kShmSlot = 4 << 20;       // bytes per local rank in the shared segment

// A peer reported a failure (FAIL) or the coordinator decided the verdict (ABORT).
struct RemoteFailure : std::runtime_error {
  int peer;
  RemoteFailure(int p, const std::string& w) : std::runtime_error(w), peer(p) {}
};
struct Aborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30));
}

void write_request(Writer& w, const Request& r) {
  w.str(r.name);
  w.u8(static_cast<uint8_t>(r.kind));
  w.u8(static_cast<uint8_t>(r.dtype));
  w.u8(static_cast<uint8_t>(r.op));
  w.u32(static_cast<uint32_t>(r.root));
  w.u32(static_cast<uint32_t>(r.shape.size()));
  for (int64_t d : r.shape) w.i64(d);
}

Request read_request(Reader& rd) {
  Request r;
  r.name = rd.str();
  r.kind = static_cast<Kind>(rd.u8());
  r.dtype = static_cast<DType>(rd.u8());
  r.op = static_cast<ROp>(rd.u8());
  r.root = static_cast<int>(rd.u32());
  r.shape.resize(rd.u32());
  for (auto& d : r.shape) d = rd.i64();
  return r;
}

void write_response(Writer& w, const Response& r) {
  w.u8(r.ok ? 1 : 0);
  w.u32(static_cast<uint32_t>(r.names.size()));
  for (const auto& n : r.names) w.str(n);
  w.str(r.error);
  w.u32(static_cast<uint32_t>(r.dim0s.size()));
  for (int64_t d : r.dim0s) w.i64(d);
}

Response read_response(Reader& rd) {
  Response r;
  r.ok = rd.u8() != 0;
  r.names.resize(rd.u32());
  for (auto& n : r.names) n = rd.str();
  r.error = rd.str();
  r.dim0s.resize(rd.u32());
  for (auto& d : r.dim0s) d = rd.i64();
  return r;
}

// Groups ranks by a per-rank description; empty when all agree, else "ranks [0, 2] X, ranks [1] Y".
std::string disagreement(const std::vector<std::string>& per_rank) {
  std::map<std::string, std::vector<int>> groups;
  for (size_t i = 0; i < per_rank.size(); ++i) groups[per_rank[i]].push_back(static_cast<int>(i));
  if (groups.size() <= 1) return "";
  std::vector<std::pair<std::vector<int>, std::string>> ordered;
  for (auto& [v, ranks] : groups) ordered.emplace_back(ranks, v);
  std::sort(ordered.begin(), ordered.end());
  std::string s;
  for (size_t i = 0; i < ordered.size(); ++i) {
    s += (i ? ", " : "") + std::string("ranks ") + ranks_str(ordered[i].first) + " sent " + ordered[i].second;
  }
  return s;
}

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------- setup and teardown

Runtime::Runtime(int rank, int size, const std::vector<std::string>& hosts, const std::vector<int>& ports,
                 double timeout_s, size_t fusion_threshold, int local_rank, int local_size, int cross_rank,
                 int cross_size)
    : rank_(rank),
      size_(size),
      local_rank_(local_rank),
      local_size_(local_size),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0))),
      fusion_threshold_(fusion_threshold),
      data_fd_(static_cast<size_t>(size), -1),
      ctrl_fd_(static_cast<size_t>(size), -1),
      bye_(static_cast<size_t>(size), false),
      gone_(static_cast<size_t>(size), false) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw CollectiveError("rank " + std::to_string(rank) + " is outside a gang of size " + std::to_string(size));
  }
  if (hosts.size() != static_cast<size_t>(size) || ports.size() != hosts.size()) {
    throw CollectiveError("peers lists " + std::to_string(hosts.size()) + " addresses for a gang of size " +
                          std::to_string(size));
  }
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw CollectiveError("pipe failed");
  for (int j = 0; j < size; ++j) world_.members.push_back(j);
  world_.me = rank;
  if (cross_rank < 0) cross_rank = rank / std::max(1, local_size);
  if (cross_size < 0) cross_size = size / std::max(1, local_size);
  // Shared memory needs the usual layout: each host's ranks contiguous, local ranks in order.
  const bool use_shm = local_size > 1 && cross_size * local_size == size &&
                       rank == cross_rank * local_size + local_rank && local_rank >= 0 && local_rank < local_size;
  if (!use_shm) local_size_ = 1, local_rank_ = 0;
  for (int c = 0; c < (use_shm ? cross_size : 0); ++c) cross_.members.push_back(c * local_size + local_rank);
  cross_.me = use_shm ? cross_rank : 0;
  try {
    if (use_shm && local_rank == 0) setup_shm(ports);
    if (size > 1) connect_mesh(hosts, ports);
    if (use_shm && local_rank != 0) setup_shm(ports);
    if (shm_) {
      local_barrier();  // everyone has mapped it: the name can go
      shm_->unlink();
    }
  } catch (...) {
    close_all();
    throw;
  }
  bg_ = std::thread([this] { loop(); });
}

Runtime::~Runtime() {
  try {
    shutdown();
  } catch (...) {
  }
}

void Runtime::connect_mesh(const std::vector<std::string>& hosts, const std::vector<int>& ports) {
  const auto deadline = Clock::now() + timeout_;
  const auto self = static_cast<size_t>(rank_);
  const int lfd = listen_on(hosts[self], ports[self]);
  auto hello = [&](int fd, uint8_t channel, int peer) {
    Writer w;
    w.u32(kMagic);
    w.u32(static_cast<uint32_t>(rank_));
    w.u32(static_cast<uint32_t>(size_));
    w.u8(channel);
    send_all(fd, w.bytes().data(), w.bytes().size(), deadline, peer);
  };
  try {
    // Lower ranks are dialled (their listen backlog completes the connect), higher ranks dial us.
    for (int j = 0; j < rank_; ++j) {
      const int fd = connect_to(hosts[static_cast<size_t>(j)], ports[static_cast<size_t>(j)], deadline, j);
      tune_socket(fd);
      data_fd_[static_cast<size_t>(j)] = fd;
      hello(fd, kData, j);
    }
    if (rank_ > 0) {
      const int fd = connect_to(hosts[0], ports[0], deadline, 0);
      tune_socket(fd);
      ctrl_fd_[0] = fd;
      hello(fd, kControl, 0);
    }
    int expected = (size_ - 1 - rank_) + (rank_ == 0 ? size_ - 1 : 0);
    while (expected > 0) {
      const int fd = accept_until(lfd, deadline);
      if (fd < 0) {
        std::vector<int> missing;
        for (int j = rank_ + 1; j < size_; ++j) {
          if (data_fd_[static_cast<size_t>(j)] < 0) missing.push_back(j);
        }
        throw CollectiveError("rank " + std::to_string(rank_) + ": ranks " + ranks_str(missing) +
                              " did not connect within " + seconds(timeout_));
      }
      tune_socket(fd);
      char buf[13];
      recv_all(fd, buf, sizeof buf, deadline, -1);
      uint32_t magic, peer, psize;
      std::memcpy(&magic, buf, 4);
      std::memcpy(&peer, buf + 4, 4);
      std::memcpy(&psize, buf + 8, 4);
      const uint8_t channel = static_cast<uint8_t>(buf[12]);
      if (magic != kMagic || peer >= static_cast<uint32_t>(size_) || static_cast<int>(psize) != size_) {
        ::close(fd);
        throw CollectiveError("rank " + std::to_string(rank_) + ": a peer connected with a different gang (size " +
                              std::to_string(psize) + ", expected " + std::to_string(size_) + ")");
      }
      auto& slot = channel == kControl ? ctrl_fd_[peer] : data_fd_[peer];
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

void Runtime::close_all() {
  for (int& fd : data_fd_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  for (int& fd : ctrl_fd_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void Runtime::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return;
    stopping_ = true;
  }
  const char c = 's';
  [[maybe_unused]] auto n = ::write(wake_[1], &c, 1);
  if (bg_.joinable()) bg_.join();
  close_all();
  std::lock_guard<std::mutex> lk(mu_);
  stopped_ = true;
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

// ---------------------------------------------------------------- caller side

int64_t Runtime::enqueue(const Request& req, const void* in, void* out, size_t nbytes) {
  auto e = std::make_shared<Entry>();
  e->req = req;
  e->in = static_cast<const char*>(in);
  e->out = static_cast<char*>(out);
  e->nbytes = nbytes;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!fatal_.empty()) {
      throw CollectiveError(std::string(kind_name(req.kind)) + " of tensor '" + req.name + "' failed: " + fatal_);
    }
    if (stopping_) throw CollectiveError("the collective runtime is shut down");
    if (!names_in_use_.insert(req.name).second) {
      throw CollectiveError("a collective named '" + req.name + "' is already in flight on rank " +
                            std::to_string(rank_) + "; names must be unique until synchronized");
    }
    e->handle = next_handle_++;
    by_handle_[e->handle] = e;
    submitted_.push_back(e);
  }
  const char c = 'e';
  [[maybe_unused]] auto n = ::write(wake_[1], &c, 1);
  return e->handle;
}

bool Runtime::poll(int64_t handle) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end()) throw CollectiveError("unknown or already synchronized handle");
  return it->second->done;
}

std::shared_ptr<Entry> Runtime::wait(int64_t handle) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end()) throw CollectiveError("unknown or already synchronized handle");
  auto e = it->second;
  cv_.wait(lk, [&] { return e->done; });
  by_handle_.erase(handle);
  names_in_use_.erase(e->req.name);  // a name is taken until its handle is synchronized
  if (!e->error.empty()) throw CollectiveError(e->error);
  return e;
}

void Runtime::complete(const std::shared_ptr<Entry>& e, const std::string& error) {
  in_flight_.erase(e->req.name);
  std::lock_guard<std::mutex> lk(mu_);
  e->error = error;
  e->done = true;
  cv_.notify_all();
}

// ---------------------------------------------------------------- background thread

void Runtime::loop() {
  try {
    while (true) {
      loop_once();
      if (shutdown_step()) break;
      idle_wait();
    }
    finish("the collective runtime is shut down");
  } catch (const Aborted& a) {
    finish(a.what());
  } catch (const RemoteFailure& f) {
    handle_failure(f.what(), f.peer, false);
  } catch (const PeerError& p) {
    handle_failure(p.what(), p.peer, true);
  } catch (const std::exception& ex) {
    handle_failure(ex.what(), -1, false);
  }
}

// Sends new requests to the coordinator (or tallies them on rank 0), then runs what is ready.
void Runtime::loop_once() {
  submit_new();
  if (rank_ == 0) {
    std::vector<Response> rs = coord_responses();
    coord_stalls(&rs);
    if (rs.empty()) return;
    Writer w;
    w.u32(static_cast<uint32_t>(rs.size()));
    for (const auto& r : rs) write_response(w, r);
    const auto deadline = Clock::now() + timeout_;
    for (int j = 1; j < size_; ++j) {
      if (!gone_[static_cast<size_t>(j)]) send_message(ctrl_fd_[static_cast<size_t>(j)], RESPONSE, w, deadline, j);
    }
    for (const auto& r : rs) execute(r);
  } else {
    while (!queued_.empty()) {
      Response r = std::move(queued_.front());
      queued_.pop_front();
      execute(r);
    }
  }
}

void Runtime::submit_new() {
  std::deque<std::shared_ptr<Entry>> fresh;
  {
    std::lock_guard<std::mutex> lk(mu_);
    fresh.swap(submitted_);
  }
  if (fresh.empty()) return;
  if (in_flight_.empty()) heard_ = Clock::now();  // the watchdog counts from the first request
  for (auto& e : fresh) in_flight_[e->req.name] = e;
  if (rank_ == 0) {
    for (auto& e : fresh) coord_add(0, e->req);
    return;
  }
  Writer w;
  w.u32(static_cast<uint32_t>(fresh.size()));
  for (auto& e : fresh) write_request(w, e->req);
  send_message(ctrl_fd_[0], REQUEST, w, Clock::now() + timeout_, 0);
}

// Sleeps until a caller submits, a control message arrives, or a stall deadline passes.
void Runtime::idle_wait() {
  if (!queued_.empty() || !ready_.empty()) return;
  std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
  std::vector<int> peers{-1};
  for (int j = 0; j < size_; ++j) {
    const int fd = ctrl_fd_[static_cast<size_t>(j)];
    if (fd >= 0 && !gone_[static_cast<size_t>(j)]) {
      fds.push_back({fd, POLLIN, 0});
      peers.push_back(j);
    }
  }
  int wait_ms = -1;
  if (rank_ == 0 && !table_.empty()) wait_ms = 50;  // stall checks
  if (rank_ != 0 && !in_flight_.empty()) wait_ms = 100;  // coordinator watchdog
  if (stopping_) wait_ms = 50;
  const int r = ::poll(fds.data(), fds.size(), wait_ms);
  if (r < 0 && errno != EINTR) throw CollectiveError(std::string("poll: ") + std::strerror(errno));
  // The coordinator answers every request within the timeout (stalls become errors), so a
  // coordinator silent for twice that is frozen: give up rather than wait forever.
  if (rank_ != 0 && !in_flight_.empty() && Clock::now() - heard_ > 2 * timeout_) {
    throw PeerError(0, "rank 0 (the coordinator) has not answered for " + seconds(2 * timeout_) +
                           " (missing ranks [0])");
  }
  if (r <= 0) return;
  if (fds[0].revents) {
    char buf[256];
    while (::read(wake_[0], buf, sizeof buf) > 0) {
    }
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents) read_control(peers[i]);
  }
}

// Reads one control message from `peer` (a worker on rank 0, the coordinator elsewhere).
void Runtime::read_control(int peer) {
  Message m;
  const int fd = ctrl_fd_[static_cast<size_t>(peer)];
  const bool got = recv_message(fd, &m, Clock::now() + timeout_, peer);
  if (rank_ == 0) {
    if (!got) {
      gone_[static_cast<size_t>(peer)] = true;
      if (bye_[static_cast<size_t>(peer)]) return;
      throw PeerError(peer, "rank " + std::to_string(peer) + " died or lost its connection");
    }
    Reader rd(m.payload);
    if (m.type == REQUEST) {
      const uint32_t n = rd.u32();
      for (uint32_t i = 0; i < n; ++i) coord_add(peer, read_request(rd));
    } else if (m.type == FAIL) {
      throw RemoteFailure(peer, rd.str());
    } else if (m.type == BYE) {
      bye_[static_cast<size_t>(peer)] = true;
      coord_forget_rank(peer);
    }
    return;
  }
  if (!got) throw PeerError(0, "rank 0 (the coordinator) died or lost its connection");
  heard_ = Clock::now();
  Reader rd(m.payload);
  if (m.type == RESPONSE) {
    const uint32_t n = rd.u32();
    for (uint32_t i = 0; i < n; ++i) queued_.push_back(read_response(rd));
  } else if (m.type == ABORT) {
    throw Aborted(rd.str());
  } else if (m.type == BYE_ACK) {
    bye_acked_ = true;
  }
}

// Returns true when the thread should exit after a clean shutdown.
bool Runtime::shutdown_step() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopping_) return false;
  }
  if (!bye_sent_) {
    bye_sent_ = true;
    stop_deadline_ = Clock::now() + timeout_;
    // Anything still in flight here will never complete: fail it now rather than at exit.
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& e : submitted_) in_flight_[e->req.name] = e;
      submitted_.clear();
    }
    std::vector<std::shared_ptr<Entry>> open;
    for (auto& [name, e] : in_flight_) open.push_back(e);
    for (auto& e : open) complete(e, std::string(kind_name(e->req.kind)) + " of tensor '" + e->req.name +
                                         "' failed: the collective runtime was shut down");
    if (rank_ == 0) {
      bye_[0] = true;
      coord_forget_rank(0);
    } else {
      send_message(ctrl_fd_[0], BYE, Writer(), stop_deadline_, 0);
    }
  }
  if (size_ == 1) return true;
  if (rank_ != 0) return bye_acked_ || Clock::now() >= stop_deadline_;
  bool all = true;
  for (int j = 1; j < size_; ++j) all = all && (bye_[static_cast<size_t>(j)] || gone_[static_cast<size_t>(j)]);
  if (!all && Clock::now() < stop_deadline_) return false;
  for (int j = 1; j < size_; ++j) {
    if (gone_[static_cast<size_t>(j)]) continue;
    try {
      send_message(ctrl_fd_[static_cast<size_t>(j)], BYE_ACK, Writer(), Clock::now() + std::chrono::seconds(1), j);
    } catch (const std::exception&) {
    }
  }
  return true;
}

// A transfer or a peer failed: agree on one verdict through rank 0, then fail everything.
void Runtime::handle_failure(const std::string& reason, int failed_peer, bool peer_closed) {
  std::string verdict = reason;
  try {
    if (rank_ == 0) {
      verdict = coordinator_verdict(reason, failed_peer, peer_closed);
    } else if (!(failed_peer == 0 && peer_closed)) {
      Writer w;
      w.str(reason);
      const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(2);
      send_message(ctrl_fd_[0], FAIL, w, deadline, 0);
      Message m;
      while (ms_left(deadline) > 0) {
        pollfd p{ctrl_fd_[0], POLLIN, 0};
        if (::poll(&p, 1, ms_left(deadline)) <= 0) break;
        if (!recv_message(ctrl_fd_[0], &m, deadline, 0)) break;
        if (m.type == ABORT) {
          Reader rd(m.payload);
          verdict = rd.str();
          break;
        }
      }
    }
  } catch (const std::exception&) {
    // The verdict could not be agreed on; this rank's own reason stands.
  }
  finish(verdict);
}

std::string Runtime::coordinator_verdict(const std::string& reason, int failed_peer, bool peer_closed) {
  std::set<int> dead, reported;
  if (failed_peer > 0 && peer_closed && gone_[static_cast<size_t>(failed_peer)]) dead.insert(failed_peer);
  if (failed_peer > 0 && !peer_closed) reported.insert(failed_peer);
  // Give the others a moment to report: a dead rank closes every socket at once, so its control
  // connection tells us who died (the neighbours only see their side of the ring break).
  const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(2));
  std::string first_report;
  while (ms_left(deadline) > 0) {
    std::vector<pollfd> fds;
    std::vector<int> peers;
    for (int j = 1; j < size_; ++j) {
      if (gone_[static_cast<size_t>(j)] || bye_[static_cast<size_t>(j)] || dead.count(j) || reported.count(j)) continue;
      fds.push_back({ctrl_fd_[static_cast<size_t>(j)], POLLIN, 0});
      peers.push_back(j);
    }
    if (fds.empty()) break;
    if (::poll(fds.data(), fds.size(), ms_left(deadline)) <= 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int j = peers[i];
      Message m;
      bool got = false;
      try {
        got = recv_message(ctrl_fd_[static_cast<size_t>(j)], &m, Clock::now() + std::chrono::seconds(1), j);
      } catch (const std::exception&) {
      }
      if (!got) {
        gone_[static_cast<size_t>(j)] = true;
        dead.insert(j);
      } else if (m.type == FAIL) {
        reported.insert(j);
        if (first_report.empty()) {
          Reader rd(m.payload);
          first_report = rd.str();
        }
      }
    }
  }
  std::string verdict;
  if (!dead.empty()) {
    std::vector<int> d(dead.begin(), dead.end());
    verdict = (d.size() == 1 ? "rank " + std::to_string(d[0]) : "ranks " + ranks_str(d)) +
              " died or lost the connection (missing ranks " + ranks_str(d) + ")";
  } else {
    verdict = reason;
  }
  Writer w;
  w.str(verdict);
  for (int j = 1; j < size_; ++j) {
    if (gone_[static_cast<size_t>(j)] || dead.count(j)) continue;
    try {
      send_message(ctrl_fd_[static_cast<size_t>(j)], ABORT, w, Clock::now() + std::chrono::seconds(1), j);
    } catch (const std::exception&) {
    }
  }
  return verdict;
}

void Runtime::finish(const std::string& verdict) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (verdict != "the collective runtime is shut down" || fatal_.empty()) fatal_ = verdict;
    for (auto& e : submitted_) in_flight_[e->req.name] = e;
    submitted_.clear();
  }
  std::vector<std::shared_ptr<Entry>> open;
  for (auto& [name, e] : in_flight_) open.push_back(e);
  for (auto& e : open) complete(e, std::string(kind_name(e->req.kind)) + " of tensor '" + e->req.name + "' failed: " + verdict);
  close_all();
}

// ---------------------------------------------------------------- coordinator

void Runtime::coord_add(int from, const Request& r) {
  Pending& p = table_[r.name];
  if (p.per_rank.empty()) {
    p.per_rank.resize(static_cast<size_t>(size_));
    p.first = Clock::now();
  }
  auto& slot = p.per_rank[static_cast<size_t>(from)];
  if (!slot) ++p.count;
  slot = std::make_unique<Request>(r);
  if (p.count == size_) ready_.push_back(r.name);
}

// A rank that leaves can never complete what it had asked for.
void Runtime::coord_forget_rank(int r) {
  for (auto& [name, p] : table_) {
    auto& slot = p.per_rank[static_cast<size_t>(r)];
    if (slot) {
      slot.reset();
      --p.count;
    }
  }
}

Response Runtime::coord_check(const std::string& name, Pending& p) {
  Response resp;
  resp.names.push_back(name);
  const Request& r0 = *p.per_rank[0];
  auto field = [&](auto describe) {
    std::vector<std::string> v;
    for (auto& r : p.per_rank) v.push_back(describe(*r));
    return disagreement(v);
  };
  std::string what = field([](const Request& r) { return std::string(kind_name(r.kind)); });
  std::string label = "collective";
  if (what.empty()) {
    label = kind_name(r0.kind);
    if ((what = field([](const Request& r) { return std::string(dtype_name(r.dtype)); })).empty()) {
      if (r0.kind == Kind::ALLREDUCE || r0.kind == Kind::REDUCE_SCATTER) {
        what = field([](const Request& r) { return "op " + std::string(op_name(r.op)); });
      }
      if (what.empty() && r0.kind == Kind::BROADCAST) {
        what = field([](const Request& r) { return "root_rank " + std::to_string(r.root); });
      }
      if (what.empty() && r0.kind == Kind::ALLGATHER) {
        what = field([](const Request& r) {
          return "trailing shape " + shape_str(std::vector<int64_t>(r.shape.begin() + (r.shape.empty() ? 0 : 1), r.shape.end()));
        });
      } else if (what.empty() && r0.kind != Kind::BARRIER) {
        what = field([](const Request& r) { return "shape " + shape_str(r.shape); });
      }
    }
  }
  if (!what.empty()) {
    resp.ok = false;
    resp.error = label + " of tensor '" + name + "': mismatch across ranks: " + what;
    return resp;
  }
  if (r0.kind == Kind::ALLGATHER) {
    for (auto& r : p.per_rank) resp.dim0s.push_back(r->shape.empty() ? 1 : r->shape[0]);
  }
  return resp;
}

std::vector<Response> Runtime::coord_responses() {
  std::vector<Response> out;
  size_t fused_bytes = 0;
  DType fused_dt = DType::F32;
  ROp fused_op = ROp::SUM;
  bool can_fuse = false;
  while (!ready_.empty()) {
    const std::string name = ready_.front();
    ready_.pop_front();
    auto it = table_.find(name);
    if (it == table_.end()) continue;
    Response r = coord_check(name, it->second);
    const Request req = *it->second.per_rank[0];
    table_.erase(it);
    if (!r.ok || req.kind != Kind::ALLREDUCE) {
      out.push_back(std::move(r));
      can_fuse = false;
      continue;
    }
    size_t bytes = dtype_size(req.dtype);
    for (int64_t d : req.shape) bytes *= static_cast<size_t>(d);
    // Small allreduces of one dtype and op share one ring pass through the fusion buffer.
    if (can_fuse && req.dtype == fused_dt && req.op == fused_op && fused_bytes + bytes <= fusion_threshold_) {
      out.back().names.push_back(name);
      fused_bytes += bytes;
      continue;
    }
    out.push_back(std::move(r));
    can_fuse = true;
    fused_bytes = bytes;
    fused_dt = req.dtype;
    fused_op = req.op;
  }
  return out;
}

void Runtime::coord_stalls(std::vector<Response>* out) {
  const auto now = Clock::now();
  for (auto it = table_.begin(); it != table_.end();) {
    Pending& p = it->second;
    if (p.count == 0) {
      it = table_.erase(it);
      continue;
    }
    if (now - p.first < timeout_) {
      ++it;
      continue;
    }
    std::vector<int> have, missing;
    Kind kind = Kind::ALLREDUCE;
    for (int j = 0; j < size_; ++j) {
      if (p.per_rank[static_cast<size_t>(j)]) {
        have.push_back(j);
        kind = p.per_rank[static_cast<size_t>(j)]->kind;
      } else {
        missing.push_back(j);
      }
    }
    Response r;
    r.ok = false;
    r.names.push_back(it->first);
    r.error = std::string(kind_name(kind)) + " of tensor '" + it->first + "' timed out after " + seconds(timeout_) +
              ": submitted by ranks " + ranks_str(have) + ", missing ranks " + ranks_str(missing);
    out->push_back(std::move(r));
    it = table_.erase(it);
  }
}

// ---------------------------------------------------------------- execution

void Runtime::execute(const Response& resp) {
  std::vector<std::shared_ptr<Entry>> es;
  for (const auto& n : resp.names) {
    auto it = in_flight_.find(n);
    if (it != in_flight_.end()) es.push_back(it->second);
  }
  if (!resp.ok) {
    for (auto& e : es) complete(e, resp.error);
    return;
  }
  if (es.size() != resp.names.size()) throw CollectiveError("response for a tensor this rank never submitted");
  if (es.empty()) return;
  Entry& e = *es[0];
  switch (e.req.kind) {
    case Kind::ALLREDUCE: exec_allreduce(es); break;
    case Kind::ALLGATHER: exec_allgather(e, resp.dim0s); break;
    case Kind::BROADCAST: exec_broadcast(e); break;
    case Kind::REDUCE_SCATTER: exec_reduce_scatter(e); break;
    case Kind::BARRIER: break;  // negotiation itself waited for every rank
  }
  for (auto& x : es) complete(x, "");
}

void Runtime::exec_allreduce(const std::vector<std::shared_ptr<Entry>>& es) {
  const DType dt = es[0]->req.dtype;
  const ROp op = es[0]->req.op;
  const size_t esz = dtype_size(dt);
  if (es.size() == 1) {
    Entry& e = *es[0];
    if (e.in != e.out && e.nbytes) std::memcpy(e.out, e.in, e.nbytes);
    allreduce_buffer(e.out, e.nbytes / esz, dt, op);
    if (op == ROp::AVERAGE) divide_by(e.out, e.nbytes / esz, dt, size_);
    return;
  }
  size_t total = 0;
  for (auto& e : es) total += e->nbytes;
  if (fusion_.size() < total) fusion_.resize(total);
  size_t off = 0;
  for (auto& e : es) {
    if (e->nbytes) std::memcpy(fusion_.data() + off, e->in, e->nbytes);
    off += e->nbytes;
  }
  allreduce_buffer(fusion_.data(), total / esz, dt, op);
  if (op == ROp::AVERAGE) divide_by(fusion_.data(), total / esz, dt, size_);
  off = 0;
  for (auto& e : es) {
    if (e->nbytes) std::memcpy(e->out, fusion_.data() + off, e->nbytes);
    off += e->nbytes;
  }
}

void Runtime::exec_allgather(Entry& e, const std::vector<int64_t>& dim0s) {
  const int64_t my0 = e.req.shape.empty() ? 1 : e.req.shape[0];
  size_t row = dtype_size(e.req.dtype);
  for (size_t i = 1; i < e.req.shape.size(); ++i) row *= static_cast<size_t>(e.req.shape[i]);
  std::vector<size_t> off(static_cast<size_t>(size_)), len(static_cast<size_t>(size_));
  size_t total = 0;
  for (int j = 0; j < size_; ++j) {
    off[static_cast<size_t>(j)] = total;
    len[static_cast<size_t>(j)] = static_cast<size_t>(dim0s[static_cast<size_t>(j)]) * row;
    total += len[static_cast<size_t>(j)];
  }
  (void)my0;
  e.gathered.resize(total);
  e.dim0s = dim0s;
  if (e.nbytes) std::memcpy(e.gathered.data() + off[static_cast<size_t>(rank_)], e.in, e.nbytes);
  ring_allgather(e.gathered.data(), off, len);
}

void Runtime::exec_broadcast(Entry& e) {
  if (e.in != e.out && e.nbytes && rank_ == e.req.root) std::memcpy(e.out, e.in, e.nbytes);
  if (size_ == 1 || e.nbytes == 0) return;
  // A pipelined chain root → root+1 → …: every link carries the data once.
  const int pos = (rank_ - e.req.root + size_) % size_;
  const int right = (rank_ + 1) % size_, left = (rank_ - 1 + size_) % size_;
  const bool sends = pos != size_ - 1;
  if (pos == 0) {
    duplex(right, e.out, e.nbytes, -1, nullptr, 0, false, nullptr);
  } else {
    duplex(sends ? right : -1, e.out, sends ? e.nbytes : 0, left, e.out, e.nbytes, true, nullptr);
  }
}

void Runtime::exec_reduce_scatter(Entry& e) {
  const DType dt = e.req.dtype;
  const size_t esz = dtype_size(dt);
  const int64_t rows = e.req.shape.empty() ? 1 : e.req.shape[0];
  const size_t row = rows ? e.nbytes / static_cast<size_t>(rows) : 0;
  std::vector<size_t> off(static_cast<size_t>(size_)), len(static_cast<size_t>(size_));
  size_t at = 0;
  for (int j = 0; j < size_; ++j) {
    const int64_t mine = rows / size_ + (j < rows % size_ ? 1 : 0);
    off[static_cast<size_t>(j)] = at;
    len[static_cast<size_t>(j)] = static_cast<size_t>(mine) * row;
    at += len[static_cast<size_t>(j)];
  }
  std::vector<char> work(e.in, e.in + e.nbytes);
  ring_reduce_scatter(work.data(), off, len, dt, e.req.op);
  const size_t mine = len[static_cast<size_t>(rank_)];
  char* dst = e.out;
  if (mine) std::memcpy(dst, work.data() + off[static_cast<size_t>(rank_)], mine);
  if (e.req.op == ROp::AVERAGE) divide_by(dst, mine / esz, dt, size_);
}

void Runtime::setup_shm(const std::vector<int>& ports) {
  const int root = rank_ - local_rank_;
  const std::string name = "/peloton-" + std::to_string(ports[static_cast<size_t>(root)]) + "-" +
                           std::to_string(ports[0]) + "-" + std::to_string(root);
  shm_ = std::make_unique<LocalShm>(name, local_rank_ == 0, local_rank_, local_size_, kShmSlot);
}

void Runtime::allreduce_buffer(char* buf, size_t count, DType dt, ROp op) {
  if (shm_) {
    shm_allreduce(buf, count, dt, op);
  } else {
    ring_allreduce(buf, count, dt, op);
  }
}

// Hierarchical allreduce through the host's shared memory, chunk by chunk: every local rank copies
// its chunk into its slot; local rank p reduces part p of all slots into slot 0 and, with several
// hosts, allreduces that part over TCP with local rank p of every other host; then everyone
// copies slot 0 out.
void Runtime::shm_allreduce(char* buf, size_t count, DType dt, ROp op) {
  const size_t esz = dtype_size(dt);
  const size_t chunk = shm_->slot_bytes() / esz;
  const size_t L = static_cast<size_t>(local_size_);
  const size_t me = static_cast<size_t>(local_rank_);
  char* result = shm_->slot(0);
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    std::memcpy(shm_->slot(local_rank_), buf + first * esz, n * esz);
    local_barrier();
    const size_t part_off = n / L * me + std::min(me, n % L);
    const size_t part_len = n / L + (me < n % L ? 1 : 0);
    for (int i = 1; i < local_size_; ++i) {
      reduce_into(result + part_off * esz, shm_->slot(i) + part_off * esz, part_len, dt, op);
    }
    ring_allreduce_in(cross_, result + part_off * esz, part_len, dt, op);
    local_barrier();
    std::memcpy(buf + first * esz, result, n * esz);
    local_barrier();
  }
}

// Waits for every local rank to arrive; watches the control channel meanwhile (an ABORT or a
// dead peer ends the wait) and names the local ranks that never came.
void Runtime::local_barrier() {
  ++epoch_;
  shm_->arrived(local_rank_).store(epoch_, std::memory_order_release);
  const auto start = Clock::now();
  for (uint64_t spin = 0;; ++spin) {
    int missing = -1;
    for (int i = 0; i < local_size_ && missing < 0; ++i) {
      if (shm_->arrived(i).load(std::memory_order_acquire) < epoch_) missing = i;
    }
    if (missing < 0) return;
    if (spin < 200) continue;
    std::this_thread::yield();
    if (spin % 64 != 0) continue;
    std::vector<pollfd> fds;
    std::vector<int> peers;
    for (int j = 0; j < size_; ++j) {
      const int fd = ctrl_fd_[static_cast<size_t>(j)];
      if (fd >= 0 && !gone_[static_cast<size_t>(j)]) {
        fds.push_back({fd, POLLIN, 0});
        peers.push_back(j);
      }
    }
    if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents) read_control(peers[i]);
      }
    }
    if (Clock::now() - start > timeout_) {
      std::vector<int> late;
      for (int i = 0; i < local_size_; ++i) {
        if (shm_->arrived(i).load(std::memory_order_acquire) < epoch_) late.push_back(rank_ - local_rank_ + i);
      }
      throw PeerError(late.empty() ? -1 : late[0], "ranks " + ranks_str(late) +
                                                       " did not reach the shared-memory barrier within " +
                                                       seconds(timeout_) + " (missing ranks " + ranks_str(late) + ")");
    }
  }
}

void Runtime::ring_allreduce(char* buf, size_t count, DType dt, ROp op) {
  ring_allreduce_in(world_, buf, count, dt, op);
}

void Runtime::ring_allreduce_in(const Ring& g, char* buf, size_t count, DType dt, ROp op) {
  const size_t n = g.members.size();
  if (n <= 1 || count == 0) return;
  const size_t esz = dtype_size(dt);
  std::vector<size_t> off(n), len(n);
  size_t at = 0;
  for (size_t j = 0; j < n; ++j) {
    const size_t c = count / n + (j < count % n ? 1 : 0);
    off[j] = at * esz;
    len[j] = c * esz;
    at += c;
  }
  ring_reduce_scatter_in(g, buf, off, len, dt, op);
  ring_allgather_in(g, buf, off, len);
}

void Runtime::ring_reduce_scatter(char* buf, const std::vector<size_t>& off, const std::vector<size_t>& len,
                                  DType dt, ROp op) {
  ring_reduce_scatter_in(world_, buf, off, len, dt, op);
}

void Runtime::ring_allgather(char* buf, const std::vector<size_t>& off, const std::vector<size_t>& len) {
  ring_allgather_in(world_, buf, off, len);
}

// After n-1 steps the member at position p holds the full reduction of segment p.
void Runtime::ring_reduce_scatter_in(const Ring& g, char* buf, const std::vector<size_t>& off,
                                     const std::vector<size_t>& len, DType dt, ROp op) {
  const int n = static_cast<int>(g.members.size());
  if (n <= 1) return;
  const size_t esz = dtype_size(dt);
  const int me = g.me;
  const int right = g.members[static_cast<size_t>((me + 1) % n)];
  const int left = g.members[static_cast<size_t>((me - 1 + n) % n)];
  size_t biggest = 0;
  for (size_t l : len) biggest = std::max(biggest, l);
  if (scratch_.size() < biggest) scratch_.resize(biggest);
  for (int s = 0; s < n - 1; ++s) {
    const size_t sseg = static_cast<size_t>(((me - s - 1) % n + 2 * n) % n);
    const size_t rseg = static_cast<size_t>(((me - s - 2) % n + 2 * n) % n);
    char* dst = buf + off[rseg];
    size_t reduced = 0;
    const size_t rlen = len[rseg];
    // Reduce each chunk as it lands, while the kernel keeps moving the rest.
    auto on_recv = [&](size_t got) {
      const size_t ready = (got / esz) * esz;
      if (ready - reduced >= kReduceChunk || got == rlen) {
        reduce_into(dst + reduced, scratch_.data() + reduced, (ready - reduced) / esz, dt, op);
        reduced = ready;
      }
    };
    duplex(right, buf + off[sseg], len[sseg], left, scratch_.data(), rlen, false, on_recv);
  }
}

// The member at position p starts with segment p in place and ends with all of them.
void Runtime::ring_allgather_in(const Ring& g, char* buf, const std::vector<size_t>& off,
                                const std::vector<size_t>& len) {
  const int n = static_cast<int>(g.members.size());
  if (n <= 1) return;
  const int me = g.me;
  const int right = g.members[static_cast<size_t>((me + 1) % n)];
  const int left = g.members[static_cast<size_t>((me - 1 + n) % n)];
  for (int s = 0; s < n - 1; ++s) {
    const size_t sseg = static_cast<size_t>(((me - s) % n + n) % n);
    const size_t rseg = static_cast<size_t>(((me - s - 1) % n + 2 * n) % n);
    duplex(right, buf + off[sseg], len[sseg], left, buf + off[rseg], len[rseg], false, nullptr);
  }
}

// Sends and receives at once on non-blocking sockets (N=2 uses one socket both ways). A side
// that makes no progress for the timeout, a closed peer, or a control message that reports a
// failure ends the transfer with an exception.
void Runtime::duplex(int sp, const char* sbuf, size_t slen, int rp, char* rbuf, size_t rlen, bool gate,
                     const std::function<void(size_t)>& on_recv) {
  const int sfd = sp >= 0 ? data_fd_[static_cast<size_t>(sp)] : -1;
  const int rfd = rp >= 0 ? data_fd_[static_cast<size_t>(rp)] : -1;
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
    for (int j = 0; j < size_; ++j) {
      const int fd = ctrl_fd_[static_cast<size_t>(j)];
      if (fd >= 0 && !gone_[static_cast<size_t>(j)]) {
        fds.push_back({fd, POLLIN, 0});
        peers.push_back(j);
      }
    }
    const int r = ::poll(fds.data(), fds.size(), ms_left(last + timeout_));
    if (r < 0 && errno != EINTR) throw CollectiveError(std::string("poll: ") + std::strerror(errno));
    if (r == 0) {
      const int who = want_in ? rp : sp;
      throw PeerError(who, std::string("rank ") + std::to_string(who) + (want_in ? " sent nothing" : " received nothing") +
                               " for " + seconds(timeout_) + " (stalled; missing ranks [" + std::to_string(who) + "])");
    }
    for (size_t i = ndata; i < fds.size(); ++i) {
      if (fds[i].revents) read_control(peers[i - ndata]);
    }
  }
}

}  // namespace peloton
