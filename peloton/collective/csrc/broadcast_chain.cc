#include "algorithms.h"

namespace peloton {

void chain_broadcast(Link& link, const Ring& ring, int root, char* buf, size_t nbytes) {
  const int n = ring.size();
  if (n <= 1 || nbytes == 0) return;
  const int pos = (ring.me - root + n) % n;  // distance from the root along the chain
  const bool sends = pos != n - 1;           // the last member only receives
  if (pos == 0) {
    link.exchange(ring.right(), buf, nbytes, -1, nullptr, 0, false, nullptr);
  } else {
    link.exchange(sends ? ring.right() : -1, buf, sends ? nbytes : 0, ring.left(), buf, nbytes, true, nullptr);
  }
}

}  // namespace peloton
