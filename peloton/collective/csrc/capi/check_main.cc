// peloton-collective-check: the runtime bundle's self-check, for any container (like Horovod's
// --check-build). It uses only the C ABI (peloton_collective.h), as a user's worker would.
//
// It always prints what it found, one `key: value` line each: the bundle's version, the
// transports (tcp; shm: shared memory between the ranks of one host) and whether NCCL loads
// (else the loader's reason). Then it runs one of:
//   --local N  N ranks forked on 127.0.0.1 as one host (ports from the kernel), through the
//              same gang environment a task gets (a gang secret too); the default, with N = 2
//   --gang     this process as one rank of the gang its PELOTON_* environment describes
//   --env      the gang environment as the runtime parses it, joining nothing
// Each rank prints one line, `gang rank=R size=S local_rank=.. local_size=.. cross_rank=..
// cross_size=.. local=shm|tcp|none cross=tcp|none result=ok|failed`, where local names what
// carried the traffic between the ranks of this host and cross what carried it between hosts.
// Exit status: 0 when every check passed, 1 with an `error:` line when one failed, 2 on misuse.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "peloton_collective.h"

namespace {

constexpr int kUsage = 2;

const char* kHelp =
    "usage: peloton-collective-check [--local N | --gang | --env] [--timeout SECONDS]\n"
    "\n"
    "Checks the peloton collective runtime: prints its version, the transports it can use\n"
    "(tcp, shm) and whether NCCL loads, then\n"
    "  --local N          forks N ranks on 127.0.0.1 as one host and checks allreduce, broadcast\n"
    "                     and allgather among them (the default, N = 2)\n"
    "  --gang             does the same as one rank of the gang in the PELOTON_* environment\n"
    "  --env              prints the gang environment as the runtime reads it, joining nothing\n"
    "  --timeout SECONDS  --local: the ranks' collective timeout (default 10)\n"
    "Exits 0 when every check passed, 1 when one failed.\n";

void error(const std::string& what) { std::fprintf(stderr, "error: %s\n", what.c_str()); }

std::string errno_str(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Whether this process can listen on loopback TCP (the runtime's transport between hosts).
std::string tcp_problem() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_str("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string problem;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    problem = errno_str("bind 127.0.0.1");
  } else if (::listen(fd, 1) != 0) {
    problem = errno_str("listen");
  }
  ::close(fd);
  return problem;
}

void print_found() {
  std::printf("version: %s\n", peloton_version());
  const std::string tcp = tcp_problem();
  std::printf("tcp: %s\n", tcp.empty() ? "yes" : ("no (" + tcp + ")").c_str());
  const char* why = nullptr;
  const bool shm = peloton_shm_available(&why) != 0;
  std::printf("shm: %s\n", shm ? "yes" : ("no (" + std::string(why) + ")").c_str());
  const bool nccl = peloton_nccl_available(&why) != 0;
  std::printf("nccl: %s\n", nccl ? "yes" : ("no (" + std::string(why) + ")").c_str());
  std::fflush(stdout);
}

// The checks every rank runs; empty when all passed, else what went wrong first.
std::string exercise(int rank, int size) {
  auto c_error = [](const char* what) { return std::string(what) + ": " + peloton_last_error(); };

  // Sum: more elements than one shared-memory slot holds, so the chunked path runs too. The
  // values are small integers, exact in float32 whatever order the ranks add them in.
  const size_t n = (size_t{1} << 20) + 3;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
  if (peloton_allreduce(x.data(), x.data(), n, PELOTON_FLOAT32, PELOTON_SUM, "check.sum") != 0) {
    return c_error("allreduce sum float32");
  }
  const float base = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = 0; i < n; ++i) {
    const float want = base + static_cast<float>(size * static_cast<int>(i % 7));
    if (x[i] != want) {
      return "allreduce sum float32: element " + std::to_string(i) + " is " + std::to_string(x[i]) + ", expected " +
             std::to_string(want);
    }
  }

  const int32_t mine[2] = {rank, -rank};
  int32_t most[2] = {0, 0};
  if (peloton_allreduce(mine, most, 2, PELOTON_INT32, PELOTON_MAX, "check.max") != 0) {
    return c_error("allreduce max int32");
  }
  if (most[0] != size - 1 || most[1] != 0) {
    return "allreduce max int32: got [" + std::to_string(most[0]) + ", " + std::to_string(most[1]) + "], expected [" +
           std::to_string(size - 1) + ", 0]";
  }

  double mean = rank;
  if (peloton_allreduce(&mean, &mean, 1, PELOTON_FLOAT64, PELOTON_AVERAGE, "check.average") != 0) {
    return c_error("allreduce average float64");
  }
  if (mean != (size - 1) / 2.0) {
    return "allreduce average float64: got " + std::to_string(mean) + ", expected " + std::to_string((size - 1) / 2.0);
  }

  const int root = size - 1;
  int64_t from_root[3];
  for (int i = 0; i < 3; ++i) from_root[i] = int64_t{rank} * 10 + i;
  if (peloton_broadcast(from_root, 3, PELOTON_INT64, root, "check.broadcast") != 0) return c_error("broadcast int64");
  for (int i = 0; i < 3; ++i) {
    if (from_root[i] != int64_t{root} * 10 + i) {
      return "broadcast int64: element " + std::to_string(i) + " is " + std::to_string(from_root[i]) + ", expected " +
             std::to_string(int64_t{root} * 10 + i);
    }
  }

  const double own[2] = {static_cast<double>(rank), rank + 0.5};
  std::vector<double> all(2 * static_cast<size_t>(size));
  std::vector<size_t> counts(static_cast<size_t>(size));
  if (peloton_allgather(own, 2, all.data(), all.size(), PELOTON_FLOAT64, counts.data(), "check.allgather") != 0) {
    return c_error("allgather float64");
  }
  for (size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] != 2 || all[2 * j] != static_cast<double>(j) || all[2 * j + 1] != j + 0.5) {
      return "allgather float64: rank " + std::to_string(j) + "'s part is wrong";
    }
  }

  // Unnamed: the runtime numbers it, as every rank issues it in the same order.
  if (peloton_barrier(nullptr) != 0) return c_error("barrier");
  return "";
}

