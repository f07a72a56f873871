// The C ABI (include/peloton_collective.h) over the runtime: one process-wide Runtime made from
// the gang environment, each operation submitted and waited for, exceptions turned into -1 and a
// per-thread message. The runtime does the work; nothing here moves or reduces data.
#include "peloton_collective.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "gang_env.h"
#include "nccl_comm.h"
#include "runtime.h"
#include "shm.h"

#ifndef PELOTON_VERSION
#error "PELOTON_VERSION must be defined by the build (setup.py build_bundle)"
#endif

using namespace peloton;

namespace {

thread_local std::string last_error;

std::mutex mu;
std::shared_ptr<Runtime> runtime;  // guarded by mu; null when not initialized
GangEnv gang;                      // guarded by mu; what runtime was made from
// Sequence numbers of unnamed operations, per Kind (reset by peloton_init, as in Python).
std::atomic<uint64_t> unnamed[5];

int fail(const std::string& why) {
  last_error = why;
  return -1;
}

// Runs f; an exception becomes -1 and peloton_last_error().
template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown error");
  }
}

const char* kNotInitialized = "the peloton collective runtime is not initialized: call peloton_init() first";

// The runtime, held by the caller for the whole operation (a concurrent shutdown fails it
// instead of freeing it under the caller).
std::shared_ptr<Runtime> current() {
  std::lock_guard<std::mutex> lk(mu);
  if (!runtime) throw CollectiveError(kNotInitialized);
  return runtime;
}

// One field of the gang, or -1 when not initialized.
int gang_field(int GangEnv::*field) {
  std::lock_guard<std::mutex> lk(mu);
  if (!runtime) return fail(kNotInitialized);
  return gang.*field;
}

DType dtype_of(peloton_dtype d) {
  const int code = static_cast<int>(d);
  if (code < PELOTON_FLOAT32 || code > PELOTON_INT64) throw CollectiveError("unknown dtype " + std::to_string(code));
  return static_cast<DType>(code);
}

ROp op_of(peloton_op op) {
  const int code = static_cast<int>(op);
  if (code < PELOTON_SUM || code > PELOTON_PRODUCT) throw CollectiveError("unknown op " + std::to_string(code));
  return static_cast<ROp>(code);
}

// Submits one operation of `count` elements and waits for it: the completed entry.
std::shared_ptr<Entry> run(Kind kind, const char* name, DType dt, ROp op, int root, size_t count, const void* in,
                           void* out) {
  const auto rt = current();
  Request r;
  r.kind = kind;
  r.name = name ? std::string(name)
                : std::string(kind_name(kind)) + ".noname." + std::to_string(unnamed[static_cast<size_t>(kind)]++);
  r.dtype = dt;
  r.op = op;
  r.root = root;
  r.shape = {static_cast<int64_t>(count)};
  return rt->wait(rt->enqueue(r, in, out, count * dtype_size(dt)));
}

// Sets *why to `reason` (kept per thread) and returns `ok`.
int availability(bool ok, const std::string& reason, const char** why) {
  thread_local std::string kept;
  kept = reason;
  if (why) *why = kept.c_str();
  return ok ? 1 : 0;
}

}  // namespace

extern "C" {

const char* peloton_version(void) { return PELOTON_VERSION; }

const char* peloton_last_error(void) { return last_error.c_str(); }

int peloton_gang_from_env(peloton_gang* out) {
  return guarded([&] {
    const GangEnv g = gang_env_from_environ();
    *out = peloton_gang{g.rank,       g.size,       g.local_rank, g.local_size,
                        g.cross_rank, g.cross_size, g.timeout,    g.fusion_threshold};
  });
}

int peloton_init(void) {
  return guarded([] {
    std::lock_guard<std::mutex> lk(mu);
    if (runtime) throw CollectiveError("the peloton collective runtime is already initialized; call peloton_shutdown() first");
    GangEnv g = gang_env_from_environ();
    runtime = std::make_shared<Runtime>(g.rank, g.size, g.hosts, g.ports, g.timeout,
                                        static_cast<size_t>(g.fusion_threshold), g.local_rank, g.local_size,
                                        g.cross_rank, g.cross_size, 0, g.secret);
    gang = std::move(g);
    for (auto& n : unnamed) n = 0;
  });
}

int peloton_shutdown(void) {
  return guarded([] {
    std::shared_ptr<Runtime> rt;
    {
      std::lock_guard<std::mutex> lk(mu);
      rt.swap(runtime);
    }
    if (rt) rt->shutdown();
  });
}

int peloton_rank(void) { return gang_field(&GangEnv::rank); }
int peloton_size(void) { return gang_field(&GangEnv::size); }
int peloton_local_rank(void) { return gang_field(&GangEnv::local_rank); }
int peloton_local_size(void) { return gang_field(&GangEnv::local_size); }
int peloton_cross_rank(void) { return gang_field(&GangEnv::cross_rank); }
int peloton_cross_size(void) { return gang_field(&GangEnv::cross_size); }

const char* peloton_local_transport(void) {
  std::lock_guard<std::mutex> lk(mu);
  if (!runtime) {
    fail(kNotInitialized);
    return nullptr;
  }
  if (runtime->uses_shm()) return "shm";
  return gang.local_size > 1 ? "tcp" : "none";
}

int peloton_allreduce(const void* in, void* out, size_t count, peloton_dtype dtype, peloton_op op, const char* name) {
  return guarded([&] { run(Kind::ALLREDUCE, name, dtype_of(dtype), op_of(op), 0, count, in, out); });
}

int peloton_broadcast(void* buf, size_t count, peloton_dtype dtype, int root, const char* name) {
  return guarded([&] {
    const int size = current()->size();
    if (root < 0 || root >= size) {
      throw CollectiveError("broadcast: root " + std::to_string(root) + " is outside a gang of " + std::to_string(size));
    }
    run(Kind::BROADCAST, name, dtype_of(dtype), ROp::SUM, root, count, buf, buf);
  });
}

int peloton_allgather(const void* in, size_t count, void* out, size_t out_count, peloton_dtype dtype, size_t* counts,
                      const char* name) {
  return guarded([&] {
    const DType dt = dtype_of(dtype);
    const auto e = run(Kind::ALLGATHER, name, dt, ROp::SUM, 0, count, in, nullptr);
    const size_t esz = dtype_size(dt);
    if (e->gathered.size() > out_count * esz) {
      throw CollectiveError("allgather of tensor '" + e->req.name + "': the ranks contributed " +
                            std::to_string(e->gathered.size() / esz) + " elements but out holds " +
                            std::to_string(out_count));
    }
    if (!e->gathered.empty()) std::memcpy(out, e->gathered.data(), e->gathered.size());
    if (counts) {
      for (size_t j = 0; j < e->dim0s.size(); ++j) counts[j] = static_cast<size_t>(e->dim0s[j]);
    }
  });
}

int peloton_barrier(const char* name) {
  return guarded([&] { run(Kind::BARRIER, name, DType::F32, ROp::SUM, 0, 0, nullptr, nullptr); });
}

int peloton_shm_available(const char** why) {
  static std::atomic<int> probes{0};
  try {
    // The runtime's own segment class, as a local root of a one-rank host makes it.
    const LocalShm probe("/peloton-probe-" + std::to_string(::getpid()) + "-" + std::to_string(probes++), true, 0, 1,
                         64);
    return availability(true, "", why);
  } catch (const std::exception& e) {
    return availability(false, e.what(), why);
  }
}

int peloton_nccl_available(const char** why) {
  std::string reason;
  const bool ok = nccl_available(&reason);
  return availability(ok, reason, why);
}

}  // extern "C"
