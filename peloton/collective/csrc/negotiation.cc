#include "negotiation.h"

#include <algorithm>
#include <map>
#include <utility>

namespace peloton {

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

// ---------------------------------------------------------------- coordinator

Coordinator::Coordinator(int size, size_t fusion_threshold, std::chrono::milliseconds timeout)
    : size_(size), fusion_threshold_(fusion_threshold), timeout_(timeout) {}

void Coordinator::add(int from, const Request& r, Clock::time_point now) {
  Pending& p = table_[r.name];
  if (p.per_rank.empty()) {
    p.per_rank.resize(static_cast<size_t>(size_));
    p.first = now;
  }
  auto& slot = p.per_rank[static_cast<size_t>(from)];
  if (!slot) ++p.count;
  slot = std::make_unique<Request>(r);
  if (p.count == size_) ready_.push_back(r.name);
}

void Coordinator::forget_rank(int rank) {
  for (auto& [name, p] : table_) {
    auto& slot = p.per_rank[static_cast<size_t>(rank)];
    if (slot) {
      slot.reset();
      --p.count;
    }
  }
}

Response Coordinator::check(const std::string& name, const Pending& p) const {
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

std::vector<Response> Coordinator::responses() {
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
    Response r = check(name, it->second);
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

std::vector<Response> Coordinator::stalls(Clock::time_point now) {
  std::vector<Response> out;
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
    r.error = std::string(kind_name(kind)) + " of tensor '" + it->first + "' timed out after " + seconds_str(timeout_) +
              ": submitted by ranks " + ranks_str(have) + ", missing ranks " + ranks_str(missing);
    out.push_back(std::move(r));
    it = table_.erase(it);
  }
  return out;
}

// ---------------------------------------------------------------- failure agreement

bool asks_coordinator(int failed_peer, bool peer_closed) { return !(failed_peer == 0 && peer_closed); }

FailureAgreement::FailureAgreement(int size, std::string reason, int failed_peer, bool peer_closed,
                                   std::vector<bool> gone, std::vector<bool> bye)
    : size_(size), reason_(std::move(reason)), gone_(std::move(gone)), bye_(std::move(bye)) {
  if (failed_peer > 0 && peer_closed && gone_[static_cast<size_t>(failed_peer)]) dead_.insert(failed_peer);
  if (failed_peer > 0 && !peer_closed) reported_.insert(failed_peer);
}

std::vector<int> FailureAgreement::awaiting() const {
  std::vector<int> out;
  for (int j = 1; j < size_; ++j) {
    if (gone_[static_cast<size_t>(j)] || bye_[static_cast<size_t>(j)] || dead_.count(j) || reported_.count(j)) continue;
    out.push_back(j);
  }
  return out;
}

void FailureAgreement::closed(int rank) {
  gone_[static_cast<size_t>(rank)] = true;
  dead_.insert(rank);
}

void FailureAgreement::reported(int rank) { reported_.insert(rank); }

std::string FailureAgreement::verdict() const {
  if (dead_.empty()) return reason_;
  std::vector<int> d(dead_.begin(), dead_.end());
  return (d.size() == 1 ? "rank " + std::to_string(d[0]) : "ranks " + ranks_str(d)) +
         " died or lost the connection (missing ranks " + ranks_str(d) + ")";
}

std::vector<int> FailureAgreement::to_notify() const {
  std::vector<int> out;
  for (int j = 1; j < size_; ++j) {
    if (gone_[static_cast<size_t>(j)] || dead_.count(j)) continue;
    out.push_back(j);
  }
  return out;
}

}  // namespace peloton
