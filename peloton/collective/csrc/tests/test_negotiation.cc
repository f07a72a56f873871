// Negotiation without sockets: the coordinator's table, its checks, fusion and stalls; the
// failure agreement; the wire format of requests and responses.
#include <chrono>
#include <string>
#include <vector>

#include "doctest/doctest.h"
#include "negotiation.h"

using namespace peloton;
using namespace std::chrono_literals;

namespace {

Request req(const std::string& name, std::vector<int64_t> shape = {4}, Kind kind = Kind::ALLREDUCE,
            DType dt = DType::F32, ROp op = ROp::SUM, int root = 0) {
  Request r;
  r.name = name;
  r.kind = kind;
  r.dtype = dt;
  r.op = op;
  r.root = root;
  r.shape = std::move(shape);
  return r;
}

const Clock::time_point t0{};

// Every rank of `size` asks for `r` (rank j's copy changed by `vary`, if given).
template <class Vary>
void all_ask(Coordinator& c, int size, const Request& r, Vary vary) {
  for (int j = 0; j < size; ++j) {
    Request x = r;
    vary(j, x);
    c.add(j, x, t0);
  }
}
void all_ask(Coordinator& c, int size, const Request& r) {
  all_ask(c, size, r, [](int, Request&) {});
}

std::string one_error(Coordinator& c) {
  auto rs = c.responses();
  REQUIRE(rs.size() == 1);
  CHECK_FALSE(rs[0].ok);
  return rs[0].error;
}

}  // namespace

TEST_CASE("a name is ready once every rank has asked, in the order names became ready") {
  Coordinator c(3, 0, 10s);
  c.add(0, req("a"), t0);
  c.add(1, req("b"), t0);
  c.add(1, req("a"), t0);
  CHECK_FALSE(c.has_ready());
  CHECK(c.responses().empty());
  c.add(0, req("b"), t0);
  c.add(2, req("b"), t0);
  c.add(2, req("a"), t0);
  CHECK(c.has_ready());
  auto rs = c.responses();
  REQUIRE(rs.size() == 2);  // threshold 0: no fusion
  CHECK(rs[0].names == std::vector<std::string>{"b"});
  CHECK(rs[1].names == std::vector<std::string>{"a"});
  CHECK(rs[0].ok);
  CHECK(c.idle());
}

TEST_CASE("asking twice under one name counts once") {
  Coordinator c(2, 0, 10s);
  c.add(0, req("a"), t0);
  c.add(0, req("a"), t0);
  CHECK_FALSE(c.has_ready());
  c.add(1, req("a"), t0);
  CHECK(c.responses().size() == 1);
}

TEST_CASE("one rank: everything is ready at once") {
  Coordinator c(1, 1 << 20, 10s);
  c.add(0, req("x", {}, Kind::BARRIER), t0);
  auto rs = c.responses();
  REQUIRE(rs.size() == 1);
  CHECK(rs[0].ok);
}

TEST_CASE("fusion: consecutive allreduces of one dtype and op within the threshold") {
  Coordinator c(2, 64, 10s);  // bytes
  all_ask(c, 2, req("a", {4}));                      // 16 bytes
  all_ask(c, 2, req("b", {2, 2}));                   // 16: fused (32)
  all_ask(c, 2, req("c", {8}));                      // 32: fused (64, the threshold itself)
  all_ask(c, 2, req("d", {1}));                      // 4: over, starts a new group
  all_ask(c, 2, req("e", {1}, Kind::ALLREDUCE, DType::F64));       // other dtype: new group
  all_ask(c, 2, req("f", {1}, Kind::ALLREDUCE, DType::F64, ROp::MAX));  // other op: new group
  all_ask(c, 2, req("g", {1}, Kind::BROADCAST, DType::F64, ROp::MAX));  // not an allreduce: alone
  all_ask(c, 2, req("h", {1}, Kind::ALLREDUCE, DType::F64, ROp::MAX));  // after it: no fusing across
  auto rs = c.responses();
  std::vector<std::vector<std::string>> groups;
  for (auto& r : rs) groups.push_back(r.names);
  CHECK(groups == std::vector<std::vector<std::string>>{{"a", "b", "c"}, {"d"}, {"e"}, {"f"}, {"g"}, {"h"}});
}

