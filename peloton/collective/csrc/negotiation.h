// Negotiation (Horovod style): rank 0 tallies what every rank has asked for, checks that the
// ranks agree, fuses small allreduces and turns stalls into errors; and, when a transfer fails,
// the failure agreement that picks one verdict for every rank. Pure: no sockets, no clock (the
// caller passes `now`), no threads; the runtime carries the messages (runtime.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "wire.h"

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

// The coordinator's decision about one or more (fused) tensors.
struct Response {
  bool ok = true;
  std::vector<std::string> names;
  std::string error;
  std::vector<int64_t> dim0s;  // allgather only
};

// Control-message payloads (both ends are this same build).
void write_request(Writer& w, const Request& r);
Request read_request(Reader& rd);
void write_response(Writer& w, const Response& r);
Response read_response(Reader& rd);

// Groups ranks by a per-rank description; empty when all agree, else
// "ranks [0, 2] sent X, ranks [1] sent Y".
std::string disagreement(const std::vector<std::string>& per_rank);

// Rank 0's table of requests. A name is ready once every rank has asked for it; responses()
// then checks the requests agree and fuses what it can, in the order names became ready.
class Coordinator {
 public:
  Coordinator(int size, size_t fusion_threshold, std::chrono::milliseconds timeout);

  void add(int from, const Request& r, Clock::time_point now);
  // A rank that leaves can never complete what it had asked for.
  void forget_rank(int rank);
  // The decisions about every ready name: an error for a mismatch; consecutive allreduces of
  // one dtype and op fused into one response while their bytes stay within the threshold.
  std::vector<Response> responses();
  // Errors for names some rank has waited on for the timeout (naming who is missing); forgets
  // names that no rank still asks for.
  std::vector<Response> stalls(Clock::time_point now);

  bool idle() const { return table_.empty(); }     // nothing asked for
  bool has_ready() const { return !ready_.empty(); }

 private:
  struct Pending {
    std::vector<std::unique_ptr<Request>> per_rank;
    int count = 0;
    Clock::time_point first;
  };
  Response check(const std::string& name, const Pending& p) const;

  int size_;
  size_t fusion_threshold_;
  std::chrono::milliseconds timeout_;
  std::unordered_map<std::string, Pending> table_;
  std::deque<std::string> ready_;
};

// A worker whose transfer failed asks rank 0 for the verdict, unless rank 0 itself is the peer
// whose connection closed.
bool asks_coordinator(int failed_peer, bool peer_closed);

// Rank 0's side of a failure: it listens a moment to the workers (a dead rank closes every
// socket at once, so its control connection tells who died, while its ring neighbours only see
// their side break), then sends every live worker one verdict.
class FailureAgreement {
 public:
  // `gone`: workers whose control connection has closed; `bye`: workers that said goodbye.
  FailureAgreement(int size, std::string reason, int failed_peer, bool peer_closed, std::vector<bool> gone,
                   std::vector<bool> bye);

  // Workers still to hear from (neither gone, said goodbye, found dead nor reported).
  std::vector<int> awaiting() const;
  void closed(int rank);                                  // its control connection closed: dead
  void reported(int rank);                                // it sent FAIL (its reason is not used)
  bool found_dead() const { return !dead_.empty(); }
  std::string verdict() const;
  std::vector<int> to_notify() const;  // live workers that get the verdict (ABORT)

 private:
  int size_;
  std::string reason_;
  std::vector<bool> gone_, bye_;
  std::set<int> dead_, reported_;
};

}  // namespace peloton
