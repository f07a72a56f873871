// The shared-memory transport: a segment for the ranks of one host, one slot per local rank plus
// arrival counters for barriers (LocalShm), and ShmGroup, the algorithms' LocalGroup over it.
// The local root creates the segment; its name is removed as soon as every local rank has mapped
// it, so nothing is left in /dev/shm even if a rank is killed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "algorithms.h"
#include "link.h"

namespace peloton {

class LocalShm {
 public:
  LocalShm(const std::string& name, bool create, int local_rank, int local_size, size_t slot_bytes);
  ~LocalShm();
  LocalShm(const LocalShm&) = delete;
  LocalShm& operator=(const LocalShm&) = delete;

  char* slot(int local_rank) const { return slots_ + static_cast<size_t>(local_rank) * slot_bytes_; }
  size_t slot_bytes() const { return slot_bytes_; }
  std::atomic<uint64_t>& arrived(int local_rank) const { return counters_[static_cast<size_t>(local_rank) * 8]; }
  void unlink();  // removes the name (the mapping stays valid)

 private:
  std::string name_;
  bool owner_;
  size_t slot_bytes_;
  size_t total_ = 0;
  void* base_ = nullptr;
  std::atomic<uint64_t>* counters_ = nullptr;  // one per local rank, 64 bytes apart
  char* slots_ = nullptr;
};

// The algorithms' view of a host's shared slots. The barrier spins, then yields, watching the
// runtime's control channels meanwhile (an abort or a dead peer ends the wait), and names the
// local ranks that did not come within the timeout.
class ShmGroup : public LocalGroup {
 public:
  // `first_rank`: the global rank of local rank 0 (for messages).
  ShmGroup(std::unique_ptr<LocalShm> shm, int local_rank, int local_size, int first_rank,
           std::chrono::milliseconds timeout, Watch watch);

  int rank() const override { return local_rank_; }
  int size() const override { return local_size_; }
  char* slot(int local_rank) override { return shm_->slot(local_rank); }
  size_t slot_bytes() const override { return shm_->slot_bytes(); }
  void barrier() override;
  void unlink() { shm_->unlink(); }

 private:
  std::unique_ptr<LocalShm> shm_;
  int local_rank_;
  int local_size_;
  int first_rank_;
  std::chrono::milliseconds timeout_;
  Watch watch_;
  uint64_t epoch_ = 0;  // barrier generation
};

}  // namespace peloton