TEST_CASE("fusion: a tensor over the threshold goes alone, and a failed check ends a group") {
  Coordinator c(2, 16, 10s);
  all_ask(c, 2, req("big", {100}));
  all_ask(c, 2, req("small", {1}));
  all_ask(c, 2, req("bad", {1}), [](int j, Request& r) { r.shape = {j + 1}; });
  all_ask(c, 2, req("after", {1}));
  auto rs = c.responses();
  REQUIRE(rs.size() == 4);
  CHECK(rs[0].names == std::vector<std::string>{"big"});
  CHECK(rs[1].names == std::vector<std::string>{"small"});
  CHECK_FALSE(rs[2].ok);
  CHECK(rs[3].names == std::vector<std::string>{"after"});
}

TEST_CASE("mismatches name the ranks and what each sent") {
  SUBCASE("kind") {
    Coordinator c(3, 0, 10s);
    all_ask(c, 3, req("t"), [](int j, Request& r) { if (j == 1) r.kind = Kind::BROADCAST; });
    CHECK(one_error(c) ==
          "collective of tensor 't': mismatch across ranks: ranks [0, 2] sent allreduce, ranks [1] sent broadcast");
  }
  SUBCASE("dtype") {
    Coordinator c(2, 0, 10s);
    all_ask(c, 2, req("t"), [](int j, Request& r) { if (j == 0) r.dtype = DType::BF16; });
    CHECK(one_error(c) == "allreduce of tensor 't': mismatch across ranks: ranks [0] sent bfloat16, ranks [1] sent float32");
  }
  SUBCASE("op, for allreduce and reduce_scatter") {
    Coordinator c(2, 0, 10s);
    all_ask(c, 2, req("t", {4}, Kind::REDUCE_SCATTER), [](int j, Request& r) { if (j == 1) r.op = ROp::MAX; });
    CHECK(one_error(c) == "reduce_scatter of tensor 't': mismatch across ranks: ranks [0] sent op sum, ranks [1] sent op max");
  }
  SUBCASE("root of a broadcast") {
    Coordinator c(2, 0, 10s);
    all_ask(c, 2, req("t", {4}, Kind::BROADCAST), [](int j, Request& r) { r.root = j; });
    CHECK(one_error(c) == "broadcast of tensor 't': mismatch across ranks: ranks [0] sent root_rank 0, ranks [1] sent root_rank 1");
  }
  SUBCASE("shape") {
    Coordinator c(2, 0, 10s);
    all_ask(c, 2, req("t", {4}), [](int j, Request& r) { if (j == 1) r.shape = {2, 2}; });
    CHECK(one_error(c) == "allreduce of tensor 't': mismatch across ranks: ranks [0] sent shape (4,), ranks [1] sent shape (2, 2)");
  }
  SUBCASE("allgather: only the trailing shape must agree; the first dimensions come back") {
    Coordinator c(3, 0, 10s);
    all_ask(c, 3, req("g", {1, 3}, Kind::ALLGATHER), [](int j, Request& r) { r.shape[0] = j * 2; });
    auto rs = c.responses();
    REQUIRE(rs.size() == 1);
    CHECK(rs[0].ok);
    CHECK(rs[0].dim0s == std::vector<int64_t>{0, 2, 4});
    all_ask(c, 3, req("h", {1, 3}, Kind::ALLGATHER), [](int j, Request& r) { if (j == 2) r.shape = {1, 4}; });
    CHECK(one_error(c) ==
          "allgather of tensor 'h': mismatch across ranks: ranks [0, 1] sent trailing shape (3,), ranks [2] sent trailing shape (4,)");
  }
  SUBCASE("allgather of scalars: one row each") {
    Coordinator c(2, 0, 10s);
    all_ask(c, 2, req("s", {}, Kind::ALLGATHER));
    auto rs = c.responses();
    REQUIRE(rs.size() == 1);
    CHECK(rs[0].dim0s == std::vector<int64_t>{1, 1});
  }
  SUBCASE("a barrier checks no shape") {
    Coordinator c(2, 0, 10s);
    all_ask(c, 2, req("b", {}, Kind::BARRIER), [](int j, Request& r) { r.shape = {j}; });
    auto rs = c.responses();
    REQUIRE(rs.size() == 1);
    CHECK(rs[0].ok);
  }
}

TEST_CASE("stalls: a name some rank has waited on for the timeout fails, naming who is missing") {
  Coordinator c(4, 0, 2500ms);
  c.add(0, req("w", {4}, Kind::BROADCAST), t0);
  c.add(2, req("w", {4}, Kind::BROADCAST), t0 + 1s);
  CHECK(c.stalls(t0 + 2499ms).empty());
  auto rs = c.stalls(t0 + 2500ms);
  REQUIRE(rs.size() == 1);
  CHECK_FALSE(rs[0].ok);
  CHECK(rs[0].names == std::vector<std::string>{"w"});
  CHECK(rs[0].error == "broadcast of tensor 'w' timed out after 2.5 s: submitted by ranks [0, 2], missing ranks [1, 3]");
  CHECK(c.idle());
}

