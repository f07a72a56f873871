// In-memory transports for the C++ tests: several ranks as threads of one process.
// MemFabric: a byte queue for each ordered pair of ranks; MemLink: the link interface over it,
// delivering at most `piece` bytes per step (so receivers see data land in odd-sized pieces, as
// from a socket). MemHost: a host's shared slots and barrier (the LocalGroup of the
// hierarchical allreduce).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms.h"
#include "common.h"
#include "link.h"

namespace peloton::testing {

class MemFabric {
 public:
  explicit MemFabric(int size, size_t piece = 4093) : size_(size), piece_(piece), queues_(static_cast<size_t>(size * size)) {}
  int size() const { return size_; }
  size_t piece() const { return piece_; }
  std::deque<char>& queue(int from, int to) { return queues_[static_cast<size_t>(from * size_ + to)]; }
  std::mutex mu;
  std::condition_variable cv;

 private:
  int size_;
  size_t piece_;
  std::vector<std::deque<char>> queues_;
};

class MemLink : public Link {
 public:
  MemLink(MemFabric& fabric, int rank) : f_(fabric), rank_(rank) {}

  void exchange(int sp, const void* sbuf_v, size_t slen, int rp, void* rbuf_v, size_t rlen, bool gate,
                const OnRecv& on_recv) override {
    const char* sbuf = static_cast<const char*>(sbuf_v);
    char* rbuf = static_cast<char*>(rbuf_v);
    if (sp < 0) slen = 0;
    if (rp < 0) rlen = 0;
    size_t sd = 0, rd = 0;
    while (sd < slen || rd < rlen) {
      bool moved = false;
      if (rd < rlen) {
        size_t n = 0;
        {
          std::lock_guard<std::mutex> lk(f_.mu);
          auto& q = f_.queue(rp, rank_);
          n = std::min({q.size(), rlen - rd, f_.piece()});
          std::copy(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n), rbuf + rd);
          q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
        }
        if (n) {
          rd += n;
          moved = true;
          if (on_recv) on_recv(rd);
        }
      }
      const size_t avail = gate ? std::min(rd, slen) : slen;
      if (sd < avail) {
        const size_t n = std::min(avail - sd, f_.piece());
        {
          std::lock_guard<std::mutex> lk(f_.mu);
          auto& q = f_.queue(rank_, sp);
          q.insert(q.end(), sbuf + sd, sbuf + sd + n);
        }
        f_.cv.notify_all();
        sd += n;
        moved = true;
      }
      if (moved) continue;
      std::unique_lock<std::mutex> lk(f_.mu);
      if (!f_.cv.wait_for(lk, std::chrono::seconds(20), [&] { return !f_.queue(rp, rank_).empty(); })) {
        throw PeerError(rp, "rank " + std::to_string(rp) + " sent nothing (in-memory link)");
      }
    }
  }

 private:
  MemFabric& f_;
  int rank_;
};

// The slots and barrier that the ranks of one host share.
class MemHost {
 public:
  MemHost(int local_size, size_t slot_bytes)
      : size_(local_size), slot_bytes_(slot_bytes), slots_(static_cast<size_t>(local_size) * slot_bytes) {}

  class Group : public LocalGroup {
   public:
    Group(MemHost& host, int local_rank) : h_(host), rank_(local_rank) {}
    int rank() const override { return rank_; }
    int size() const override { return h_.size_; }
    char* slot(int i) override { return h_.slots_.data() + static_cast<size_t>(i) * h_.slot_bytes_; }
    size_t slot_bytes() const override { return h_.slot_bytes_; }
    void barrier() override {
      std::unique_lock<std::mutex> lk(h_.mu_);
      const uint64_t gen = h_.generation_;
      if (++h_.arrived_ == h_.size_) {
        h_.arrived_ = 0;
        ++h_.generation_;
        h_.cv_.notify_all();
        return;
      }
      if (!h_.cv_.wait_for(lk, std::chrono::seconds(20), [&] { return h_.generation_ != gen; })) {
        throw PeerError(-1, "a local rank did not reach the barrier (in-memory host)");
      }
    }

   private:
    MemHost& h_;
    int rank_;
  };

 private:
  int size_;
  size_t slot_bytes_;
  std::vector<char> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// Runs body(rank) on `size` threads and rethrows the first exception any of them raised.
inline void run_ranks(int size, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace peloton::testing
