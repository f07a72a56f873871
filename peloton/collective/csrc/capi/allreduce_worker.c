/* A worker in C that joins its peloton gang and averages a vector with the other ranks, through
 * the runtime bundle mounted at /opt/peloton (share/examples/ of the bundle).
 *
 * Build it on a machine whose glibc is not newer than the bundle's, against the bundle, so that
 * it runs in any image, even one with no C library of its own: the bundle's loader and libraries
 * are named in the binary (DT_RPATH, not RUNPATH, so they serve libpeloton_collective.so too):
 *
 *   cc -O2 -I/opt/peloton/include allreduce_worker.c -o allreduce_worker \
 *      -L/opt/peloton/lib -lpeloton_collective \
 *      -Wl,--dynamic-linker=/opt/peloton/lib/glibc/ld-linux-x86-64.so.2 \
 *      -Wl,--disable-new-dtags,-rpath,/opt/peloton/lib:/opt/peloton/lib/glibc
 *
 * (with the bundle elsewhere at build time, point -I and -L there; the paths after -Wl stay
 * /opt/peloton, where the task sees it). Run one per rank with the gang environment the
 * scheduler sets; each prints `worker rank=R size=S local=shm|tcp|none mean=M` and exits 0 when
 * its result is right.
 */
#include <stdio.h>

#include "peloton_collective.h"

#define N 4096

int main(void) {
  static float grad[N];
  if (peloton_init() != 0) {
    fprintf(stderr, "peloton_init: %s\n", peloton_last_error());
    return 1;
  }
  const int rank = peloton_rank();
  const int size = peloton_size();
  for (int i = 0; i < N; ++i) grad[i] = (float)(rank + i % 3);
  if (peloton_allreduce(grad, grad, N, PELOTON_FLOAT32, PELOTON_AVERAGE, "grad") != 0) {
    fprintf(stderr, "allreduce: %s\n", peloton_last_error());
    peloton_shutdown();
    return 1;
  }
  /* The mean of rank + i % 3 over the ranks is (size - 1) / 2 + i % 3. */
  int wrong = 0;
  for (int i = 0; i < N; ++i) wrong += grad[i] != (float)(size - 1) / 2.0f + (float)(i % 3);
  printf("worker rank=%d size=%d local=%s mean=%g\n", rank, size, peloton_local_transport(), (double)grad[0]);
  if (peloton_shutdown() != 0) {
    fprintf(stderr, "shutdown: %s\n", peloton_last_error());
    return 1;
  }
  if (wrong) fprintf(stderr, "rank %d: %d elements of the mean are wrong\n", rank, wrong);
  return wrong ? 1 : 0;
}
