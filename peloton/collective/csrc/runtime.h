// The collective runtime: connections, a background thread with Horovod-style negotiation
// (rank 0 coordinates), tensor fusion and the ring algorithms over TCP.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "net.h"
#include "shm.h"

namespace peloton {

// What a rank asks for; every rank must ask for the same thing under the same name.
struct Request {
  std::string name;
  Kind kind = Kind::ALLREDUCE;
  DType dtype = DType::F32;
  ROp op = ROp::SUM;
  int root = 0;
  std::vector<int64_t> shape;
};

// One submitted operation on this rank. `in`/`out` belong to the caller, who keeps them alive
// until the handle completes.
struct Entry {
  Request req;
  int64_t handle = 0;
  const char* in = nullptr;
  char* out = nullptr;
  size_t nbytes = 0;
  std::vector<char> gathered;  // allgather result (its size is only known after negotiation)
  std::vector<int64_t> dim0s;  // allgather: each rank's first dimension
  bool done = false;
  std::string error;
};

// The coordinator's decision about one or more (fused) tensors.
struct Response {
  bool ok = true;
  std::vector<std::string> names;
  std::string error;
  std::vector<int64_t> dim0s;  // allgather only
};

class Runtime {
 public:
  // local_*/cross_* describe hosts: ranks cross_rank*local_size .. +local_size-1 share one host
  // and, when local_size > 1, shared memory (hierarchical allreduce when cross_size > 1 too).
  Runtime(int rank, int size, const std::vector<std::string>& hosts, const std::vector<int>& ports,
          double timeout_s, size_t fusion_threshold, int local_rank = 0, int local_size = 1,
          int cross_rank = -1, int cross_size = -1);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int64_t enqueue(const Request& req, const void* in, void* out, size_t nbytes);
  bool poll(int64_t handle);
  // Blocks until done; throws CollectiveError on failure; returns the entry and forgets it.
  std::shared_ptr<Entry> wait(int64_t handle);
  void shutdown();

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct Pending {
    std::vector<std::unique_ptr<Request>> per_rank;
    int count = 0;
    Clock::time_point first;
  };

  // connection setup and teardown
  void connect_mesh(const std::vector<std::string>& hosts, const std::vector<int>& ports);
  void close_all();

  // background thread
  void loop();
  void loop_once();
  void submit_new();
  void idle_wait();
  void read_control(int peer);
  void handle_failure(const std::string& reason, int failed_peer, bool peer_closed);
  std::string coordinator_verdict(const std::string& reason, int failed_peer, bool peer_closed);
  void finish(const std::string& verdict);
  void complete(const std::shared_ptr<Entry>& e, const std::string& error);
  bool shutdown_step();

  // coordinator (rank 0)
  void coord_add(int from, const Request& r);
  void coord_forget_rank(int r);
  std::vector<Response> coord_responses();
  Response coord_check(const std::string& name, Pending& p);
  void coord_stalls(std::vector<Response>* out);

  // execution
  void execute(const Response& resp);
  void exec_allreduce(const std::vector<std::shared_ptr<Entry>>& es);
  void exec_allgather(Entry& e, const std::vector<int64_t>& dim0s);
  void exec_broadcast(Entry& e);
  void exec_reduce_scatter(Entry& e);
  void ring_allreduce(char* buf, size_t count, DType dt, ROp op);
  void allreduce_buffer(char* buf, size_t count, DType dt, ROp op);  // picks shm or TCP
  void shm_allreduce(char* buf, size_t count, DType dt, ROp op);
  void local_barrier();
  void setup_shm(const std::vector<int>& ports);
  void ring_reduce_scatter(char* buf, const std::vector<size_t>& off, const std::vector<size_t>& len,
                           DType dt, ROp op);
  void ring_allgather(char* buf, const std::vector<size_t>& off, const std::vector<size_t>& len);
  // The same algorithms over a subset of ranks (the hierarchical path's cross-host ring).
  struct Ring {
    std::vector<int> members;  // global ranks in ring order
    int me = 0;                // this rank's position
  };
  void ring_allreduce_in(const Ring& g, char* buf, size_t count, DType dt, ROp op);
  void ring_reduce_scatter_in(const Ring& g, char* buf, const std::vector<size_t>& off,
                              const std::vector<size_t>& len, DType dt, ROp op);
  void ring_allgather_in(const Ring& g, char* buf, const std::vector<size_t>& off, const std::vector<size_t>& len);
  void duplex(int send_peer, const char* sbuf, size_t slen, int recv_peer, char* rbuf, size_t rlen,
              bool gate_send_on_recv, const std::function<void(size_t)>& on_recv);

  int rank_;
  int size_;
  int local_rank_;
  int local_size_;
  Ring world_;
  Ring cross_;                       // ranks with this rank's local rank, one per host
  std::unique_ptr<LocalShm> shm_;    // null: allreduce uses the TCP ring only
  uint64_t epoch_ = 0;               // local barrier generation
  std::chrono::milliseconds timeout_;
  size_t fusion_threshold_;
  std::vector<int> data_fd_;  // per peer
  std::vector<int> ctrl_fd_;  // rank 0: one per worker; worker: [0] to the coordinator
  int wake_[2] = {-1, -1};

  // shared with callers (guarded by mu_)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Entry>> submitted_;
  std::unordered_map<int64_t, std::shared_ptr<Entry>> by_handle_;
  std::set<std::string> names_in_use_;
  std::string fatal_;
  std::atomic<bool> stopping_{false};  // also read by the background thread without mu_
  bool stopped_ = false;
  int64_t next_handle_ = 1;

  // background thread only
  std::thread bg_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> in_flight_;
  std::deque<Response> queued_;  // worker: responses received while busy
  std::unordered_map<std::string, Pending> table_;  // coordinator
  std::deque<std::string> ready_;                   // coordinator
  std::vector<bool> bye_;                           // coordinator: worker said goodbye
  std::vector<bool> gone_;                          // coordinator: worker's control closed
  Clock::time_point heard_;  // worker: last message from the coordinator
  bool bye_sent_ = false;
  bool bye_acked_ = false;
  Clock::time_point stop_deadline_;
  std::vector<char> fusion_;
  std::vector<char> scratch_;
};

}  // namespace peloton
