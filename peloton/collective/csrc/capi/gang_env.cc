#include "gang_env.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace peloton {
namespace {

constexpr const char* kRank = "PELOTON_RANK";
constexpr const char* kGangSize = "PELOTON_GANG_SIZE";
constexpr const char* kPeers = "PELOTON_PEERS";
constexpr const char* kLocalRank = "PELOTON_LOCAL_RANK";
constexpr const char* kLocalSize = "PELOTON_LOCAL_SIZE";
constexpr const char* kCrossRank = "PELOTON_CROSS_RANK";
constexpr const char* kCrossSize = "PELOTON_CROSS_SIZE";
constexpr const char* kTimeout = "PELOTON_COLLECTIVE_TIMEOUT";
constexpr const char* kFusion = "PELOTON_FUSION_THRESHOLD";
constexpr const char* kSecret = "PELOTON_GANG_SECRET";
// gangenv.DEFAULT_TIMEOUT and DEFAULT_FUSION_THRESHOLD (the contract test compares them).
constexpr double kDefaultTimeout = 30.0;
constexpr int64_t kDefaultFusion = int64_t{64} << 20;

// Python's str.strip() removes these (of ASCII); int() and float() only the first six.
constexpr const char* kStripSpace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
constexpr const char* kNumberSpace = " \t\n\r\v\f";

std::string strip(const std::string& s, const char* space) {
  const size_t b = s.find_first_not_of(space);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

// The variable's value; unset and empty are both "not set" to gangenv (os.environ.get / `not raw`).
const char* raw_env(const char* var) {
  const char* v = std::getenv(var);
  return v && *v ? v : nullptr;
}

// repr() of a Python str holding `s` (the messages quote raw values with it). Exact for ASCII;
// other bytes are copied, as repr keeps printable non-ASCII characters.
std::string py_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == q || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out + q;
}

// Python's digitpart, digit (["_"] digit)*, from s[i]: appends the digits, returns the end, or
// npos when there is no digit at i.
size_t digit_part(const std::string& s, size_t i, std::string* digits) {
  if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return std::string::npos;
  while (i < s.size()) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      digits->push_back(s[i++]);
    } else if (s[i] == '_' && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      ++i;
    } else {
      break;
    }
  }
  return i;
}

// int(raw) of Python, for values that fit a C int; false where it raises ValueError.
bool parse_int(const std::string& raw, int* out) {
  const std::string t = strip(raw, kNumberSpace);
  size_t i = 0;
  const bool negative = i < t.size() && t[i] == '-';
  if (i < t.size() && (t[i] == '-' || t[i] == '+')) ++i;
  std::string digits;
  if (digit_part(t, i, &digits) != t.size()) return false;
  const size_t first = digits.find_first_not_of('0');
  if (first != std::string::npos && digits.size() - first > 10) return false;
  const long long v = first == std::string::npos ? 0 : std::stoll(digits.substr(first));
  const long long signed_v = negative ? -v : v;
  if (signed_v < INT_MIN || signed_v > INT_MAX) return false;
  *out = static_cast<int>(signed_v);
  return true;
}

