#include "shm.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <poll.h>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include "common.h"

namespace peloton {

LocalShm::LocalShm(const std::string& name, bool create, int local_rank, int local_size, size_t slot_bytes)
    : name_(name), owner_(create), slot_bytes_(slot_bytes) {
  (void)local_rank;
  const size_t header = static_cast<size_t>(local_size) * 64;
  total_ = header + static_cast<size_t>(local_size) * slot_bytes;
  int fd;
  if (create) {
    ::shm_unlink(name.c_str());  // a stale segment of a killed gang with the same ports
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(total_)) != 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw CollectiveError("cannot size shared memory " + name + ": " + err);
    }
  } else {
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) throw CollectiveError("cannot open shared memory " + name + ": " + std::strerror(errno));
  base_ = ::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    if (create) ::shm_unlink(name.c_str());
    throw CollectiveError("cannot map shared memory " + name + ": " + std::strerror(errno));
  }
  counters_ = static_cast<std::atomic<uint64_t>*>(base_);
  if (create) {
    for (int i = 0; i < local_size; ++i) new (&counters_[static_cast<size_t>(i) * 8]) std::atomic<uint64_t>(0);
  }
  slots_ = static_cast<char*>(base_) + header;
}

LocalShm::~LocalShm() {
  if (base_) ::munmap(base_, total_);
  if (owner_) unlink();
}

void LocalShm::unlink() {
  if (owner_ && !name_.empty()) ::shm_unlink(name_.c_str());
  name_.clear();
}

ShmGroup::ShmGroup(std::unique_ptr<LocalShm> shm, int local_rank, int local_size, int first_rank,
                   std::chrono::milliseconds timeout, Watch watch)
    : shm_(std::move(shm)),
      local_rank_(local_rank),
      local_size_(local_size),
      first_rank_(first_rank),
      timeout_(timeout),
      watch_(std::move(watch)) {}

void ShmGroup::barrier() {
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
    if (watch_.fds) {
      for (const auto& [fd, peer] : watch_.fds()) {
        fds.push_back({fd, POLLIN, 0});
        peers.push_back(peer);
      }
    }
    if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents) watch_.ready(peers[i]);
      }
    }
    if (Clock::now() - start > timeout_) {
      std::vector<int> late;
      for (int i = 0; i < local_size_; ++i) {
        if (shm_->arrived(i).load(std::memory_order_acquire) < epoch_) late.push_back(first_rank_ + i);
      }
      throw PeerError(late.empty() ? -1 : late[0], "ranks " + ranks_str(late) +
                                                       " did not reach the shared-memory barrier within " +
                                                       seconds_str(timeout_) + " (missing ranks " + ranks_str(late) + ")");
    }
  }
}

}  // namespace peloton
