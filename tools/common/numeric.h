// Number formats of the wire types, written independently of the library's
// own conversions (src/host/convert.h) so that the tools' checks do not share
// a bug with the code they check. Round to nearest even, as the library and
// the GPU's conversion instructions do.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "moeep.h"

namespace tools {

inline float bitsToFloat(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t floatToBits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float bf16ToFloat(uint16_t h) { return bitsToFloat(uint32_t(h) << 16); }

inline uint16_t floatToBf16(float f) {
  uint32_t bits = floatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);  // keep NaN a NaN
  // Add just under half an ulp of bf16, plus one when the kept part is odd: ties go to even.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

inline float fp16ToFloat(uint16_t h) {
  const float sign = (h & 0x8000u) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(float(man), -24);  // zero and subnormals
  if (exp == 31) return man ? NAN : sign * INFINITY;
  return sign * std::ldexp(float(man | 0x400), exp - 25);
}

// FP8 E4M3 "fn" (as in CUDA's __nv_fp8_e4m3): bias 7, no infinities, S.1111.111 is NaN.
inline float fp8e4m3ToFloat(uint8_t b) {
  const float sign = (b & 0x80u) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  if (exp == 0xf && man == 0x7) return NAN;
  if (exp == 0) return sign * std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  return sign * std::ldexp(float(man | 0x8), exp - 10);    // (1 + man/8) * 2^(exp-7)
}

// Float to FP8 E4M3 "fn": round to nearest even, saturated to +-448 (the
// low-latency dispatch's quantisation, SEMANTICS.md). Finite inputs.
inline uint8_t floatToFp8e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80u : 0u;
  const float a = std::fabs(f);
  if (!(a < 448.0f)) return uint8_t(sign | 0x7eu);  // 448 and above (NaN too): the largest finite
  int exp = 0;
  std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1): its leading bit is 2^(exp - 1)
  // The spacing of E4M3 values near a: 2^(e - 3) for a normal value with
  // leading bit 2^e (e >= -6), 2^-9 for subnormals.
  const int quantum_exp = std::max(exp - 1, -6) - 3;
  // Exact division by a power of two, then round half to even (the default mode).
  const float q = std::nearbyint(std::ldexp(a, -quantum_exp));
  const float v = std::ldexp(q, quantum_exp);  // the rounded value: may have moved up a binade
  if (v >= 448.0f) return uint8_t(sign | 0x7eu);
  if (v < std::ldexp(1.0f, -6)) return uint8_t(sign | uint8_t(q));  // subnormal: man = v / 2^-9
  int vexp = 0;
  const float m = std::frexp(v, &vexp);       // v = m * 2^vexp = (2m) * 2^(vexp - 1)
  const int man = int(std::ldexp(m, 4)) - 8;  // (2m - 1) * 8
  return uint8_t(sign | uint8_t((vexp - 1 + 7) << 3) | uint8_t(man));
}

inline size_t elementBytes(epDataType_t t) {
  switch (t) {
    case epFloat8E4M3:
      return 1;
    case epBfloat16:
    case epFloat16:
      return 2;
    case epFloat32:
    case epInt32:
      return 4;
    case epInt64:
      return 8;
  }
  return 0;
}

inline const char* typeName(epDataType_t t) {
  switch (t) {
    case epBfloat16:
      return "bf16";
    case epFloat16:
      return "fp16";
    case epFloat32:
      return "fp32";
    case epFloat8E4M3:
      return "fp8";
    case epInt32:
      return "int32";
    case epInt64:
      return "int64";
  }
  return "unknown";
}

// Raw bits of element i of a row of type t (1, 2 or 4 bytes), widened.
inline uint32_t loadBits(const void* row, epDataType_t t, size_t i) {
  switch (elementBytes(t)) {
    case 1:
      return static_cast<const uint8_t*>(row)[i];
    case 2:
      return static_cast<const uint16_t*>(row)[i];
    default:
      return static_cast<const uint32_t*>(row)[i];
  }
}

inline void storeBits(void* row, epDataType_t t, size_t i, uint32_t bits) {
  switch (elementBytes(t)) {
    case 1:
      static_cast<uint8_t*>(row)[i] = uint8_t(bits);
      break;
    case 2:
      static_cast<uint16_t*>(row)[i] = uint16_t(bits);
      break;
    default:
      static_cast<uint32_t*>(row)[i] = bits;
      break;
  }
}

// The value an element's bits stand for (FP8 without its block scale).
inline float bitsToValue(uint32_t bits, epDataType_t t) {
  switch (t) {
    case epBfloat16:
      return bf16ToFloat(uint16_t(bits));
    case epFloat16:
      return fp16ToFloat(uint16_t(bits));
    case epFloat8E4M3:
      return fp8e4m3ToFloat(uint8_t(bits));
    default:
      return bitsToFloat(bits);
  }
}

}  // namespace tools