// This process as one rank of the gang in its environment: join, check, leave, report.
int gang_check() {
  if (peloton_init() != 0) {
    error(std::string("cannot join the gang: ") + peloton_last_error());
    return 1;
  }
  const int rank = peloton_rank(), size = peloton_size(), local_size = peloton_local_size();
  std::string problem = exercise(rank, size);
  const char* local = peloton_local_transport();
  const char* cross = size > local_size ? "tcp" : "none";
  const std::string where = "rank=" + std::to_string(rank) + " size=" + std::to_string(size) +
                            " local_rank=" + std::to_string(peloton_local_rank()) +
                            " local_size=" + std::to_string(local_size) +
                            " cross_rank=" + std::to_string(peloton_cross_rank()) +
                            " cross_size=" + std::to_string(peloton_cross_size());
  if (peloton_shutdown() != 0 && problem.empty()) problem = std::string("shutdown: ") + peloton_last_error();
  // One write per line: the ranks of --local share this stdout.
  std::printf("gang %s local=%s cross=%s result=%s\n", where.c_str(), local ? local : "?", cross,
              problem.empty() ? "ok" : "failed");
  std::fflush(stdout);
  if (!problem.empty()) error("rank " + std::to_string(rank) + ": " + problem);
  return problem.empty() ? 0 : 1;
}

int print_env() {
  peloton_gang g;
  if (peloton_gang_from_env(&g) != 0) {
    error(peloton_last_error());
    return 1;
  }
  std::printf("env rank=%d size=%d local_rank=%d local_size=%d cross_rank=%d cross_size=%d timeout=%.17g "
              "fusion_threshold=%" PRId64 "\n",
              g.rank, g.size, g.local_rank, g.local_size, g.cross_rank, g.cross_size, g.timeout, g.fusion_threshold);
  return 0;
}

// `n` distinct loopback ports the kernel hands out (held together, then released for the ranks).
std::vector<int> kernel_ports(int n, std::string* problem) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n && problem->empty(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      *problem = errno_str("a free port on 127.0.0.1");
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (const int fd : fds) ::close(fd);
  return ports;
}

// A gang secret (64 hex digits) for the forked ranks: they connect with the handshake a
// scheduled gang's do. Empty, with `problem` set, when the kernel gives no random bytes.
std::string random_secret(std::string* problem) {
  unsigned char raw[32];
  if (::getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw)) {
    *problem = errno_str("getrandom");
    return "";
  }
  std::string secret;
  char byte[3];
  for (const unsigned char c : raw) {
    std::snprintf(byte, sizeof byte, "%02x", c);
    secret += byte;
  }
  return secret;
}

