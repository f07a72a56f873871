#include "nccl_comm.h"

#include <chrono>
#include <cstring>
#include <dlfcn.h>
#include <mutex>
#include <thread>

#include "nccl_api.h"

namespace peloton {
namespace {

// Function pointers resolved from the shared libraries; the types follow nccl_api.h.
struct Api {
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  peloton_cuda_error_t (*SetDevice)(int) = nullptr;
  peloton_cuda_error_t (*StreamQuery)(cudaStream_t) = nullptr;
  const char* (*CudaErrorString)(peloton_cuda_error_t) = nullptr;
  std::string error;  // empty once everything resolved
};

template <typename F>
bool resolve(void* lib, const char* sym, F* out, std::string* err) {
  *out = reinterpret_cast<F>(::dlsym(lib, sym));
  if (*out == nullptr && err->empty()) *err = std::string("symbol ") + sym + " not found";
  return *out != nullptr;
}

// The first of `names` that loads; else null, with the loader's reason for each in `tried`
// (which name was missing, or which of its own dependencies or symbols).
void* open_first(const char* const* names, std::string* tried) {
  for (const char* const* n = names; *n; ++n) {
    if (void* h = ::dlopen(*n, RTLD_NOW | RTLD_GLOBAL)) return h;
    const char* why = ::dlerror();
    *tried += std::string(tried->empty() ? "" : "; ") + (why ? why : *n);
  }
  return nullptr;
}

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    static const char* const nccl_names[] = {"libnccl.so.2", "libnccl.so", nullptr};
    static const char* const cudart_names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", nullptr};
    std::string tried;
    void* nccl = open_first(nccl_names, &tried);
    if (!nccl) {
      a.error = "cannot load NCCL (tried " + tried + "): install nvidia-nccl-cu12 or put libnccl on the library path";
      return;
    }
    tried.clear();
    void* cudart = open_first(cudart_names, &tried);
    if (!cudart) {
      a.error = "cannot load the CUDA runtime (tried " + tried + ")";
      return;
    }
    std::string& e = a.error;
    resolve(nccl, "ncclGetUniqueId", &a.GetUniqueId, &e);
    resolve(nccl, "ncclCommInitRank", &a.CommInitRank, &e);
    resolve(nccl, "ncclAllReduce", &a.AllReduce, &e);
    resolve(nccl, "ncclBroadcast", &a.Broadcast, &e);
    resolve(nccl, "ncclAllGather", &a.AllGather, &e);
    resolve(nccl, "ncclCommGetAsyncError", &a.CommGetAsyncError, &e);
    resolve(nccl, "ncclCommAbort", &a.CommAbort, &e);
    resolve(nccl, "ncclCommDestroy", &a.CommDestroy, &e);
    resolve(nccl, "ncclGetErrorString", &a.GetErrorString, &e);
    resolve(cudart, "cudaSetDevice", &a.SetDevice, &e);
    resolve(cudart, "cudaStreamQuery", &a.StreamQuery, &e);
    resolve(cudart, "cudaGetErrorString", &a.CudaErrorString, &e);
  });
  return a;
}

const Api& loaded() {
  const Api& a = api();
  if (!a.error.empty()) throw CollectiveError(a.error);
  return a;
}

ncclDataType_t nccl_dtype(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
  }
  throw CollectiveError("unsupported dtype for NCCL");
}

ncclRedOp_t nccl_op(ROp op) {
  switch (op) {
    case ROp::SUM: return ncclSum;
    case ROp::AVERAGE: return ncclAvg;
    case ROp::MIN: return ncclMin;
    case ROp::MAX: return ncclMax;
    case ROp::PRODUCT: return ncclProd;
  }
  throw CollectiveError("unsupported op for NCCL");
}

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

bool nccl_available(std::string* why) {
  const Api& a = api();
  if (why) *why = a.error;
  return a.error.empty();
}

std::string nccl_unique_id() {
  const Api& a = loaded();
  ncclUniqueId id;
  const ncclResult_t r = a.GetUniqueId(&id);
  if (r != ncclSuccess) throw CollectiveError(std::string("ncclGetUniqueId: ") + a.GetErrorString(r));
  return std::string(id.internal, sizeof id.internal);
}

