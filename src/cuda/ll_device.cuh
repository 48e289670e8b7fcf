// Device helpers of the low-latency kernels: record addressing, bounded waits,
// error reporting, last-block detection.
#pragma once

#include "device.cuh"
#include "ll_common.h"

namespace ep {
namespace cuda {

enum LLWhat { kLLWhatFree = 20, kLLWhatDispatch = 21, kLLWhatCombine = 22, kLLWhatBadTopk = 23 };

__device__ __forceinline__ LLCtrl* llCtrl(const LLView& v, int r) { return reinterpret_cast<LLCtrl*>(v.bufs[r]); }

__device__ __forceinline__ char* llSet(const LLView& v, int r, int set) {
  return v.bufs[r] + 4096 + size_t(set) * v.set_bytes;
}

// Record of (source src, token t) in rank r's dispatch landing of set.
__device__ __forceinline__ char* llRecord(const LLView& v, int r, int set, int src, int t) {
  return llSet(v, r, set) + (size_t(src) * v.max_tokens + t) * v.rec_bytes;
}

// Row of (rank src, token t) in rank r's combine landing of set.
__device__ __forceinline__ float* llCombineRow(const LLView& v, int r, int set, int src, int t) {
  return reinterpret_cast<float*>(llSet(v, r, set) + v.comb_off + (size_t(src) * v.max_tokens + t) * v.crow_bytes);
}

__device__ __forceinline__ void llReport(const LLView& v, int code, int what, int peer, long long a, long long b) {
  if (code == 8) atomicExch(&v.local->timed_out, 1);
  if (atomicCAS(&v.local->err_claim, 0, 1) != 0) return;
  v.err->what = what;
  v.err->peer = peer;
  v.err->channel = blockIdx.x;
  v.err->a = a;
  v.err->b = b;
  __threadfence_system();
  v.err->code = code;
  __threadfence_system();
}

// Spins until the tag of *p equals tag (exact) or, with at_least, reaches it.
// Returns the low word, or -1 after the timeout (reported).
__device__ __forceinline__ long long llWait(const LLView& v, const uint64_t* p, uint32_t tag, bool at_least,
                                            int what, int peer) {
  unsigned long long deadline = 0;
  for (uint32_t spins = 0;; spins++) {
    uint64_t word = ldAcquireSys(p);
    uint32_t got = uint32_t(word >> 32);
    if (at_least ? int32_t(got - tag) >= 0 : got == tag) return (long long)uint32_t(word);
    if ((spins & 63) == 63) {
      unsigned long long now = globalTimer();
      if (deadline == 0) deadline = now + v.timeout_ns;
      else if (now > deadline) {
        llReport(v, 8 /* epTimeout */, what, peer, (long long)tag, (long long)got);
        return -1;
      }
      if (*reinterpret_cast<volatile int*>(&v.local->timed_out)) return -1;
    }
  }
}

// True in the last block of the grid to get here (counter `which` is reset).
__device__ __forceinline__ bool llLastBlock(const LLView& v, int which) {
  __threadfence_system();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
    last = atomicAdd(&v.local->blocks_done[which], 1u) == gridDim.x - 1;
    if (last) v.local->blocks_done[which] = 0;
  }
  __syncthreads();
  if (last) __threadfence_system();
  return last != 0;
}

}  // namespace cuda
}  // namespace ep