// N ranks of one host, forked; each runs gang_check from the environment a task would get.
int local_check(int n, double timeout) {
  std::string problem;
  const std::vector<int> ports = kernel_ports(n, &problem);
  const std::string secret = problem.empty() ? random_secret(&problem) : "";
  if (!problem.empty()) {
    error(problem);
    return 1;
  }
  const char* why = nullptr;
  // Without shared memory (no /dev/shm) each rank counts as its own host: TCP only.
  const bool shm = peloton_shm_available(&why) != 0;
  const int local_size = shm ? n : 1;
  std::string peers;
  for (const int p : ports) peers += (peers.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(p);
  std::printf("local: %d ranks on 127.0.0.1, peers %s\n", n, peers.c_str());
  std::fflush(stdout);  // before fork, or the children print it again

  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);  // exits are awaited with sigtimedwait
  std::map<pid_t, int> running;         // pid -> rank
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      error(errno_str("fork"));
      for (const auto& [p, rank] : running) ::kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      sigprocmask(SIG_SETMASK, &old, nullptr);
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", timeout);
      const std::map<std::string, std::string> env = {
          {"PELOTON_RANK", std::to_string(r)},
          {"PELOTON_GANG_SIZE", std::to_string(n)},
          {"PELOTON_PEERS", peers},
          {"PELOTON_LOCAL_RANK", std::to_string(r % local_size)},
          {"PELOTON_LOCAL_SIZE", std::to_string(local_size)},
          {"PELOTON_CROSS_RANK", std::to_string(r / local_size)},
          {"PELOTON_CROSS_SIZE", std::to_string(n / local_size)},
          {"PELOTON_COLLECTIVE_TIMEOUT", seconds},
          {"PELOTON_GANG_SECRET", secret},
      };
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::exit(gang_check());
    }
    running[pid] = r;
  }

  // The ranks fail by themselves within their timeout; a rank still running well after that is
  // stuck outside the runtime's watch, and is killed and reported.
  const double limit = 3 * timeout + 5;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit);
  std::vector<int> failed;
  while (!running.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int r = running[pid];
      running.erase(pid);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed.push_back(r);
      continue;
    }
    if (pid < 0 && errno != EINTR) break;  // no children left to wait for: reported below
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const timespec wait{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    ::sigtimedwait(&chld, nullptr, &wait);  // a child exited, or the time is up
  }
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (!running.empty()) {
    std::string ranks;
    for (const auto& [pid, r] : running) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    error("ranks [" + ranks + "] still running after " + std::to_string(static_cast<int>(limit)) +
          " s (3 x their timeout + 5 s): killed");
    return 1;
  }
  if (!failed.empty()) {
    std::string ranks;
    for (const int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    error("local: ranks [" + ranks + "] failed");
    return 1;
  }
  std::printf("local: ok, %d ranks, local traffic over %s\n", n, n == 1 ? "none" : shm ? "shm" : "tcp");
  return 0;
}

bool parse_positive(const char* text, double* out) {
  char* end = nullptr;
  *out = std::strtod(text, &end);
  return end != text && *end == '\0' && *out > 0 && *out < 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "--local";
  int ranks = 2;
  double timeout = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "-h" || arg == "--help") {
      std::fputs(kHelp, stdout);
      return 0;
    } else if (arg == "--gang" || arg == "--env") {
      mode = arg;
    } else if (arg == "--local" && has_value) {
      mode = arg;
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > 1024) {
        std::fprintf(stderr, "error: --local %s: give a number of ranks from 1 to 1024\n%s", argv[i], kHelp);
        return kUsage;
      }
      ranks = static_cast<int>(v);
    } else if (arg == "--timeout" && has_value) {
      if (!parse_positive(argv[++i], &timeout)) {
        std::fprintf(stderr, "error: --timeout %s: give a positive number of seconds\n%s", argv[i], kHelp);
        return kUsage;
      }
    } else {
      std::fprintf(stderr, "error: unexpected argument %s\n%s", arg.c_str(), kHelp);
      return kUsage;
    }
  }
  print_found();
  if (mode == "--env") return print_env();
  if (mode == "--gang") return gang_check();
  return local_check(ranks, timeout);
}
