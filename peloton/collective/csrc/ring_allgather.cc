#include "algorithms.h"

namespace peloton {

// Step s sends segment me-s right and receives segment me-s-1 from the left.
void ring_allgather(Link& link, const Ring& ring, char* buf, const Segments& seg) {
  const int n = ring.size();
  if (n <= 1) return;
  const int me = ring.me;
  const int right = ring.right(), left = ring.left();
  for (int s = 0; s < n - 1; ++s) {
    const size_t sseg = static_cast<size_t>(((me - s) % n + n) % n);
    const size_t rseg = static_cast<size_t>(((me - s - 1) % n + 2 * n) % n);
    link.exchange(right, buf + seg.off[sseg], seg.len[sseg], left, buf + seg.off[rseg], seg.len[rseg], false, nullptr);
  }
}

}  // namespace peloton
