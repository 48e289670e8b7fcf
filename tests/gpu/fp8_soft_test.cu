// The low-latency dispatch's FP8 conversion for GPUs before sm_89
// (src/cuda/fp8_soft.h) against the conversion instruction of this GPU
// (cvt.rn.satfinite.e4m3x2.f32, through cuda_fp8.h built for sm_89 or later),
// for all 2^32 floats, two at a time as the kernels convert them (the first
// of a pair in the low byte). Every input must give the same code (NaN:
// 0x7f, without the sign, from the instruction as from the host reference).
// Build: nvcc -O2 -arch=sm_90 -Isrc tests/gpu/fp8_soft_test.cu
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cuda/fp8_soft.h"

namespace {

struct Result {
  unsigned long long bad;       // non-NaN inputs with different codes
  unsigned long long nan_bad;   // NaN inputs where either code is not a NaN
  unsigned long long nan_sign;  // NaN inputs where both are NaN but the sign bit differs
  unsigned int first[8];        // the first few differing inputs
  unsigned int first_hw[8], first_soft[8];
  unsigned int nfirst;
};

__device__ void note(Result* r, uint32_t u, uint32_t hw, uint32_t soft) {
  const unsigned int i = atomicAdd(&r->nfirst, 1u);
  if (i < 8) {
    r->first[i] = u;
    r->first_hw[i] = hw;
    r->first_soft[i] = soft;
  }
}

__device__ void compare(Result* r, uint32_t u, uint32_t hw, uint32_t soft) {
  const float f = __uint_as_float(u);
  if (f != f) {
    if ((hw & 0x7fu) != 0x7fu || (soft & 0x7fu) != 0x7fu) {
      atomicAdd(&r->nan_bad, 1ull);
      note(r, u, hw, soft);
    } else if (hw != soft) {
      atomicAdd(&r->nan_sign, 1ull);
    }
  } else if (hw != soft) {
    atomicAdd(&r->bad, 1ull);
    note(r, u, hw, soft);
  }
}

// Pairs (2k, 2k + 1) of bit patterns base + ..., one pair per thread and step.
__global__ void compareAll(uint64_t base, uint64_t pairs, Result* r) {
  for (uint64_t k = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; k < pairs; k += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t u0 = uint32_t(base + 2 * k), u1 = u0 + 1;
    const float f0 = __uint_as_float(u0), f1 = __uint_as_float(u1);
    const uint32_t hw2 = __nv_cvt_float2_to_fp8x2(make_float2(f0, f1), __NV_SATFINITE, __NV_E4M3);
    const uint32_t soft2 = ep::fp8soft::toE4M3(f0) | ep::fp8soft::toE4M3(f1) << 8;
    if (hw2 == soft2) continue;
    compare(r, u0, hw2 & 0xffu, soft2 & 0xffu);
    compare(r, u1, hw2 >> 8, soft2 >> 8);
  }
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIPPED fp8_soft_test: no GPU visible\n");
    return 0;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  if (prop.major * 10 + prop.minor < 89) {
    printf("SKIPPED fp8_soft_test: GPU 0 is sm_%d%d, without the FP8 conversion instruction to compare with\n",
           prop.major, prop.minor);
    return 0;
  }
  Result* r = nullptr;
  if (cudaMallocManaged(&r, sizeof(Result)) != cudaSuccess) {
    printf("FAIL fp8_soft_test: cudaMallocManaged\n");
    return 1;
  }
  *r = Result{};
  const uint64_t total_pairs = (1ull << 32) / 2, chunk = 1ull << 28;
  for (uint64_t p0 = 0; p0 < total_pairs; p0 += chunk) compareAll<<<1024, 256>>>(2 * p0, chunk, r);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    printf("FAIL fp8_soft_test: %s\n", cudaGetErrorString(e));
    return 1;
  }
  for (unsigned int i = 0; i < r->nfirst && i < 8; i++) {
    float f;
    memcpy(&f, &r->first[i], 4);
    printf("  0x%08x (%g): instruction 0x%02x, soft 0x%02x\n", r->first[i], double(f), r->first_hw[i],
           r->first_soft[i]);
  }
  printf("fp8_soft_test: all 2^32 floats on %s: %llu non-NaN mismatches, %llu NaN inputs not NaN in both, "
         "%llu NaN codes with another sign\n",
         prop.name, r->bad, r->nan_bad, r->nan_sign);
  const bool ok = r->bad == 0 && r->nan_bad == 0 && r->nan_sign == 0;
  printf("fp8_soft_test: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
