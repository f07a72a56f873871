#include "common.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace peloton {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::F16: case DType::BF16: return 2;
  }
  throw CollectiveError("unknown dtype");
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}

const char* op_name(ROp op) {
  switch (op) {
    case ROp::SUM: return "sum";
    case ROp::AVERAGE: return "average";
    case ROp::MIN: return "min";
    case ROp::MAX: return "max";
    case ROp::PRODUCT: return "product";
  }
  return "?";
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::ALLREDUCE: return "allreduce";
    case Kind::ALLGATHER: return "allgather";
    case Kind::BROADCAST: return "broadcast";
    case Kind::REDUCE_SCATTER: return "reduce_scatter";
    case Kind::BARRIER: return "barrier";
  }
  return "?";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) s << ",";
  s << ")";
  return s.str();
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  s << "]";
  return s.str();
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30));
}

std::string seconds_str(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace peloton