TEST_CASE("a rank that leaves: what it had asked for is forgotten, and a name nobody asks for goes quietly") {
  Coordinator c(2, 0, 1s);
  c.add(1, req("x"), t0);
  c.forget_rank(1);
  CHECK_FALSE(c.idle());
  CHECK(c.stalls(t0 + 5s).empty());  // no rank asks for it any more: dropped, no error
  CHECK(c.idle());
  c.add(0, req("y"), t0);
  c.forget_rank(0);
  c.add(0, req("y"), t0);  // asked again after leaving: counted once
  c.add(1, req("y"), t0);
  CHECK(c.responses().size() == 1);
}

TEST_CASE("failure agreement: the reason stands unless a rank is found dead") {
  const std::vector<bool> none(4, false);
  SUBCASE("nobody died") {
    FailureAgreement a(4, "rank 2 sent nothing for 1 s", -1, false, none, none);
    CHECK(a.awaiting() == std::vector<int>{1, 2, 3});
    a.reported(2);
    CHECK(a.awaiting() == std::vector<int>{1, 3});
    CHECK(a.verdict() == "rank 2 sent nothing for 1 s");
    CHECK(a.to_notify() == std::vector<int>{1, 2, 3});
  }
  SUBCASE("a worker's control connection closes: it died") {
    FailureAgreement a(4, "rank 3 closed the connection mid-transfer", 3, true, none, none);
    a.closed(1);
    CHECK(a.awaiting() == std::vector<int>{2, 3});
    CHECK(a.verdict() == "rank 1 died or lost the connection (missing ranks [1])");
    CHECK(a.to_notify() == std::vector<int>{2, 3});
    a.closed(3);
    CHECK(a.verdict() == "ranks [1, 3] died or lost the connection (missing ranks [1, 3])");
    CHECK(a.to_notify() == std::vector<int>{2});
  }
  SUBCASE("the failed peer's control already closed: dead from the start") {
    std::vector<bool> gone = none;
    gone[2] = true;
    FailureAgreement a(4, "rank 2 died or lost its connection", 2, true, gone, none);
    CHECK(a.verdict() == "rank 2 died or lost the connection (missing ranks [2])");
    CHECK(a.awaiting() == std::vector<int>{1, 3});
    CHECK(a.to_notify() == std::vector<int>{1, 3});
  }
  SUBCASE("a worker that reported the failure is not awaited; one that said goodbye neither") {
    std::vector<bool> bye = none;
    bye[3] = true;
    FailureAgreement a(4, "rank 1: boom", 1, false, none, bye);
    CHECK(a.awaiting() == std::vector<int>{2});
    CHECK(a.to_notify() == std::vector<int>{1, 2, 3});
  }
  CHECK(asks_coordinator(2, true));
  CHECK(asks_coordinator(0, false));
  CHECK_FALSE(asks_coordinator(0, true));  // rank 0 itself is gone: nobody to ask
}

TEST_CASE("disagreement groups ranks by what they sent") {
  CHECK(disagreement({"a", "a"}).empty());
  CHECK(disagreement({}).empty());
  CHECK(disagreement({"b", "a", "b", "c"}) == "ranks [0, 2] sent b, ranks [1] sent a, ranks [3] sent c");
}

TEST_CASE("requests and responses survive the wire") {
  Request r = req("layer.3/weight", {2, -1, 7}, Kind::REDUCE_SCATTER, DType::I64, ROp::PRODUCT, 5);
  Writer w;
  write_request(w, r);
  Response s;
  s.ok = false;
  s.names = {"a", "", "ü"};
  s.error = "boom";
  s.dim0s = {0, 3};
  write_response(w, s);
  Reader rd(w.bytes());
  const Request r2 = read_request(rd);
  CHECK(r2.name == r.name);
  CHECK(r2.kind == r.kind);
  CHECK(r2.dtype == r.dtype);
  CHECK(r2.op == r.op);
  CHECK(r2.root == r.root);
  CHECK(r2.shape == r.shape);
  const Response s2 = read_response(rd);
  CHECK(s2.ok == s.ok);
  CHECK(s2.names == s.names);
  CHECK(s2.error == s.error);
  CHECK(s2.dim0s == s.dim0s);
  CHECK_THROWS_AS(read_request(rd), CollectiveError);  // nothing left: malformed
}
