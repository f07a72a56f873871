#include "reduce.h"

#include <algorithm>
#include <cstring>

namespace peloton {
namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (absx < 0x38800000u) {  // subnormal half or zero: round to nearest even at 2^-24
    float a;
    std::memcpy(&a, &absx, 4);
    const float scaled = a * 16777216.0f;  // 2^24
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  // normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even
  uint32_t h = ((absx >> 13) - ((127u - 15u) << 10));
  const uint32_t rest = absx & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

template <typename T>
void reduce_typed(T* __restrict d, const T* __restrict s, size_t n, ROp op) {
  switch (op) {
    case ROp::SUM: case ROp::AVERAGE:
      for (size_t i = 0; i < n; ++i) d[i] += s[i];
      break;
    case ROp::PRODUCT:
      for (size_t i = 0; i < n; ++i) d[i] *= s[i];
      break;
    case ROp::MIN:
      for (size_t i = 0; i < n; ++i) d[i] = std::min(d[i], s[i]);
      break;
    case ROp::MAX:
      for (size_t i = 0; i < n; ++i) d[i] = std::max(d[i], s[i]);
      break;
  }
}

// 16-bit floats: widen a block to float, reduce, narrow back.
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_16(uint16_t* d, const uint16_t* s, size_t n, ROp op) {
  constexpr size_t kBlock = 1024;
  float a[kBlock];
  float b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) {
      a[i] = Load(d[base + i]);
      b[i] = Load(s[base + i]);
    }
    reduce_typed(a, b, m, op);
    for (size_t i = 0; i < m; ++i) d[base + i] = Store(a[i]);
  }
}

template <typename T>
void divide_typed(T* d, size_t n, int k) {
  const T div = static_cast<T>(k);
  for (size_t i = 0; i < n; ++i) d[i] /= div;
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void divide_16(uint16_t* d, size_t n, int k) {
  const float div = static_cast<float>(k);
  for (size_t i = 0; i < n; ++i) d[i] = Store(Load(d[i]) / div);
}

}  // namespace

void reduce_into(void* dst, const void* src, size_t n, DType dtype, ROp op) {
  switch (dtype) {
    case DType::F32: return reduce_typed(static_cast<float*>(dst), static_cast<const float*>(src), n, op);
    case DType::F64: return reduce_typed(static_cast<double*>(dst), static_cast<const double*>(src), n, op);
    case DType::I32: return reduce_typed(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op);
    case DType::I64: return reduce_typed(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op);
    case DType::F16:
      return reduce_16<half_to_float, float_to_half>(static_cast<uint16_t*>(dst),
                                                     static_cast<const uint16_t*>(src), n, op);
    case DType::BF16:
      return reduce_16<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(dst),
                                                     static_cast<const uint16_t*>(src), n, op);
  }
}

void divide_by(void* buf, size_t n, DType dtype, int k) {
  switch (dtype) {
    case DType::F32: return divide_typed(static_cast<float*>(buf), n, k);
    case DType::F64: return divide_typed(static_cast<double*>(buf), n, k);
    case DType::I32: return divide_typed(static_cast<int32_t*>(buf), n, k);
    case DType::I64: return divide_typed(static_cast<int64_t*>(buf), n, k);
    case DType::F16: return divide_16<half_to_float, float_to_half>(static_cast<uint16_t*>(buf), n, k);
    case DType::BF16: return divide_16<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(buf), n, k);
  }
}

}  // namespace peloton
