// The collective runtime: the caller-facing queue of operations and a background thread that
// negotiates with rank 0 over the control channels (negotiation.h holds the pure logic), runs
// what is agreed with the algorithms (algorithms.h) over the transports (tcp_link.h, shm.h),
// and turns a failure into one verdict for every rank.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "common.h"
#include "link.h"
#include "negotiation.h"
#include "shm.h"
#include "tcp_link.h"

namespace peloton {

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

class Runtime {
 public:
  // local_*/cross_* describe hosts: ranks cross_rank*local_size .. +local_size-1 share one host
  // and, when local_size > 1, shared memory (hierarchical allreduce when cross_size > 1 too).
  // `secret`: the gang's (PELOTON_GANG_SECRET); every connection proves it (connect_mesh).
  // Empty: connections are not authenticated.
  Runtime(int rank, int size, const std::vector<std::string>& hosts, const std::vector<int>& ports,
          double timeout_s, size_t fusion_threshold, int local_rank = 0, int local_size = 1,
          int cross_rank = -1, int cross_size = -1, uint32_t generation = 0, const std::string& secret = "");
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
  // Whether this host's ranks allreduce through shared memory (else everything goes over TCP).
  bool uses_shm() const { return shm_ != nullptr; }

 private:
  // set-up and teardown
  void setup_shm(const std::vector<int>& ports);
  void close_all();
  Watch control_watch();
  std::vector<std::pair<int, int>> open_controls() const;  // (fd, peer) of live control channels

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

  // execution
  void execute(const Response& resp);
  void exec_allreduce(const std::vector<std::shared_ptr<Entry>>& es);
  void exec_allgather(Entry& e, const std::vector<int64_t>& dim0s);
  void exec_broadcast(Entry& e);
  void exec_reduce_scatter(Entry& e);
  void allreduce_buffer(char* buf, size_t count, DType dt, ROp op);  // picks shm or TCP

  int rank_;
  int size_;
  int local_rank_;
  int local_size_;
  Ring world_;
  Ring cross_;  // ranks with this rank's local rank, one per host
  std::chrono::milliseconds timeout_;
  TcpMesh mesh_;
  TcpLink link_;                     // over mesh_.data
  std::unique_ptr<ShmGroup> shm_;    // null: allreduce uses the TCP ring only
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
  Coordinator coord_;            // rank 0
  std::vector<bool> bye_;        // coordinator: worker said goodbye
  std::vector<bool> gone_;       // coordinator: worker's control closed
  Clock::time_point heard_;      // worker: last message from the coordinator
  bool bye_sent_ = false;
  bool bye_acked_ = false;
  Clock::time_point stop_deadline_;
  std::vector<char> fusion_;
  std::vector<char> scratch_;
};

}  // namespace peloton
