// Device helpers of the CUDA backend: PTX loads/stores with the right memory
// semantics, bounded spin waits, error reporting. The BF16 / FP16 conversions
// are src/float16_bits.h, shared with the host backend.
#pragma once

#include <cstdint>

#include "../float16_bits.h"
#include "cuda_common.h"

namespace ep {
namespace cuda {

__device__ __forceinline__ uint64_t ldAcquireSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void stReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stRelaxedSys32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ldRelaxedSys32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Read-only input (the caller's x / y): non-coherent path, no L1 allocation.
__device__ __forceinline__ int4 ldNc(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// Staging written by peers during this kernel: coherent load, no L1 allocation.
__device__ __forceinline__ int4 ldStaged(const int4* p) {
  int4 v;
  asm volatile("ld.relaxed.gpu.global.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void stNa(int4* p, int4 v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ unsigned long long globalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void namedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t tagOf(uint64_t v) { return uint32_t(v >> 32); }
__device__ __forceinline__ uint32_t valOf(uint64_t v) { return uint32_t(v); }
__device__ __forceinline__ uint64_t tagged(uint32_t epoch, uint32_t v) {
  return (uint64_t(epoch) << 32) | v;
}
// True once tag has reached epoch (wrap-safe).
__device__ __forceinline__ bool reached(uint32_t tag, uint32_t epoch) { return int32_t(tag - epoch) >= 0; }

// The first error of this rank into the host-visible slot `err`, claimed
// through `claim` (a kernel family's err_claim; see recordError).
__device__ __forceinline__ void claimError(int* claim, ErrorInfo* err, int code, int what, int peer, long long a,
                                           long long b) {
  if (atomicCAS(claim, 0, 1) != 0) return;
  err->what = what;
  err->peer = peer;
  err->channel = blockIdx.x;
  err->a = a;
  err->b = b;
  __threadfence_system();
  err->code = code;
  __threadfence_system();
}

// Records the first argument error of this rank in the host-visible slot
// err[kArgSlot] (`local`: the rank-private words of a kernel family, DevLocal
// or LLLocal). The host reports it once and clears it; the communicator goes on.
template <typename Local>
__device__ __forceinline__ void recordError(Local* local, ErrorInfo* err, int code, int what, int peer, long long a,
                                            long long b) {
  claimError(&local->err_claim, err + kArgSlot, code, what, peer, a, b);
}

// A wait that failed (epTimeout, epRemoteError, ranks out of step): every
// other wait of the family leaves (timed_out), and the first such report
// takes err[kFailSlot]. Argument errors never hold that slot, so a failure
// is never lost behind one (which would leave the family's later waits
// leaving at once with nothing reported).
template <typename Local>
__device__ __forceinline__ void recordFailedWait(Local* local, ErrorInfo* err, int code, int what, int peer,
                                                 long long a, long long b) {
  atomicExch(&local->timed_out, 1);
  claimError(&local->fail_claim, err + kFailSlot, code, what, peer, a, b);
}

// Nodes holding a rank of `ranks` (bit r: rank r); node_ranks[q]: the ranks
// of node q (0 past the last node).
__device__ __forceinline__ int nodesOfRanks(unsigned ranks, const unsigned (&node_ranks)[kMaxRanks]) {
  int n = 0;
#pragma unroll
  for (int q = 0; q < kMaxRanks; q++) n += (ranks & node_ranks[q]) != 0u;
  return n;
}

__device__ __forceinline__ void reportError(const CommView& cv, int code, int what, int peer,
                                            long long a, long long b) {
  recordError(cv.local, cv.err, code, what, peer, a, b);
}
__device__ __forceinline__ void reportFailedWait(const CommView& cv, int code, int what, int peer, long long a,
                                                 long long b) {
  recordFailedWait(cv.local, cv.err, code, what, peer, a, b);
}

// True once the host's watcher saw rank `peer`'s process exit.
__device__ __forceinline__ bool peerGone(const uint8_t* gone, int peer) {
  return peer >= 0 && peer < kMaxRanks && reinterpret_cast<const volatile uint8_t*>(gone)[peer] != 0;
}

// A high-throughput wait that lasted this long looks for its peer in another
// call (peerOutOfStep); one that sees it there waits this much longer for the
// word before it reports, so that nothing still in flight is taken for a
// missing call.
constexpr unsigned long long kFamilyProbeNs = 2000000;
constexpr unsigned long long kFamilyConfirmNs = 1000000;

// A high-throughput wait (every earlier call of this rank's stream done):
// true when rank r has made low-latency sends that this rank has not. Every
// block of every low-latency send adds 1 to a counter in every rank, the
// sender included: rank r's dispatch sends, combine sends or combine
// receives counted here are past this rank's own.
__device__ __forceinline__ bool llAhead(const FamilyWatch& w, int r) {
  const volatile uint64_t* c = w.ll_counters;
  for (int kind = 0; kind < 3; kind++, c += 2 * kMaxRanks)  // [kind][set][rank]: the two sets summed
    if (c[r] + c[kMaxRanks + r] > c[w.rank] + c[kMaxRanks + w.rank]) return true;
  return false;
}

namespace {  // not inlined (the slow path of the waits): each kernel file has its own copy
// The collective kernel whose waits report `what` (0: a wait every kind has).
__device__ __forceinline__ uint32_t htKernelOfWait(int what) {
  return what == kWhatCounts ? kHtRouting
         : what == kWhatDispatchInfo || what == kWhatDispatchData ? kHtDispatch
         : what == kWhatCombineData ? kHtCombine : 0;
}

// A high-throughput wait `what` of collective kernel `epoch` for rank `peer`:
// 0 when nothing says the peer is in another call; kOutOfStepLowLatency when
// it made low-latency sends this rank has not (llAhead); the kind of its
// kernel << 8 | this rank's when it wrote, in this rank's Ctrl, a word of
// this epoch that only another kernel writes: its counts (routing), its
// channel 0 info (every dispatch block writes its own to every peer first)
// or combine progress (with rows for this rank).
__device__ __noinline__ uint32_t peerOutOfStep(const FamilyWatch* w, int peer, uint32_t epoch, int what) {
  if (peer < 0 || peer >= w->nranks || peer == w->rank) return 0;
  if (w->ll_counters != nullptr && llAhead(*w, peer)) return kOutOfStepLowLatency;
  const uint32_t mine = htKernelOfWait(what);
  if (mine == 0) return 0;
  const Ctrl* c = w->ht_ctrl;
  auto at = [&](const uint64_t& word) { return tagOf(*reinterpret_cast<const volatile uint64_t*>(&word)) == epoch; };
  uint32_t theirs = 0;
  if (at(c->counts[epoch & 1][peer][w->rank])) theirs = kHtRouting;
  else if (at(c->dinfo[peer][0])) theirs = kHtDispatch;
  else
    for (int ch = 0; ch < w->channels && ch < kMaxChannels; ch++)
      if (at(c->cprog[peer][ch])) {
        theirs = kHtCombine;
        break;
      }
  return theirs != 0 && theirs != mine ? theirs << 8 | mine : 0;
}

// Ranks out of step: every peer found in a low-latency call gets its gone
// byte for this rank set (LLLocal, in its mapped LL buffer), so that its
// waits for this rank end at once with a report its host reads as this
// notice (the process lives), not at its timeout. Not the ranks an
// epCommShrink removed (`dead`; their counters here lie beyond every other).
__device__ __noinline__ void tellLowLatencyPeers(const FamilyWatch* w, unsigned dead) {
  if (w->ll_counters == nullptr) return;
  for (int r = 0; r < w->nranks; r++)
    if (r != w->rank && !((dead >> r) & 1u) && llAhead(*w, r)) *reinterpret_cast<volatile uint8_t*>(w->peer_ll_gone[r] + w->rank) = 1;
  __threadfence_system();
}
}  // namespace

// The one spin loop of every wait (high throughput and low latency): sets
// *word = load() until done(*word). Every 64 spins it looks at the clock (the
// timeout: report(8 /* epTimeout */, *word)), at local->timed_out (another
// wait of this rank failed, or epCommAbort: leave unreported) and at
// local->gone[peer] (its process exited, or for a low-latency wait, the peer
// found the ranks out of step: what it sent before has landed by then, so it
// loads once more before report(6 /* epRemoteError */, *word)).
// A high-throughput wait (kWatchFamily) also looks, after kFamilyProbeNs,
// for the peer in another call (peerOutOfStep): seen there, and still there
// kFamilyConfirmNs later with the word not done, the ranks are out of step:
// it tells the low-latency peers (tellLowLatencyPeers), every other wait of
// this rank leaves (timed_out) and it reports 5 (epInvalidUsage) with what
// it found in place of the word (epoch and what: the wait's collective
// kernel and what it waits for, which tell the kernel's kind). The
// low-latency waits have no such look (their kernels' code stays as it is):
// the high-throughput peer finds them.
// True when done; *word is the last value read. Every word it reads is device
// memory: spinning warps never read host memory (sysmem reads from hundreds of
// pollers clog the SMs' memory pipelines).
template <bool kWatchFamily = false, typename Word, typename Local, typename Load, typename Done, typename Report>
__device__ __forceinline__ bool spinLoop(Local* local, unsigned long long timeout_ns, int peer, Word* word, Load load,
                                         Done done, Report report, uint32_t epoch = 0, int what = 0) {
  unsigned long long deadline = 0;
  for (uint32_t spins = 0;; spins++) {
    *word = load();
    if (done(*word)) return true;
    if ((spins & 63) != 63) continue;
    const unsigned long long now = globalTimer();
    if (deadline == 0) {
      deadline = now + timeout_ns;
    } else if (now > deadline) {
      report(8, *word);
      return false;
    }
    if (*reinterpret_cast<volatile int*>(&local->timed_out)) return false;
    if (peerGone(local->gone, peer)) {
      *word = load();
      if (done(*word)) return true;
      report(6, *word);
      return false;
    }
    if constexpr (kWatchFamily) {
      if (now + timeout_ns - deadline >= kFamilyProbeNs && peerOutOfStep(&local->watch, peer, epoch, what) != 0) {
        // The confirmation leaves as the loop above would for another failed
        // wait or an abort; an exit of the peer meanwhile is its own report.
        bool exited = false;
        for (const unsigned long long until = now + kFamilyConfirmNs; globalTimer() < until;) {
          *word = load();
          if (done(*word)) return true;
          if (*reinterpret_cast<volatile int*>(&local->timed_out)) return false;
          if ((exited = peerGone(local->gone, peer))) break;
        }
        if (exited) continue;
        if (const uint32_t found = peerOutOfStep(&local->watch, peer, epoch, what)) {
          tellLowLatencyPeers(&local->watch, local->dead);
          report(5, Word(found));  // sets timed_out (recordFailedWait)
          return false;
        }
      }
    }
  }
}

// spinLoop on the word at p, loaded with acquire.
template <bool kWatchFamily = false, typename Local, typename Done, typename Report>
__device__ __forceinline__ bool spinWait(const uint64_t* p, Local* local, unsigned long long timeout_ns, int peer,
                                         uint64_t* word, Done done, Report report, uint32_t epoch = 0, int what = 0) {
  return spinLoop<kWatchFamily>(local, timeout_ns, peer, word, [p] { return ldAcquireSys(p); }, done, report, epoch,
                                what);
}

// Spins until the tagged word at p reaches epoch and value >= min_value; returns
// the value, or -1 after the timeout or the peer's exit (error reported).
__device__ __forceinline__ long long waitTagged(const CommView& cv, const uint64_t* p, uint32_t epoch,
                                                uint32_t min_value, int what, int peer) {
  uint64_t v;
  const bool ok = spinWait<true>(
      p, cv.local, cv.timeout_ns, peer, &v,
      [&](uint64_t w) { return tagOf(w) == epoch && valOf(w) >= min_value; },
      [&](int code, uint64_t w) { reportFailedWait(cv, code, what, peer, (long long)epoch, code == 5 ? (long long)w : min_value); },
      epoch, what);
  return ok ? (long long)valOf(v) : -1;
}

__device__ __forceinline__ bool waitReached(const CommView& cv, const uint64_t* p, uint32_t epoch,
                                            int what, int peer) {
  uint64_t v;
  return spinWait<true>(
      p, cv.local, cv.timeout_ns, peer, &v, [&](uint64_t w) { return reached(uint32_t(w), epoch); },
      [&](int code, uint64_t w) { reportFailedWait(cv, code, what, peer, (long long)epoch, code == 5 ? (long long)w : 0); },
      epoch, what);
}

// Ranks an epCommShrink removed (bit r; docs/SHRINK.md, "GPUs"), read from
// this rank's device memory at every call, so that a graph captured before
// the shrink skips them when replayed after it. The high-throughput kernels
// route none of their experts (the routing kernel masks them: no row, no
// count, and the combine has no term for them), write nothing into their
// buffers and wait for none of their words. One load per kernel: these
// calls move megabytes, so one build serves with and without shrink.
__device__ __forceinline__ unsigned htDead(const CommView& cv) { return cv.local->dead; }
__device__ __forceinline__ bool htIsDead(const CommView& cv, int r) { return (htDead(cv) >> r) & 1u; }

// A dispatch or combine of a handle routed before an epCommShrink, which
// only a CUDA graph captured before the shrink can launch (the API refuses
// such handles; the shrink zeroed their routing state): reported
// (epInvalidUsage, at the next call) and nothing runs, on every survivor
// alike. A graph that routes anew (a dispatch with ids) is valid after the
// shrink: its routing kernel records the new count.
__device__ __forceinline__ bool htStaleHandle(const CommView& cv, const HState* hs) {
  const uint32_t routed = hs->shrinks, now = cv.local->shrinks;
  if (routed == now) return false;
  if (blockIdx.x == 0 && threadIdx.x == 0) reportError(cv, 5 /* epInvalidUsage */, kWhatStaleHandle, -1, routed, now);
  return true;
}

// Start of a data kernel: every peer has finished the previous collective
// kernel of this communicator (its fin word, written by that kernel's last
// block), so this kernel may overwrite what that kernel read in the peer's
// buffer; nothing else of the peer's kernel needs it to have started. The word
// is local and usually written long before, so the senders start without the
// round trip of a barrier in which every rank must have started this kernel.
__device__ __forceinline__ void peersFinishedPrevious(const CommView& cv, uint32_t epoch) {
  if (threadIdx.x < cv.nranks && int(threadIdx.x) != cv.rank && !htIsDead(cv, threadIdx.x)) {
    const Ctrl* mine = reinterpret_cast<const Ctrl*>(cv.bufs[cv.rank]);
    waitReached(cv, &mine->fin[threadIdx.x], epoch - 1, kWhatPrevious, threadIdx.x);
  }
  __syncthreads();
}

// Last block of a collective kernel (after lastBlockDone: every block's reads
// of this rank's buffer are done): tells every peer that kernel epoch ended.
__device__ __forceinline__ void publishFinished(const CommView& cv, uint32_t epoch) {
  if (threadIdx.x < cv.nranks && int(threadIdx.x) != cv.rank && !htIsDead(cv, threadIdx.x)) {
    Ctrl* peer = reinterpret_cast<Ctrl*>(cv.bufs[threadIdx.x]);
    stReleaseSys(&peer->fin[cv.rank], epoch);
  }
}

// Last block of a collective kernel: bumps the epoch. Returns true in that block.
__device__ __forceinline__ bool lastBlockDone(DevLocal* local) {
  __threadfence();
  __syncthreads();
  const int last = __syncthreads_or(threadIdx.x == 0 && atomicAdd(&local->blocks_done, 1u) == gridDim.x - 1);
  if (last) __threadfence();
  return last != 0;
}

// Inclusive prefix sum of v over the 32 lanes of a warp (all lanes call it).
template <typename T>
__device__ __forceinline__ T warpInclusiveSum(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

__device__ __forceinline__ long long topkLoad(const void* idx, int idx64, size_t i) {
  return idx64 ? static_cast<const long long*>(idx)[i] : (long long)static_cast<const int*>(idx)[i];
}

}  // namespace cuda
}  // namespace ep
