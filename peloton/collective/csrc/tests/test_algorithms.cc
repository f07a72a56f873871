// The algorithms over the in-memory link: every rank a thread, results checked against a
// reference computed here. Values are small integers, so every dtype holds them exactly and the
// order of reduction does not matter.
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "algorithms.h"
#include "doctest/doctest.h"
#include "mem_link.h"
#include "net.h"
#include "reduce.h"
#include "tcp_link.h"

using namespace peloton;
using peloton::testing::MemFabric;
using peloton::testing::MemHost;
using peloton::testing::MemLink;
using peloton::testing::run_ranks;

namespace {

const DType kDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64};
const ROp kOps[] = {ROp::SUM, ROp::AVERAGE, ROp::MIN, ROp::MAX, ROp::PRODUCT};

// A small non-negative integer (< 2048) in the bytes of `dt`.
void put(char* at, DType dt, double v) {
  switch (dt) {
    case DType::F32: { const float f = static_cast<float>(v); std::memcpy(at, &f, 4); break; }
    case DType::F64: std::memcpy(at, &v, 8); break;
    case DType::I32: { const int32_t i = static_cast<int32_t>(v); std::memcpy(at, &i, 4); break; }
    case DType::I64: { const int64_t i = static_cast<int64_t>(v); std::memcpy(at, &i, 8); break; }
    case DType::BF16: {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(at, &b, 2);
      break;
    }
    case DType::F16: {
      const auto n = static_cast<uint32_t>(v);
      uint16_t h = 0;
      if (n) {
        uint32_t e = 0;
        while ((n >> (e + 1)) != 0) ++e;
        h = static_cast<uint16_t>(((e + 15) << 10) | ((n - (1u << e)) << (10 - e)));
      }
      std::memcpy(at, &h, 2);
      break;
    }
  }
}

// Rank r's element i: 1..4, or 1..2 for PRODUCT (so a product of 7 ranks stays exact in bf16).
double value(int r, size_t i, ROp op) {
  const size_t mod = op == ROp::PRODUCT ? 2 : 4;
  return static_cast<double>((static_cast<size_t>(r) * 3 + i * 7 + i / 5) % mod + 1);
}

double combine(double a, double b, ROp op) {
  switch (op) {
    case ROp::SUM: case ROp::AVERAGE: return a + b;
    case ROp::MIN: return std::min(a, b);
    case ROp::MAX: return std::max(a, b);
    case ROp::PRODUCT: return a * b;
  }
  return 0;
}

std::vector<char> input(int r, size_t count, DType dt, ROp op) {
  const size_t esz = dtype_size(dt);
  std::vector<char> b(count * esz);
  for (size_t i = 0; i < count; ++i) put(b.data() + i * esz, dt, value(r, i, op));
  return b;
}

// The reduction over ranks of elements [first, first + count) (AVERAGE as SUM: the algorithms
// leave the division to the caller).
std::vector<char> reduced(int n, size_t first, size_t count, DType dt, ROp op) {
  const size_t esz = dtype_size(dt);
  std::vector<char> b(count * esz);
  for (size_t i = 0; i < count; ++i) {
    double acc = value(0, first + i, op);
    for (int r = 1; r < n; ++r) acc = combine(acc, value(r, first + i, op), op);
    put(b.data() + i * esz, dt, acc);
  }
  return b;
}

std::string describe(int n, size_t count, DType dt, ROp op) {
  return std::to_string(n) + " ranks, " + std::to_string(count) + " x " + dtype_name(dt) + ", " + op_name(op);
}

}  // namespace

TEST_CASE("ring allreduce: every dtype and op, sizes not divisible by the ranks, one rank") {
  for (int n : {1, 2, 3, 4, 7}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{2}, static_cast<size_t>(n) + 1, size_t{1001}}) {
      for (DType dt : kDTypes) {
        for (ROp op : kOps) {
          CAPTURE(describe(n, count, dt, op));
          MemFabric fabric(n, 5);  // 5-byte pieces: every element lands split
          std::vector<std::vector<char>> bufs;
          for (int r = 0; r < n; ++r) bufs.push_back(input(r, count, dt, op));
          run_ranks(n, [&](int r) {
            MemLink link(fabric, r);
            std::vector<char> scratch;
            ring_allreduce(link, Ring::world(r, n), bufs[static_cast<size_t>(r)].data(), count, dt, op, scratch);
          });
          const auto want = reduced(n, 0, count, dt, op);
          for (int r = 0; r < n; ++r) CHECK(bufs[static_cast<size_t>(r)] == want);
        }
      }
    }
  }
}

