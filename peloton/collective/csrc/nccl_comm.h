// NCCL communicator for CUDA tensors, loaded with dlopen at run time.
#pragma once

#include <cstdint>
#include <string>

#include "common.h"

namespace peloton {

// True when libnccl.so.2 and the CUDA runtime could be loaded; `why` says what is missing.
bool nccl_available(std::string* why);

// A fresh NCCL unique id (rank 0 makes it; our TCP broadcast carries it to the others).
std::string nccl_unique_id();

class NcclComm {
 public:
  // Joins the communicator on `device`; fails (and aborts) after `timeout_s` seconds.
  NcclComm(const std::string& unique_id, int rank, int size, int device, double timeout_s);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Each runs on `stream` and returns once the stream finished it, polling NCCL's asynchronous
  // errors meanwhile: an error or the timeout aborts the communicator and throws CollectiveError.
  void allreduce(const std::string& name, uintptr_t in, uintptr_t out, size_t count, DType dt, ROp op,
                 uintptr_t stream);
  void broadcast(const std::string& name, uintptr_t in, uintptr_t out, size_t count, DType dt, int root,
                 uintptr_t stream);
  void allgather(const std::string& name, uintptr_t in, uintptr_t out, size_t count, DType dt, uintptr_t stream);
  void abort();

 private:
  void wait(const std::string& what, uintptr_t stream);
  void check(int result, const std::string& what);

  void* comm_ = nullptr;
  int device_;
  double timeout_s_;
  bool aborted_ = false;
};

}  // namespace peloton
