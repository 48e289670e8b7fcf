// How the low-latency kernels split work between blocks: plain integer
// arithmetic, compiled for the device (ll_device.cuh) and for the host, where
// tests/unit/test_ll_share.cc checks it (every item in exactly one share).
#pragma once

#if defined(__CUDACC__)
#define EP_LL_SHARE_FN __host__ __device__ __forceinline__
#else
#define EP_LL_SHARE_FN inline
#endif

namespace ep {
namespace cuda {

// Share i of `parts` of n items: [lo, hi), contiguous and balanced (sizes
// differ by at most one; with n <= parts every share has 0 or 1 items).
EP_LL_SHARE_FN void llShare(int n, unsigned i, unsigned parts, int& lo, int& hi) {
  lo = int((long long)n * i / parts);
  hi = int((long long)n * (i + 1) / parts);
}

}  // namespace cuda
}  // namespace ep
