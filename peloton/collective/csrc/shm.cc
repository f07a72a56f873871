#include "shm.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <sys/mman.h>
#include <unistd.h>

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

}  // namespace peloton