TEST_CASE("ring allreduce: large buffers reduce as they land (segments over the 64 KiB chunk)") {
  for (int n : {2, 3, 5}) {
    for (size_t count : {size_t{100003}, size_t{262147}}) {
      CAPTURE(describe(n, count, DType::F32, ROp::SUM));
      MemFabric fabric(n, 40961);
      std::vector<std::vector<char>> bufs;
      for (int r = 0; r < n; ++r) bufs.push_back(input(r, count, DType::F32, ROp::SUM));
      run_ranks(n, [&](int r) {
        MemLink link(fabric, r);
        std::vector<char> scratch;
        ring_allreduce(link, Ring::world(r, n), bufs[static_cast<size_t>(r)].data(), count, DType::F32, ROp::SUM,
                       scratch);
      });
      const auto want = reduced(n, 0, count, DType::F32, ROp::SUM);
      for (int r = 0; r < n; ++r) CHECK(bufs[static_cast<size_t>(r)] == want);
    }
  }
}

TEST_CASE("ring allreduce then divide: AVERAGE as the runtime does it") {
  const int n = 3;
  const size_t count = 10;
  MemFabric fabric(n);
  std::vector<std::vector<char>> bufs(n, std::vector<char>(count * 4));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) put(bufs[static_cast<size_t>(r)].data() + i * 4, DType::F32, static_cast<double>(r + 1) * 2);
  }
  run_ranks(n, [&](int r) {
    MemLink link(fabric, r);
    std::vector<char> scratch;
    char* b = bufs[static_cast<size_t>(r)].data();
    ring_allreduce(link, Ring::world(r, n), b, count, DType::F32, ROp::AVERAGE, scratch);
    divide_by(b, count, DType::F32, n);
  });
  for (auto& b : bufs) {
    for (size_t i = 0; i < count; ++i) {
      float f;
      std::memcpy(&f, b.data() + i * 4, 4);
      CHECK(f == doctest::Approx(4.0));
    }
  }
}

TEST_CASE("ring allreduce over a sub-ring: only its members take part, in ring order") {
  // Ranks 1, 3 and 4 of 5 form a ring (the hierarchical path's cross-host ring); 0 and 2 idle.
  const int world = 5;
  const std::vector<int> members{1, 3, 4};
  const size_t count = 17;
  MemFabric fabric(world, 3);
  std::vector<std::vector<char>> bufs;
  for (int p = 0; p < 3; ++p) bufs.push_back(input(p, count, DType::I64, ROp::MAX));
  run_ranks(3, [&](int p) {
    MemLink link(fabric, members[static_cast<size_t>(p)]);
    Ring ring{members, p};
    std::vector<char> scratch;
    ring_allreduce(link, ring, bufs[static_cast<size_t>(p)].data(), count, DType::I64, ROp::MAX, scratch);
  });
  const auto want = reduced(3, 0, count, DType::I64, ROp::MAX);
  for (auto& b : bufs) CHECK(b == want);
}

TEST_CASE("ring reduce-scatter: rows split as evenly as can be, fewer rows than ranks") {
  for (int n : {1, 2, 3, 4, 6}) {
    for (int64_t rows : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{5}, int64_t{13}}) {
      for (ROp op : {ROp::SUM, ROp::MIN, ROp::PRODUCT}) {
        const size_t cols = 3;
        const DType dt = DType::I32;
        const size_t count = static_cast<size_t>(rows) * cols;
        CAPTURE(describe(n, count, dt, op));
        const Segments seg = reduce_scatter_segments(rows, cols * 4, n);
        size_t total = 0;
        for (int j = 0; j < n; ++j) {
          CHECK(seg.off[static_cast<size_t>(j)] == total);
          const int64_t mine = static_cast<int64_t>(seg.len[static_cast<size_t>(j)] / (cols * 4));
          CHECK((mine == rows / n || mine == rows / n + 1));
          total += seg.len[static_cast<size_t>(j)];
        }
        CHECK(total == count * 4);
        MemFabric fabric(n, 7);
        std::vector<std::vector<char>> bufs;
        for (int r = 0; r < n; ++r) bufs.push_back(input(r, count, dt, op));
        run_ranks(n, [&](int r) {
          MemLink link(fabric, r);
          std::vector<char> scratch;
          ring_reduce_scatter(link, Ring::world(r, n), bufs[static_cast<size_t>(r)].data(), seg, dt, op, scratch);
        });
        const auto want = reduced(n, 0, count, dt, op);
        for (int r = 0; r < n; ++r) {
          const size_t off = seg.off[static_cast<size_t>(r)], len = seg.len[static_cast<size_t>(r)];
          CHECK(std::vector<char>(bufs[static_cast<size_t>(r)].begin() + static_cast<std::ptrdiff_t>(off),
                                  bufs[static_cast<size_t>(r)].begin() + static_cast<std::ptrdiff_t>(off + len)) ==
                std::vector<char>(want.begin() + static_cast<std::ptrdiff_t>(off),
                                  want.begin() + static_cast<std::ptrdiff_t>(off + len)));
        }
      }
    }
  }
}

