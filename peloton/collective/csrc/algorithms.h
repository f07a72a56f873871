// The collective algorithms, written over the link interface (link.h) and a host's shared slots
// (LocalGroup): no sockets, no negotiation, no threads. One algorithm per file:
// ring_reduce_scatter.cc, ring_allgather.cc, ring_allreduce.cc, broadcast_chain.cc,
// allreduce_local.cc; how a buffer is cut into per-rank segments is layout.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.h"
#include "link.h"

namespace peloton {

// Byte offset and length of each ring position's segment of a buffer.
struct Segments {
  std::vector<size_t> off, len;
};

// `count` elements of `esz` bytes in n segments as even as can be (the first count % n hold one more).
Segments even_segments(size_t count, int n, size_t esz);
// Allgather: rank j contributes dim0s[j] rows of `row_bytes`, laid out in rank order.
Segments allgather_segments(const std::vector<int64_t>& dim0s, size_t row_bytes);
// Reduce-scatter: `rows` rows of `row_bytes` split by rows as evenly as can be over n ranks.
Segments reduce_scatter_segments(int64_t rows, size_t row_bytes, int n);
// The bytes of one row of a tensor of `shape` (every dimension but the first; 1 row for a scalar).
size_t row_bytes(const std::vector<int64_t>& shape, DType dt);

// After it, the member at ring position p holds the full reduction of segment p (in place in
// `buf`; other segments hold partial sums). `scratch` is reused across calls.
void ring_reduce_scatter(Link& link, const Ring& ring, char* buf, const Segments& seg, DType dt, ROp op,
                         std::vector<char>& scratch);

// The member at ring position p starts with segment p in place and ends with all of them.
void ring_allgather(Link& link, const Ring& ring, char* buf, const Segments& seg);

// Reduce-scatter then allgather over even segments: every member ends with the reduction of
// all `count` elements. AVERAGE reduces as SUM (the caller divides).
void ring_allreduce(Link& link, const Ring& ring, char* buf, size_t count, DType dt, ROp op,
                    std::vector<char>& scratch);

// A pipelined chain from ring position `root` round the ring: every link carries the data once
// and each member forwards bytes as they land.
void chain_broadcast(Link& link, const Ring& ring, int root, char* buf, size_t nbytes);

// The ranks of one host that share memory: one slot each, and a barrier.
class LocalGroup {
 public:
  virtual ~LocalGroup() = default;
  virtual int rank() const = 0;  // local rank
  virtual int size() const = 0;  // local size
  virtual char* slot(int local_rank) = 0;
  virtual size_t slot_bytes() const = 0;
  // Returns once every local rank has arrived; throws PeerError when one does not come.
  virtual void barrier() = 0;
};

// Hierarchical allreduce through the host's shared slots, chunk by chunk: every local rank
// copies its chunk into its slot; local rank p reduces part p of all slots into slot 0 and, with
// several hosts, allreduces that part over `cross` (local rank p of every host); then everyone
// copies slot 0 out. AVERAGE reduces as SUM (the caller divides).
void local_allreduce(LocalGroup& local, Link& link, const Ring& cross, char* buf, size_t count, DType dt, ROp op,
                     std::vector<char>& scratch);

}  // namespace peloton
