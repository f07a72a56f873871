// Element-wise reductions over raw buffers of every supported dtype.
#pragma once

#include <cstddef>

#include "common.h"

namespace peloton {

// dst[i] = op(dst[i], src[i]) for i < count. AVERAGE reduces as SUM (the division comes last).
void reduce_into(void* dst, const void* src, size_t count, DType dtype, ROp op);

// buf[i] /= divisor (integers truncate toward zero, like C division).
void divide_by(void* buf, size_t count, DType dtype, int divisor);

}  // namespace peloton
