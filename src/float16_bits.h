// Conversions between float32 and the 16-bit floating types (BF16, FP16) on
// their bit patterns: round to nearest even, NaN kept quiet. One definition
// for the host backend (g++) and the CUDA kernels (nvcc), so both round every
// value the same way. A 16-bit value travels in the low half of a uint32_t
// (the high half must be zero on input and is zero on output).
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define EP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EP_HOST_DEVICE inline
#endif

namespace ep {

EP_HOST_DEVICE float floatFromBits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

EP_HOST_DEVICE uint32_t bitsOfFloat(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return bits;
}

EP_HOST_DEVICE float bf16ToFloat(uint32_t h) { return floatFromBits(h << 16); }

EP_HOST_DEVICE uint32_t floatToBf16(float f) {
  const uint32_t bits = bitsOfFloat(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return ((bits >> 16) | 0x40u) & 0xffffu;  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return ((bits + rounding) >> 16) & 0xffffu;
}

EP_HOST_DEVICE float fp16ToFloat(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        man <<= 1;
        e++;
      } while ((man & 0x400u) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return floatFromBits(bits);
}

EP_HOST_DEVICE uint32_t floatToFp16(float f) {
  const uint32_t bits = bitsOfFloat(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf
  if (abs < 0x38800000u) {                        // subnormal or zero in half
    if (abs < 0x33000000u) return sign;           // below half of the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // puts the value in 10 bits
    uint32_t half_man = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_man & 1u))) half_man++;
    return sign | half_man;
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return (sign | ((rounded - 0x38000000u) >> 13)) & 0xffffu;
}

}  // namespace ep