// float(raw) of Python; false where it raises ValueError.
bool parse_float(const std::string& raw, double* out) {
  const std::string t = strip(raw, kNumberSpace);
  size_t i = 0;
  std::string clean;
  if (i < t.size() && (t[i] == '-' || t[i] == '+')) clean += t[i++];
  std::string word = t.substr(i);
  for (char& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (word == "inf" || word == "infinity" || word == "nan") {
    *out = std::strtod((clean + word).c_str(), nullptr);
    return true;
  }
  size_t end = digit_part(t, i, &clean);
  const bool whole = end != std::string::npos;
  if (!whole) end = i;
  bool fraction = false;
  if (end < t.size() && t[end] == '.') {
    clean += '.';
    const size_t after = digit_part(t, end + 1, &clean);
    fraction = after != std::string::npos;
    end = fraction ? after : end + 1;
  }
  if (!whole && !fraction) return false;
  if (end < t.size() && (t[end] == 'e' || t[end] == 'E')) {
    clean += 'e';
    ++end;
    if (end < t.size() && (t[end] == '-' || t[end] == '+')) clean += t[end++];
    end = digit_part(t, end, &clean);
    if (end == std::string::npos) return false;
  }
  if (end != t.size()) return false;
  // strtod reads hex and locale forms too; `clean` holds only the decimal form checked above.
  *out = std::strtod(clean.c_str(), nullptr);
  return true;
}

// gangenv._int: `given` is never passed from C, so the variable or the default.
int env_int(const char* var, const int* fallback) {
  const char* raw = std::getenv(var);
  if (raw == nullptr || strip(raw, kStripSpace).empty()) {
    if (fallback == nullptr) throw GangEnvError(std::string(var) + " is not set (pass it to init() or set the variable)");
    return *fallback;
  }
  int v = 0;
  if (!parse_int(raw, &v)) throw GangEnvError(std::string(var) + "=" + py_repr(raw) + " is not an integer");
  return v;
}

// gangenv._positive.
double env_positive(const char* var, double fallback) {
  const char* raw = std::getenv(var);
  if (raw == nullptr || strip(raw, kStripSpace).empty()) return fallback;
  double v = 0;
  if (!parse_float(raw, &v)) throw GangEnvError(std::string(var) + "=" + py_repr(raw) + " is not a number");
  if (!(v > 0)) throw GangEnvError(std::string(var) + "=" + py_repr(raw) + " must be positive");
  // Python lets inf through to fail later (or hang); the runtime turns seconds into integers.
  if (!std::isfinite(v) || v >= 9.2e18) throw GangEnvError(std::string(var) + "=" + py_repr(raw) + " is out of range");
  return v;
}

// gangenv.split_peer: host (brackets stripped) and port of PELOTON_PEERS entry `index`.
void split_peer(size_t index, const std::string& entry, std::string* host, int* port) {
  const size_t colon = entry.rfind(':');
  const std::string h = colon == std::string::npos ? "" : entry.substr(0, colon);
  const std::string p = colon == std::string::npos ? "" : entry.substr(colon + 1);
  const bool digits = !p.empty() && p.find_first_not_of("0123456789") == std::string::npos;
  const size_t first = p.find_first_not_of('0');
  const bool in_range = digits && first != std::string::npos && p.size() - first <= 5 &&
                        std::stoi(p.substr(first)) < 65536;
  if (colon == std::string::npos || h.empty() || !in_range) {
    throw GangEnvError(std::string(kPeers) + " entry " + std::to_string(index) + " " + py_repr(entry) +
                       " is not host:port (port 1-65535)");
  }
  const size_t b = h.find_first_not_of("[]");
  *host = b == std::string::npos ? "" : h.substr(b, h.find_last_not_of("[]") - b + 1);
  *port = std::stoi(p.substr(first));
}

// gangenv._peers, from the variable.
void env_peers(int size, GangEnv* g) {
  const char* raw = raw_env(kPeers);
  if (raw == nullptr) throw GangEnvError(std::string(kPeers) + " is not set (pass peers= to init() or set it)");
  std::vector<std::string> entries;
  const std::string all(raw);
  for (size_t start = 0;;) {
    const size_t comma = all.find(',', start);
    entries.push_back(strip(all.substr(start, comma == std::string::npos ? std::string::npos : comma - start),
                            kStripSpace));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (entries.size() != static_cast<size_t>(size)) {
    throw GangEnvError(std::string(kPeers) + " lists " + std::to_string(entries.size()) +
                       " addresses for a gang of " + std::to_string(size));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string host;
    int port = 0;
    split_peer(i, entries[i], &host, &port);
    g->hosts.push_back(host);
    g->ports.push_back(port);
  }
}

}  // namespace

// GangEnv.from_env, check by check in its order (the first failing check names the variable).
GangEnv gang_env_from_environ() {
  GangEnv g;
  g.size = env_int(kGangSize, nullptr);
  g.rank = env_int(kRank, nullptr);
  if (g.size < 1) throw GangEnvError(std::string(kGangSize) + "=" + std::to_string(g.size) + " must be at least 1");
  if (g.rank < 0 || g.rank >= g.size) {
    throw GangEnvError(std::string(kRank) + "=" + std::to_string(g.rank) + " is outside a gang of " +
                       std::to_string(g.size));
  }
  env_peers(g.size, &g);
  const int zero = 0, one = 1;
  g.local_rank = env_int(kLocalRank, &zero);
  g.local_size = env_int(kLocalSize, &one);
  if (g.local_rank < 0 || g.local_rank >= g.local_size) {
    throw GangEnvError(std::string(kLocalRank) + "=" + std::to_string(g.local_rank) + " is outside " + kLocalSize +
                       "=" + std::to_string(g.local_size));
  }
  const int cross_rank = g.rank / g.local_size;
  const int cross_size = std::max(1, g.size / g.local_size);
  g.cross_rank = env_int(kCrossRank, &cross_rank);
  g.cross_size = env_int(kCrossSize, &cross_size);
  g.timeout = env_positive(kTimeout, kDefaultTimeout);
  g.fusion_threshold = static_cast<int64_t>(env_positive(kFusion, static_cast<double>(kDefaultFusion)));
  if (const char* secret = raw_env(kSecret)) g.secret = secret;
  return g;
}

}  // namespace peloton
