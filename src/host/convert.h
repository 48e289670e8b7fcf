// Conversions between float32 and the 16-bit floating types, round to
// nearest even, NaN kept quiet. The GPU kernels use the hardware
// conversions, which round the same way, so results match bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "moeep.h"

namespace ep {

inline float bf16ToFloat(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

inline float fp16ToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; e++; } while ((man & 0x400u) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToFp16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal
    uint32_t exp = abs >> 23;
    uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (113 - exp) ... puts the value in 10 bits
    uint32_t half_man = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_man & 1u))) half_man++;
    return uint16_t(sign | half_man);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

// Reads element i of a row of type t as float (t is BF16, FP16 or FP32).
inline float loadAsFloat(const void* row, epDataType_t t, size_t i) {
  switch (t) {
    case epBfloat16: return bf16ToFloat(static_cast<const uint16_t*>(row)[i]);
    case epFloat16: return fp16ToFloat(static_cast<const uint16_t*>(row)[i]);
    default: return static_cast<const float*>(row)[i];
  }
}

inline void storeFromFloat(void* row, epDataType_t t, size_t i, float v) {
  switch (t) {
    case epBfloat16: static_cast<uint16_t*>(row)[i] = floatToBf16(v); break;
    case epFloat16: static_cast<uint16_t*>(row)[i] = floatToFp16(v); break;
    default: static_cast<float*>(row)[i] = v; break;
  }
}

}  // namespace ep
