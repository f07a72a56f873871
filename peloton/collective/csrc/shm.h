// A shared-memory segment for the ranks of one host: one slot per local rank plus arrival
// counters for barriers. The local root creates it; the segment's name is removed as soon as
// every local rank has mapped it, so nothing is left in /dev/shm even if a rank is killed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

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

}  // namespace peloton