TEST_CASE("ring allgather: uneven contributions, some empty") {
  for (int n : {1, 2, 3, 5}) {
    std::vector<int64_t> dim0s;
    for (int r = 0; r < n; ++r) dim0s.push_back(r % 3 == 1 ? 0 : r + 2);  // rank 1 sends no rows
    const size_t row = row_bytes({-1, 2, 3}, DType::F64);
    CHECK(row == 48);
    const Segments seg = allgather_segments(dim0s, row);
    const size_t total = seg.off.back() + seg.len.back();
    std::vector<char> want(total);
    for (size_t i = 0; i < total; ++i) want[i] = static_cast<char>(i * 13 + 7);
    MemFabric fabric(n, 11);
    std::vector<std::vector<char>> bufs(static_cast<size_t>(n), std::vector<char>(total, 0));
    for (int r = 0; r < n; ++r) {
      const size_t off = seg.off[static_cast<size_t>(r)], len = seg.len[static_cast<size_t>(r)];
      std::memcpy(bufs[static_cast<size_t>(r)].data() + off, want.data() + off, len);
    }
    run_ranks(n, [&](int r) {
      MemLink link(fabric, r);
      ring_allgather(link, Ring::world(r, n), bufs[static_cast<size_t>(r)].data(), seg);
    });
    for (auto& b : bufs) CHECK(b == want);
  }
}

TEST_CASE("chain broadcast: every root, forwarding what has landed") {
  for (int n : {1, 2, 3, 4}) {
    for (size_t nbytes : {size_t{0}, size_t{1}, size_t{12345}}) {
      for (int root = 0; root < n; ++root) {
        CAPTURE(std::to_string(n) + " ranks, " + std::to_string(nbytes) + " bytes, root " + std::to_string(root));
        MemFabric fabric(n, 1000);
        std::vector<char> want(nbytes);
        for (size_t i = 0; i < nbytes; ++i) want[i] = static_cast<char>(i * 31 + 3);
        std::vector<std::vector<char>> bufs(static_cast<size_t>(n), std::vector<char>(nbytes, 0));
        bufs[static_cast<size_t>(root)] = want;
        run_ranks(n, [&](int r) {
          MemLink link(fabric, r);
          chain_broadcast(link, Ring::world(r, n), root, bufs[static_cast<size_t>(r)].data(), nbytes);
        });
        for (auto& b : bufs) CHECK(b == want);
      }
    }
  }
}

