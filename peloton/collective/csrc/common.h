// Shared enums, errors and helpers of the peloton collective runtime.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace peloton {

// The numeric values are part of the Python binding (peloton/collective/__init__.py).
enum class DType : uint8_t { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I32 = 4, I64 = 5 };
enum class ROp : uint8_t { SUM = 0, AVERAGE = 1, MIN = 2, MAX = 3, PRODUCT = 4 };
enum class Kind : uint8_t { ALLREDUCE = 0, ALLGATHER = 1, BROADCAST = 2, REDUCE_SCATTER = 3, BARRIER = 4 };

size_t dtype_size(DType d);
const char* dtype_name(DType d);
const char* op_name(ROp op);
const char* kind_name(Kind k);

// Raised to Python as peloton.collective.CollectiveError.
struct CollectiveError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure of the connection to one peer (closed, reset, silent past the timeout).
struct PeerError : std::runtime_error {
  int peer;
  PeerError(int p, const std::string& what) : std::runtime_error(what), peer(p) {}
};

using Clock = std::chrono::steady_clock;

std::string shape_str(const std::vector<int64_t>& shape);
std::string ranks_str(const std::vector<int>& ranks);
// Milliseconds until `deadline` for poll(2): 0 once it has passed, rounded up, capped.
int ms_left(Clock::time_point deadline);
// "2.5 s": a duration as the runtime's messages write it.
std::string seconds_str(std::chrono::milliseconds ms);

}  // namespace peloton
