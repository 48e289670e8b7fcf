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

EP_LL_SHARE_FN int llMin(int a, int b) { return a < b ? a : b; }

// Share i of `parts` of n items: [lo, hi), contiguous and balanced (sizes
// differ by at most one; with n <= parts every share has 0 or 1 items).
EP_LL_SHARE_FN void llShare(int n, unsigned i, unsigned parts, int& lo, int& hi) {
  lo = int((long long)n * i / parts);
  hi = int((long long)n * (i + 1) / parts);
}

// The records a combine-sending block b of G takes (nrec records of `pieces`
// units each): a contiguous share [lo, hi) of the records, all units
// [0, pieces) of each. With fewer records than blocks, one slice
// [plo, plo + width) of one record's units instead: S slices per record, as
// many as the blocks allow but none smaller than one step (`step` units: a
// unit per thread of the block, kUnits times), so that a small call takes
// one step per block.
struct LLSliceShare {
  int lo, hi, plo, width;
};
EP_LL_SHARE_FN LLSliceShare llSliceShare(int nrec, int pieces, int b, int G, int step) {
  LLSliceShare r{0, 0, 0, pieces};
  const int S = (nrec == 0 || nrec >= G) ? 1 : llMin(G / nrec, (pieces + step - 1) / step);
  if (S <= 1) {
    llShare(nrec, unsigned(b), unsigned(G), r.lo, r.hi);
    return r;
  }
  int first, last;
  llShare(nrec * S, unsigned(b), unsigned(G), first, last);  // nrec * S <= G: one slice or none
  r.lo = first / S;
  r.hi = last > first ? r.lo + 1 : r.lo;
  const int chunk = (pieces + S - 1) / S, slice = first - r.lo * S;
  r.plo = llMin(slice * chunk, pieces);
  r.width = llMin(r.plo + chunk, pieces) - r.plo;
  if (r.width <= 0) r.hi = r.lo;
  return r;
}

}  // namespace cuda
}  // namespace ep