NcclComm::NcclComm(const std::string& unique_id, int rank, int size, int device, double timeout_s)
    : device_(device), timeout_s_(timeout_s) {
  const Api& a = loaded();
  if (unique_id.size() != sizeof(ncclUniqueId)) throw CollectiveError("malformed NCCL unique id");
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  const peloton_cuda_error_t ce = a.SetDevice(device);
  if (static_cast<int>(ce) != kCudaSuccess) {
    throw CollectiveError("cudaSetDevice(" + std::to_string(device) + "): " + a.CudaErrorString(ce));
  }
  ncclComm_t comm = nullptr;
  const ncclResult_t r = a.CommInitRank(&comm, size, id, rank);
  if (r != ncclSuccess) {
    throw CollectiveError("ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                          "): " + a.GetErrorString(r));
  }
  comm_ = comm;
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr || aborted_) return;
  const Api& a = api();
  if (a.error.empty()) a.CommDestroy(as_comm(comm_));
}

void NcclComm::abort() {
  if (comm_ == nullptr || aborted_) return;
  aborted_ = true;
  loaded().CommAbort(as_comm(comm_));
}

void NcclComm::check(int result, const std::string& what) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  const std::string msg = what + " failed: " + loaded().GetErrorString(static_cast<ncclResult_t>(result));
  abort();
  throw CollectiveError(msg);
}

// Polls the stream and NCCL's asynchronous error; never blocks forever on a dead peer.
void NcclComm::wait(const std::string& what, uintptr_t stream) {
  const Api& a = loaded();
  const auto deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s_ * 1e6));
  for (;;) {
    const peloton_cuda_error_t q = a.StreamQuery(as_stream(stream));
    if (static_cast<int>(q) == kCudaSuccess) return;
    if (static_cast<int>(q) != kCudaNotReady) {
      abort();
      throw CollectiveError(what + " failed: CUDA error " + a.CudaErrorString(q));
    }
    ncclResult_t async = ncclSuccess;
    a.CommGetAsyncError(as_comm(comm_), &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      abort();
      throw CollectiveError(what + " failed: NCCL reported " + a.GetErrorString(async) +
                            " (a peer died or the network failed); the communicator was aborted");
    }
    if (Clock::now() > deadline) {
      abort();
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g s", timeout_s_);
      throw CollectiveError(what + " did not complete within " + secs +
                            " (a rank died or stalled); the NCCL communicator was aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclComm::allreduce(const std::string& name, uintptr_t in, uintptr_t out, size_t count, DType dt, ROp op,
                         uintptr_t stream) {
  if (aborted_) throw CollectiveError("the NCCL communicator was aborted by an earlier failure");
  const std::string what = "NCCL allreduce of tensor '" + name + "'";
  check(loaded().AllReduce(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), count, nccl_dtype(dt),
                           nccl_op(op), as_comm(comm_), as_stream(stream)),
        what);
  wait(what, stream);
}

void NcclComm::broadcast(const std::string& name, uintptr_t in, uintptr_t out, size_t count, DType dt, int root,
                         uintptr_t stream) {
  if (aborted_) throw CollectiveError("the NCCL communicator was aborted by an earlier failure");
  const std::string what = "NCCL broadcast of tensor '" + name + "'";
  check(loaded().Broadcast(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), count, nccl_dtype(dt),
                           root, as_comm(comm_), as_stream(stream)),
        what);
  wait(what, stream);
}

void NcclComm::allgather(const std::string& name, uintptr_t in, uintptr_t out, size_t count, DType dt,
                         uintptr_t stream) {
  if (aborted_) throw CollectiveError("the NCCL communicator was aborted by an earlier failure");
  const std::string what = "NCCL allgather of tensor '" + name + "'";
  check(loaded().AllGather(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), count, nccl_dtype(dt),
                           as_comm(comm_), as_stream(stream)),
        what);
  wait(what, stream);
}

}  // namespace peloton
