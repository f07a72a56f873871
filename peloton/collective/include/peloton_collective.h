/* peloton collective runtime: the C ABI.
 *
 * What a worker written in C or C++ (or any language with a C FFI) calls to join its gang and
 * allreduce, allgather and broadcast host buffers. It is the same runtime peloton.collective
 * drives from Python: rank 0 negotiates every named operation, shared memory carries the
 * traffic between the ranks of one host, TCP rings carry it between hosts.
 *
 *     #include <peloton_collective.h>
 *
 *     if (peloton_init() != 0) { fprintf(stderr, "%s\n", peloton_last_error()); return 1; }
 *     float grad[1000] = {...};
 *     peloton_allreduce(grad, grad, 1000, PELOTON_FLOAT32, PELOTON_AVERAGE, NULL);
 *     peloton_shutdown();
 *
 * peloton_init() reads the gang environment the scheduler sets on every task (PELOTON_RANK,
 * PELOTON_GANG_SIZE, PELOTON_PEERS, PELOTON_LOCAL_RANK/SIZE, PELOTON_CROSS_RANK/SIZE,
 * PELOTON_COLLECTIVE_TIMEOUT, PELOTON_FUSION_THRESHOLD), with the defaults and error messages of
 * peloton/core/gangenv.py. With PELOTON_GANG_SECRET set (the scheduler always sets it) the ranks
 * prove it to one another when they connect; a connection that does not is refused and logged
 * on stderr while the rank goes on waiting for its peers.
 *
 * Every function that can fail returns 0 on success and -1 on failure; peloton_last_error()
 * then says why (on the calling thread). Operations block until every rank has done them; each
 * takes a name that must be the same on every rank and unique among operations in flight, or
 * NULL: unnamed operations are numbered per kind, so every rank must issue them in one order.
 * The functions are thread-safe.
 */
#ifndef PELOTON_COLLECTIVE_H
#define PELOTON_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PELOTON_API __attribute__((visibility("default")))
#else
#define PELOTON_API
#endif

/* Element types (the runtime's codes; float16 and bfloat16 travel as 16-bit words). */
typedef enum {
  PELOTON_FLOAT32 = 0,
  PELOTON_FLOAT64 = 1,
  PELOTON_FLOAT16 = 2,
  PELOTON_BFLOAT16 = 3,
  PELOTON_INT32 = 4,
  PELOTON_INT64 = 5
} peloton_dtype;

/* Reductions; AVERAGE divides the sum by the gang size (integers truncate toward zero). */
typedef enum { PELOTON_SUM = 0, PELOTON_AVERAGE = 1, PELOTON_MIN = 2, PELOTON_MAX = 3, PELOTON_PRODUCT = 4 } peloton_op;

/* Where this rank sits in its gang and the runtime's settings, as the environment gives them. */
typedef struct {
  int rank;
  int size;
  int local_rank;  /* among the gang's ranks on this host */
  int local_size;
  int cross_rank;  /* among the hosts holding a rank of this local rank */
  int cross_size;
  double timeout;           /* seconds: a stalled or dead rank fails every operation after it */
  int64_t fusion_threshold; /* bytes: small allreduces in flight together are fused up to it */
} peloton_gang;

/* The runtime's version (the peloton package's). */
PELOTON_API const char* peloton_version(void);

/* Why the last failing call on this thread failed. */
PELOTON_API const char* peloton_last_error(void);

/* Parses the gang environment without joining the gang (what peloton_init would use). */
PELOTON_API int peloton_gang_from_env(peloton_gang* out);

/* Joins the gang from the environment; blocks until every rank has connected (or the timeout). */
PELOTON_API int peloton_init(void);

/* Leaves the gang (waits up to the timeout for the others); a no-op when not initialized. */
PELOTON_API int peloton_shutdown(void);

/* This rank's place in the gang (peloton_init's); -1 when not initialized. */
PELOTON_API int peloton_rank(void);
PELOTON_API int peloton_size(void);
PELOTON_API int peloton_local_rank(void);
PELOTON_API int peloton_local_size(void);
PELOTON_API int peloton_cross_rank(void);
PELOTON_API int peloton_cross_size(void);

/* What carries the traffic between this rank and the others on its host: "shm" (shared
 * memory), "tcp" (the gang's layout rules shared memory out), or "none" (alone on its host);
 * NULL when not initialized. Traffic between hosts always goes over TCP. */
PELOTON_API const char* peloton_local_transport(void);

/* out[i] = op over every rank's in[i], i < count; in == out reduces in place. */
PELOTON_API int peloton_allreduce(const void* in, void* out, size_t count, peloton_dtype dtype, peloton_op op,
                                  const char* name);

/* Every rank ends with root's `count` elements in buf. */
PELOTON_API int peloton_broadcast(void* buf, size_t count, peloton_dtype dtype, int root, const char* name);

/* Each rank contributes `count` elements (counts may differ between ranks); out receives all of
 * them in rank order and must hold out_count elements at least. counts, if not NULL, receives
 * each rank's count (peloton_size() entries). */
PELOTON_API int peloton_allgather(const void* in, size_t count, void* out, size_t out_count, peloton_dtype dtype,
                                  size_t* counts, const char* name);

/* Returns once every rank has entered the barrier. */
PELOTON_API int peloton_barrier(const char* name);

/* 1 when shared memory between the ranks of a host works here (a segment can be made in
 * /dev/shm), else 0 with *why set to the reason; why may be NULL. */
PELOTON_API int peloton_shm_available(const char** why);

/* 1 when NCCL and the CUDA runtime can be loaded (dlopen), else 0 with *why set to the loader's
 * errors; why may be NULL. */
PELOTON_API int peloton_nccl_available(const char** why);

#ifdef __cplusplus
}
#endif

#endif /* PELOTON_COLLECTIVE_H */
