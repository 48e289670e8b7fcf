// FP8-E4M3 (OCP: bias 7, max 448, 0x7f NaN) and the per-128-element
// quantisation of the low-latency dispatch. The GPU kernels do the same float
// operations in the same order (amax, scale = amax / 448, inverse = 1 / scale,
// q = e4m3(x * inverse) rounded to nearest even, saturating), so host and GPU
// results match bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ep {

constexpr float kE4M3Max = 448.0f;
constexpr float kFp8MinAmax = 1e-4f;  // keeps a block of zeros from dividing by zero

inline uint8_t floatToE4M3(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;             // NaN
  if (abs >= 0x43e00000u) return uint8_t(sign | 0x7e);  // >= 448: saturate
  int exp = int(abs >> 23) - 127;
  uint32_t mant = abs & 0x7fffffu;
  if (exp < -6) {  // subnormal in E4M3: value / 2^-9, rounded to nearest even
    if (exp < -11) return sign;  // below a quarter of the smallest subnormal
    uint32_t full = mant | 0x800000u;            // 1.mant * 2^exp
    int shift = 23 - (exp + 9);                  // to units of 2^-9
    uint32_t q = full >> shift;
    uint32_t rem = full & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return uint8_t(sign | q);  // q == 8 is the smallest normal, encoded the same way
  }
  uint32_t keep = mant >> 20, rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (keep & 1u))) keep++;
  if (keep == 8) {
    keep = 0;
    exp++;
  }
  uint32_t code = uint32_t(exp + 7) << 3 | keep;
  if (code > 0x7e) code = 0x7e;
  return uint8_t(sign | code);
}

inline float e4m3ToFloat(uint8_t v) {
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int exp = (v >> 3) & 0xf, mant = v & 7;
  if (exp == 15 && mant == 7) return NAN;
  if (exp == 0) return sign * std::ldexp(float(mant), -9);
  return sign * std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
}

// Rounds a positive scale up to a power of two (exact, by its bits).
inline float roundScalePow2(float s) {
  uint32_t bits;
  memcpy(&bits, &s, 4);
  if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
  memcpy(&s, &bits, 4);
  return s;
}

// Scale of one block of 128 (or fewer) values whose largest magnitude is amax.
inline float fp8BlockScale(float amax, bool pow2) {
  float scale = std::fmax(amax, kFp8MinAmax) / kE4M3Max;
  return pow2 ? roundScalePow2(scale) : scale;
}

}  // namespace ep
