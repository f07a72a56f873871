#include "algorithms.h"

namespace peloton {

void ring_allreduce(Link& link, const Ring& ring, char* buf, size_t count, DType dt, ROp op,
                    std::vector<char>& scratch) {
  const int n = ring.size();
  if (n <= 1 || count == 0) return;
  const Segments seg = even_segments(count, n, dtype_size(dt));
  ring_reduce_scatter(link, ring, buf, seg, dt, op, scratch);
  ring_allgather(link, ring, buf, seg);
}

}  // namespace peloton
