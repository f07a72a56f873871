#include "runtime.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "net.h"
#include "reduce.h"

namespace peloton {
namespace {

enum Msg : uint8_t { REQUEST = 1, RESPONSE = 2, FAIL = 3, ABORT = 4, BYE = 5, BYE_ACK = 6 };
constexpr size_t kShmSlot = 4 << 20;  // bytes per local rank in the shared segment

// A peer reported a failure (FAIL) or the coordinator decided the verdict (ABORT).
struct RemoteFailure : std::runtime_error {
  int peer;
  RemoteFailure(int p, const std::string& w) : std::runtime_error(w), peer(p) {}
};
struct Aborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

// ---------------------------------------------------------------- setup and teardown

Runtime::Runtime(int rank, int size, const std::vector<std::string>& hosts, const std::vector<int>& ports,
                 double timeout_s, size_t fusion_threshold, int local_rank, int local_size, int cross_rank,
                 int cross_size, uint32_t generation, const std::string& secret)
    : rank_(rank),
      size_(size),
      local_rank_(local_rank),
      local_size_(local_size),
      world_(Ring::world(rank, size)),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0))),
      mesh_{std::vector<int>(static_cast<size_t>(std::max(size, 0)), -1),
            std::vector<int>(static_cast<size_t>(std::max(size, 0)), -1)},
      link_(mesh_.data, timeout_, control_watch()),
      coord_(size, fusion_threshold, timeout_),
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
    if (size > 1) connect_mesh(mesh_, rank_, size_, hosts, ports, timeout_, generation, secret);
    if (use_shm && local_rank != 0) setup_shm(ports);
    if (shm_) {
      shm_->barrier();  // everyone has mapped it: the name can go
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

void Runtime::close_all() { mesh_.close(); }

// Transfers and barriers watch the control channels while they wait: an ABORT or a dead peer
// arrives there (read_control throws it).
std::vector<std::pair<int, int>> Runtime::open_controls() const {
  std::vector<std::pair<int, int>> out;
  for (int j = 0; j < size_; ++j) {
    const int fd = mesh_.ctrl[static_cast<size_t>(j)];
    if (fd >= 0 && !gone_[static_cast<size_t>(j)]) out.emplace_back(fd, j);
  }
  return out;
}

Watch Runtime::control_watch() {
  return Watch{[this] { return open_controls(); }, [this](int peer) { read_control(peer); }};
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
    std::vector<Response> rs = coord_.responses();
    for (auto& r : coord_.stalls(Clock::now())) rs.push_back(std::move(r));
    if (rs.empty()) return;
    Writer w;
    w.u32(static_cast<uint32_t>(rs.size()));
    for (const auto& r : rs) write_response(w, r);
    const auto deadline = Clock::now() + timeout_;
    for (int j = 1; j < size_; ++j) {
      if (!gone_[static_cast<size_t>(j)]) send_message(mesh_.ctrl[static_cast<size_t>(j)], RESPONSE, w, deadline, j);
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
    for (auto& e : fresh) coord_.add(0, e->req, Clock::now());
    return;
  }
  Writer w;
  w.u32(static_cast<uint32_t>(fresh.size()));
  for (auto& e : fresh) write_request(w, e->req);
  send_message(mesh_.ctrl[0], REQUEST, w, Clock::now() + timeout_, 0);
}

// Sleeps until a caller submits, a control message arrives, or a stall deadline passes.
void Runtime::idle_wait() {
  if (!queued_.empty() || coord_.has_ready()) return;
  std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
  std::vector<int> peers{-1};
  for (const auto& [fd, j] : open_controls()) {
    fds.push_back({fd, POLLIN, 0});
    peers.push_back(j);
  }
  int wait_ms = -1;
  if (rank_ == 0 && !coord_.idle()) wait_ms = 50;  // stall checks
  if (rank_ != 0 && !in_flight_.empty()) wait_ms = 100;  // coordinator watchdog
  if (stopping_) wait_ms = 50;
  const int r = ::poll(fds.data(), fds.size(), wait_ms);
  if (r < 0 && errno != EINTR) throw CollectiveError(std::string("poll: ") + std::strerror(errno));
  // The coordinator answers every request within the timeout (stalls become errors), so a
  // coordinator silent for twice that is frozen: give up rather than wait forever.
  if (rank_ != 0 && !in_flight_.empty() && Clock::now() - heard_ > 2 * timeout_) {
    throw PeerError(0, "rank 0 (the coordinator) has not answered for " + seconds_str(2 * timeout_) +
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
  const int fd = mesh_.ctrl[static_cast<size_t>(peer)];
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
      for (uint32_t i = 0; i < n; ++i) coord_.add(peer, read_request(rd), Clock::now());
    } else if (m.type == FAIL) {
      throw RemoteFailure(peer, rd.str());
    } else if (m.type == BYE) {
      bye_[static_cast<size_t>(peer)] = true;
      coord_.forget_rank(peer);
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
      coord_.forget_rank(0);
    } else {
      send_message(mesh_.ctrl[0], BYE, Writer(), stop_deadline_, 0);
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
      send_message(mesh_.ctrl[static_cast<size_t>(j)], BYE_ACK, Writer(), Clock::now() + std::chrono::seconds(1), j);
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
    } else if (asks_coordinator(failed_peer, peer_closed)) {
      Writer w;
      w.str(reason);
      const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(2);
      send_message(mesh_.ctrl[0], FAIL, w, deadline, 0);
      Message m;
      while (ms_left(deadline) > 0) {
        pollfd p{mesh_.ctrl[0], POLLIN, 0};
        if (::poll(&p, 1, ms_left(deadline)) <= 0) break;
        if (!recv_message(mesh_.ctrl[0], &m, deadline, 0)) break;
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
  FailureAgreement agreement(size_, reason, failed_peer, peer_closed, gone_, bye_);
  // Give the others a moment to report: a dead rank closes every socket at once, so its control
  // connection tells us who died (the neighbours only see their side of the ring break).
  auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(2));
  // Once one rank is known dead the verdict is clear: others that died with it (a lost host) close
  // within moments, and a live rank blocked elsewhere in the ring need not be waited for (elastic
  // training re-forms the gang as soon as the survivors hear the verdict).
  bool shortened = false;
  while (ms_left(deadline) > 0) {
    if (agreement.found_dead() && !shortened) {
      deadline = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      shortened = true;
    }
    std::vector<pollfd> fds;
    const std::vector<int> peers = agreement.awaiting();
    for (int j : peers) fds.push_back({mesh_.ctrl[static_cast<size_t>(j)], POLLIN, 0});
    if (fds.empty()) break;
    if (::poll(fds.data(), fds.size(), ms_left(deadline)) <= 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int j = peers[i];
      Message m;
      bool got = false;
      try {
        got = recv_message(mesh_.ctrl[static_cast<size_t>(j)], &m, Clock::now() + std::chrono::seconds(1), j);
      } catch (const std::exception&) {
      }
      if (!got) {
        gone_[static_cast<size_t>(j)] = true;
        agreement.closed(j);
      } else if (m.type == FAIL) {
        agreement.reported(j);
      }
    }
  }
  const std::string verdict = agreement.verdict();
  Writer w;
  w.str(verdict);
  for (int j : agreement.to_notify()) {
    try {
      send_message(mesh_.ctrl[static_cast<size_t>(j)], ABORT, w, Clock::now() + std::chrono::seconds(1), j);
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
  const Segments seg = allgather_segments(dim0s, row_bytes(e.req.shape, e.req.dtype));
  e.gathered.resize(seg.off.empty() ? 0 : seg.off.back() + seg.len.back());
  e.dim0s = dim0s;
  if (e.nbytes) std::memcpy(e.gathered.data() + seg.off[static_cast<size_t>(rank_)], e.in, e.nbytes);
  ring_allgather(link_, world_, e.gathered.data(), seg);
}

void Runtime::exec_broadcast(Entry& e) {
  if (e.in != e.out && e.nbytes && rank_ == e.req.root) std::memcpy(e.out, e.in, e.nbytes);
  chain_broadcast(link_, world_, e.req.root, e.out, e.nbytes);
}

void Runtime::exec_reduce_scatter(Entry& e) {
  const DType dt = e.req.dtype;
  const size_t esz = dtype_size(dt);
  const int64_t rows = e.req.shape.empty() ? 1 : e.req.shape[0];
  const size_t row = rows ? e.nbytes / static_cast<size_t>(rows) : 0;
  const Segments seg = reduce_scatter_segments(rows, row, size_);
  std::vector<char> work(e.in, e.in + e.nbytes);
  ring_reduce_scatter(link_, world_, work.data(), seg, dt, e.req.op, scratch_);
  const size_t mine = seg.len[static_cast<size_t>(rank_)];
  char* dst = e.out;
  if (mine) std::memcpy(dst, work.data() + seg.off[static_cast<size_t>(rank_)], mine);
  if (e.req.op == ROp::AVERAGE) divide_by(dst, mine / esz, dt, size_);
}

void Runtime::setup_shm(const std::vector<int>& ports) {
  const int root = rank_ - local_rank_;
  const std::string name = "/peloton-" + std::to_string(ports[static_cast<size_t>(root)]) + "-" +
                           std::to_string(ports[0]) + "-" + std::to_string(root);
  auto segment = std::make_unique<LocalShm>(name, local_rank_ == 0, local_rank_, local_size_, kShmSlot);
  shm_ = std::make_unique<ShmGroup>(std::move(segment), local_rank_, local_size_, root, timeout_, control_watch());
}

void Runtime::allreduce_buffer(char* buf, size_t count, DType dt, ROp op) {
  if (shm_) {
    local_allreduce(*shm_, link_, cross_, buf, count, dt, op, scratch_);
  } else {
    ring_allreduce(link_, world_, buf, count, dt, op, scratch_);
  }
}

}  // namespace peloton
