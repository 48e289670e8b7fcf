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
// lo = n * i / parts, exactly, in 32-bit unsigned divisions (a 64-bit one is
// a long instruction sequence on GPUs, run by every block at its start):
// with n = q * parts + r, n * i / parts = q * i + r * i / parts, and r * i <
// parts^2 fits in 32 bits for parts <= 65536 (i < parts).
EP_LL_SHARE_FN void llShare(int n, unsigned i, unsigned parts, int& lo, int& hi) {
  const unsigned q = unsigned(n) / parts, r = unsigned(n) - q * parts;
  lo = int(q * i + r * i / parts);
  hi = int(q * (i + 1) + r * (i + 1) / parts);
}

// How llSliceShare cuts: S slices per item (1: whole items), each `chunk`
// units wide (the last one narrower), of which `filled` are not empty (the
// blocks that take a part of each item). llSliceShare repeats the first two
// lines rather than calling this: calling it changed the SASS of the send
// and combine kernels that use llSliceShare (which were measured as they
// are); tests/unit/test_ll_share.cc checks that the two agree.
struct LLSlices {
  int S, chunk, filled;
};
// The divisions are unsigned (every operand is at least 0; a signed one
// costs more instructions).
EP_LL_SHARE_FN unsigned llDivUp(unsigned a, unsigned b) { return (a + b - 1) / b; }
EP_LL_SHARE_FN LLSlices llSlicesOf(int n, int pieces, int G, int step, int align) {
  const int S = (n == 0 || n >= G) ? 1 : llMin(int(unsigned(G) / unsigned(n)), int(llDivUp(pieces, step)));
  if (S <= 1) return LLSlices{1, pieces, 1};
  const int chunk = int(llDivUp(llDivUp(pieces, S), align) * unsigned(align));
  return LLSlices{S, chunk, int(llDivUp(pieces, chunk))};
}

// The items a block b of G takes when each of n items has `pieces` units (a
// dispatch-sending row block: tokens of 16-byte pieces; a combine-sending
// block: records of its units): a contiguous share [lo, hi) of the items,
// all units [0, pieces) of each. With fewer items than blocks, one slice
// [plo, plo + width) of one item's units instead: S slices per item, as many
// as the blocks allow but none smaller than one step (`step` units, e.g. one
// per thread), each a multiple of `align` units (16 for FP8 rows: whole scale
// blocks), so that a small call's items are handled by several blocks at
// once.
struct LLSliceShare {
  int lo, hi, plo, width;
};
EP_LL_SHARE_FN LLSliceShare llSliceShare(int n, int pieces, int b, int G, int step, int align) {
  LLSliceShare r{0, 0, 0, pieces};
  const int S = (n == 0 || n >= G) ? 1 : llMin(int(unsigned(G) / unsigned(n)), int(llDivUp(pieces, step)));
  if (S <= 1) {
    llShare(n, unsigned(b), unsigned(G), r.lo, r.hi);
    return r;
  }
  int first, last;
  llShare(n * S, unsigned(b), unsigned(G), first, last);  // n * S <= G: one slice or none
  r.lo = int(unsigned(first) / unsigned(S));
  r.hi = last > first ? r.lo + 1 : r.lo;
  const int chunk = int(llDivUp(llDivUp(pieces, S), align) * unsigned(align)), slice = first - r.lo * S;
  r.plo = llMin(slice * chunk, pieces);
  r.width = llMin(r.plo + chunk, pieces) - r.plo;
  if (r.width <= 0) r.hi = r.lo;  // a last slice past the item's end (large items): nothing (slice 0 never is)
  return r;
}

}  // namespace cuda
}  // namespace ep
