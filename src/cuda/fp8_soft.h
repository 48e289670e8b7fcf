// float -> FP8-E4M3 (OCP: bias 7, max 448, 0x7f NaN), rounded to nearest
// even and saturating to +-448, in integer and float operations: the
// low-latency dispatch's quantisation on GPUs older than sm_89, which have no
// conversion instruction. CUDA's own emulation (cuda_fp8.hpp) serves every
// format and rounding mode and took the send half from 6.6 to 16.1 us at 128
// tokens (sm_80 code on an H200, docs/BENCHMARKS.md); this one has no branch.
//
// It must give what the sm_89+ instruction (cvt.rn.satfinite.e4m3x2.f32)
// gives, for every float: tests/gpu/fp8_soft_test.cu compares all 2^32 on a
// GPU that has the instruction; tests/unit/test_fp8_soft.cc compares all 2^32
// with the host backend's floatToE4M3 (src/host/fp8.h) on the CPU.
//
// Host and device: plain C++ for the unit test, device code in the kernels.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define EP_FP8_HD __host__ __device__ __forceinline__
#else
#define EP_FP8_HD inline
#endif

namespace ep {
namespace fp8soft {

EP_FP8_HD uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

EP_FP8_HD float bitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

// The E4M3 code of f (sign in bit 7).
EP_FP8_HD uint32_t toE4M3(float f) {
  const uint32_t bits = floatBits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7fffffffu;
  // Normal results (|f| >= 2^-6): keep 3 mantissa bits, rounding the 20 below
  // to nearest even; a carry into the exponent is the right result. The
  // exponent field then moves from bias 127 to bias 7: (127 - 7) << 3.
  const uint32_t rounded = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  uint32_t code = rounded - (120u << 3);
  // Subnormal results (|f| < 2^-6): multiples of 2^-9; 8 of them is the
  // smallest normal, whose code is 8 too. |f| * 512 is exact and below 8;
  // adding 2^23 rounds it to an integer (ties to even) in the low mantissa bits.
  const uint32_t sub = floatBits(bitsFloat(a) * 512.0f + 8388608.0f) - 0x4b000000u;
  code = a < 0x3c800000u ? sub : code;
  code = a >= 0x3c800000u && rounded > (120u << 3) + 0x7eu ? 0x7eu : code;  // past 448, infinity included
  // NaN: 0x7f whatever the sign, as the instruction gives it.
  return a > 0x7f800000u ? 0x7fu : sign | code;
}

// Four codes packed as the kernels store them (a in the low byte).
EP_FP8_HD uint32_t packE4M3x4(float a, float b, float c, float d) {
  return toE4M3(a) | toE4M3(b) << 8 | toE4M3(c) << 16 | toE4M3(d) << 24;
}

}  // namespace fp8soft
}  // namespace ep

#undef EP_FP8_HD
