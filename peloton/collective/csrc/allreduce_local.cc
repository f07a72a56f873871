#include <algorithm>
#include <cstring>

#include "algorithms.h"
#include "reduce.h"

namespace peloton {

void local_allreduce(LocalGroup& local, Link& link, const Ring& cross, char* buf, size_t count, DType dt, ROp op,
                     std::vector<char>& scratch) {
  const size_t esz = dtype_size(dt);
  const size_t chunk = local.slot_bytes() / esz;
  const size_t L = static_cast<size_t>(local.size());
  const size_t me = static_cast<size_t>(local.rank());
  char* result = local.slot(0);
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    std::memcpy(local.slot(local.rank()), buf + first * esz, n * esz);
    local.barrier();
    const size_t part_off = n / L * me + std::min(me, n % L);
    const size_t part_len = n / L + (me < n % L ? 1 : 0);
    for (int i = 1; i < local.size(); ++i) {
      reduce_into(result + part_off * esz, local.slot(i) + part_off * esz, part_len, dt, op);
    }
    ring_allreduce(link, cross, result + part_off * esz, part_len, dt, op, scratch);
    local.barrier();
    std::memcpy(buf + first * esz, result, n * esz);
    local.barrier();
  }
}

}  // namespace peloton