TEST_CASE("hierarchical allreduce: shared slots on each host, a cross-host ring, several chunks") {
  struct Shape {
    int hosts, local;
  };
  for (Shape s : {Shape{1, 2}, Shape{1, 3}, Shape{2, 2}, Shape{3, 2}, Shape{2, 3}}) {
    for (size_t count : {size_t{1}, size_t{5}, size_t{97}, size_t{1000}}) {
      for (ROp op : {ROp::SUM, ROp::MAX, ROp::PRODUCT}) {
        const int n = s.hosts * s.local;
        const DType dt = DType::F32;
        CAPTURE(std::to_string(s.hosts) + " hosts x " + std::to_string(s.local) + ", " + describe(n, count, dt, op));
        MemFabric fabric(n, 9);
        std::vector<std::unique_ptr<MemHost>> hosts;
        for (int h = 0; h < s.hosts; ++h) hosts.push_back(std::make_unique<MemHost>(s.local, 64));  // 16 floats a chunk
        std::vector<std::vector<char>> bufs;
        for (int r = 0; r < n; ++r) bufs.push_back(input(r, count, dt, op));
        run_ranks(n, [&](int r) {
          const int host = r / s.local, local = r % s.local;
          MemHost::Group group(*hosts[static_cast<size_t>(host)], local);
          Ring cross;
          for (int c = 0; c < s.hosts; ++c) cross.members.push_back(c * s.local + local);
          cross.me = host;
          MemLink link(fabric, r);
          std::vector<char> scratch;
          local_allreduce(group, link, cross, bufs[static_cast<size_t>(r)].data(), count, dt, op, scratch);
        });
        const auto want = reduced(n, 0, count, dt, op);
        for (int r = 0; r < n; ++r) CHECK(bufs[static_cast<size_t>(r)] == want);
      }
    }
  }
}

TEST_CASE("even segments: the first count % n hold one more element") {
  const Segments s = even_segments(10, 4, 2);
  CHECK(s.len == std::vector<size_t>{6, 6, 4, 4});
  CHECK(s.off == std::vector<size_t>{0, 6, 12, 16});
  const Segments one = even_segments(3, 1, 8);
  CHECK(one.len == std::vector<size_t>{24});
  CHECK(row_bytes({}, DType::I64) == 8);
  CHECK(row_bytes({4}, DType::F16) == 2);
}

TEST_CASE("link send and recv: one direction only") {
  MemFabric fabric(2, 1);
  MemLink link(fabric, 0);
  std::vector<char> buf(4);
  std::thread t([&] {
    MemLink other(fabric, 1);
    other.send(0, "abcd", 4);
  });
  link.recv(1, buf.data(), 4);
  t.join();
  CHECK(std::string(buf.data(), 4) == "abcd");
}

TEST_CASE("TcpLink: the ring algorithms over connected non-blocking sockets") {
  // One socket pair per pair of ranks stands in for the TCP mesh: TcpLink's duplex loop (partial
  // sends and receives, poll, the gate of a chain) is what is under test.
  const int n = 3;
  std::vector<std::vector<int>> fds(n, std::vector<int>(n, -1));
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      int sv[2];
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
      tune_socket(sv[0]);
      tune_socket(sv[1]);
      fds[static_cast<size_t>(a)][static_cast<size_t>(b)] = sv[0];
      fds[static_cast<size_t>(b)][static_cast<size_t>(a)] = sv[1];
    }
  }
  const size_t count = 3 * 1024 * 1024 + 5;  // past the socket buffers: sends go in parts
  std::vector<std::vector<char>> bufs;
  for (int r = 0; r < n; ++r) bufs.push_back(input(r, count, DType::F32, ROp::SUM));
  std::vector<std::vector<char>> bcast(n, std::vector<char>(1 << 22, 0));
  for (size_t i = 0; i < bcast[1].size(); ++i) bcast[1][i] = static_cast<char>(i * 7);
  run_ranks(n, [&](int r) {
    TcpLink link(fds[static_cast<size_t>(r)], std::chrono::seconds(20), Watch{});
    std::vector<char> scratch;
    ring_allreduce(link, Ring::world(r, n), bufs[static_cast<size_t>(r)].data(), count, DType::F32, ROp::SUM, scratch);
    chain_broadcast(link, Ring::world(r, n), 1, bcast[static_cast<size_t>(r)].data(), bcast[0].size());
  });
  const auto want = reduced(n, 0, count, DType::F32, ROp::SUM);
  for (int r = 0; r < n; ++r) {
    CHECK(bufs[static_cast<size_t>(r)] == want);
    CHECK(bcast[static_cast<size_t>(r)] == bcast[1]);
  }
  // A peer that closes mid-transfer is a PeerError naming it.
  ::close(fds[1][0]);
  TcpLink link(fds[0], std::chrono::seconds(5), Watch{});
  std::vector<char> buf(16);
  CHECK_THROWS_AS(link.recv(1, buf.data(), buf.size()), PeerError);
  for (auto& row : fds) {
    for (int fd : row) {
      if (fd >= 0 && fd != fds[1][0]) ::close(fd);
    }
  }
}
