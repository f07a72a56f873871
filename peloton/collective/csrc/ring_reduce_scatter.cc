#include <algorithm>

#include "algorithms.h"
#include "reduce.h"

namespace peloton {
namespace {
constexpr size_t kReduceChunk = 64 << 10;  // reduce as soon as this much has arrived
}  // namespace

// Step s sends segment me-s-1 right and receives segment me-s-2 from the left, reducing it into
// place: after n-1 steps the member at position p holds the full reduction of segment p.
void ring_reduce_scatter(Link& link, const Ring& ring, char* buf, const Segments& seg, DType dt, ROp op,
                         std::vector<char>& scratch) {
  const int n = ring.size();
  if (n <= 1) return;
  const size_t esz = dtype_size(dt);
  const int me = ring.me;
  const int right = ring.right(), left = ring.left();
  size_t biggest = 0;
  for (size_t l : seg.len) biggest = std::max(biggest, l);
  if (scratch.size() < biggest) scratch.resize(biggest);
  for (int s = 0; s < n - 1; ++s) {
    const size_t sseg = static_cast<size_t>(((me - s - 1) % n + 2 * n) % n);
    const size_t rseg = static_cast<size_t>(((me - s - 2) % n + 2 * n) % n);
    char* dst = buf + seg.off[rseg];
    size_t reduced = 0;
    const size_t rlen = seg.len[rseg];
    // Reduce each chunk as it lands, while the transport keeps moving the rest.
    auto on_recv = [&](size_t got) {
      const size_t ready = (got / esz) * esz;
      if (ready - reduced >= kReduceChunk || got == rlen) {
        reduce_into(dst + reduced, scratch.data() + reduced, (ready - reduced) / esz, dt, op);
        reduced = ready;
      }
    };
    link.exchange(right, buf + seg.off[sseg], seg.len[sseg], left, scratch.data(), rlen, false, on_recv);
  }
}

}  // namespace peloton
