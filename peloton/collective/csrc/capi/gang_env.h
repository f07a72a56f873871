// The gang environment contract read in C++: the PELOTON_* variables every task of a gang starts
// with, parsed as peloton/core/gangenv.py's GangEnv.from_env parses them (the same variables,
// defaults, checks in the same order and the same error messages), so a worker that links the C
// ABI boots from exactly what a Python worker boots from. tests/test_runtime_bundle.py holds the
// two to one contract over generated environments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace peloton {

// A missing or malformed variable; the message names it (gangenv.GangEnvError's message).
struct GangEnvError : CollectiveError {
  using CollectiveError::CollectiveError;
};

struct GangEnv {
  int rank = 0;
  int size = 1;
  std::vector<std::string> hosts;  // PELOTON_PEERS split: IPv6 without brackets
  std::vector<int> ports;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  double timeout = 0;
  int64_t fusion_threshold = 0;
  // PELOTON_GANG_SECRET (empty: not set): every connection of the gang proves it.
  std::string secret;
};

// From the process environment (getenv). Integers beyond a C int and infinite numbers, which
// Python's unbounded ints and floats would let through to fail later, are rejected here.
GangEnv gang_env_from_environ();

}  // namespace peloton
