// Size arithmetic shared by the host code and the CUDA kernels: rounding up
// to a multiple, and how many FP8 scales a row carries. One definition, so
// that a buffer laid out on the host and read by a kernel (or by the host
// backend, the reference) agree.
#pragma once

#include <cstddef>

#ifdef __CUDACC__
#define EP_SIZES_FN __host__ __device__ __forceinline__ constexpr
#else
#define EP_SIZES_FN inline constexpr
#endif

namespace ep {

// An FP8 row carries one float32 scale per block of this many elements; the
// last block of a row whose length is not a multiple is shorter.
constexpr int kFp8BlockElems = 128;

// The FP8 scales of a row of `hidden` elements.
EP_SIZES_FN int fp8ScaleBlocks(int hidden) { return (hidden + kFp8BlockElems - 1) / kFp8BlockElems; }

// v rounded up to a multiple of a (a > 0).
EP_SIZES_FN size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace ep
