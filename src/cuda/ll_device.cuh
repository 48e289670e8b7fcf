// Device helpers of the low-latency kernels: record addressing, bounded waits,
// error reporting, last-block detection, work split between blocks.
#pragma once

#include "device.cuh"
#include "ll_common.h"
#include "ll_variant.h"
#include "ll_share.h"

namespace ep {
namespace cuda {

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

// A combine row sent as BF16 (the rank holds one expert of the token): the
// weight (float32) in the first 16 bytes, then the expert's BF16 row as is;
// the home rank forms fmaf(w, y, 0), the partial sum the rank would have sent.
constexpr int kLLSingleRowHead = 16;
// Only with more than two ranks: at two, a rank rarely holds just one of a
// token's 8 experts, and the two-rank kernels stay as they were measured. The
// dispatch (which records the singles) and the combine (which sends and reads
// the BF16 rows) decide alike.
inline bool llUsesSingles(const LLView& v) { return v.nranks > 2; }

// Ranks holding exactly one of token t's experts (bit r), after the masks.
__device__ __forceinline__ uint8_t* llSingles(const LLView& v, LLHandleDev* hd) { return hd->mask + v.max_tokens; }

// Record header fields (the row follows at v.hdr_bytes).
__device__ __forceinline__ int32_t* llIds(const LLView&, char* rec) { return reinterpret_cast<int32_t*>(rec + 16); }
__device__ __forceinline__ float* llWeights(const LLView& v, char* rec) {
  return reinterpret_cast<float*>(rec + 16 + 4 * size_t(v.max_topk));
}
__device__ __forceinline__ int32_t* llSlots(const LLView& v, char* rec) {
  return reinterpret_cast<int32_t*>(rec + 16 + 8 * size_t(v.max_topk));
}

// counts[src][local expert] of rank r's set.
__device__ __forceinline__ int32_t* llCounts(const LLView& v, int r, int set) {
  return reinterpret_cast<int32_t*>(llSet(v, r, set) + v.cnt_off);
}

// base[0..R]: prefix sums of the token counts that threads < R hold in `n`.
__device__ __forceinline__ void llPrefix(int* base, int R, int n) {
  if (threadIdx.x < R) base[threadIdx.x + 1] = n;
  __syncthreads();
  if (threadIdx.x == 0) {
    base[0] = 0;
    for (int s = 0; s < R; s++) base[s + 1] += base[s];
  }
  __syncthreads();
}

// Source rank of flat record index c (records of source s are [base[s], base[s+1])).
__device__ __forceinline__ int llSourceOf(const int* base, int c) {
  int s = 0;
  while (c >= base[s + 1]) s++;
  return s;
}

// Record c of this rank's landing in flat (source, token) order.
__device__ __forceinline__ char* llRecordAt(const LLView& v, int set, const int* src_base, int c) {
  const int s = llSourceOf(src_base, c);
  return llRecord(v, v.rank, set, s, c - src_base[s]);
}

// What a warp reads of a record header: the tag and K (every lane), and the
// expert id, slot field and (w not null) weight of k = lane.
struct LLHeader {
  uint32_t tag;
  int k, id, slot;
};
__device__ __forceinline__ void llLoadHeader(const LLView& v, char* rec, int lane, LLHeader& h, float* w = nullptr) {
  const LLRecordHeader* rh = reinterpret_cast<const LLRecordHeader*>(rec);
  h.tag = rh->tag;
  h.k = int(rh->num_topk);
  if (lane < v.max_topk) {
    h.id = llIds(v, rec)[lane];
    h.slot = llSlots(v, rec)[lane];
    if (w != nullptr) *w = llWeights(v, rec)[lane];
  }
}

// Headers of records c0 .. c0 + n - 1 of a group (flat index order(c) of this
// rank's landing), warp w taking records w, w + warps, ...: h[m] (and w[m]
// when w is not null) of record warp + m * warps; tag 0 past the group's end.
// The loop leaves at the first record past the end (see kInFlight in
// ll_dispatch.cu: a test per unrolled iteration costs an instruction fetch).
template <int kPerWarp, typename Order>
__device__ __forceinline__ void llLoadHeaders(const LLView& v, int set, const int* src_base, int c0, int n, int warps,
                                              Order order, LLHeader (&h)[kPerWarp], float* w = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < kPerWarp; m++) h[m].tag = 0;
#pragma unroll
  for (int m = 0; m < kPerWarp; m++) {
    const int i = warp + m * warps;
    if (i >= n) break;
    llLoadHeader(v, llRecordAt(v, set, src_base, order(c0 + i)), lane, h[m], w != nullptr ? &w[m] : nullptr);
  }
}

__device__ __forceinline__ void llReport(const LLView& v, int code, int what, int peer, long long a, long long b) {
  recordError(v.local, v.err, code, what, peer, a, b);
}
__device__ __forceinline__ void llReportFailedWait(const LLView& v, int code, int what, int peer, long long a,
                                                   long long b) {
  recordFailedWait(v.local, v.err, code, what, peer, a, b);
}

// Spins until the counter *p reaches target (device.cuh: spinWait). Returns
// false after the timeout or once the peer's process exited (reported), or
// when another wait failed.
__device__ __forceinline__ bool llWait(const LLView& v, const uint64_t* p, uint64_t target, int what, int peer) {
  uint64_t got;
  return spinWait(
      p, v.local, v.timeout_ns, peer, &got, [&](uint64_t w) { return w >= target; },
      [&](int code, uint64_t w) { llReportFailedWait(v, code, what, peer, (long long)target, (long long)w); });
}

// Counter target of pair p: the blocks of all pairs of its set so far.
__device__ __forceinline__ uint64_t llTarget(uint64_t pair) { return (pair / 2 + 1) * gridDim.x; }

// The signal counters of LLCtrl, by kind.
enum LLCounter { kLLDispatchSent = 0, kLLCombineSent = 1, kLLCombineRead = 2 };
__device__ __forceinline__ uint64_t* llCounter(const LLView& v, int r, LLCounter kind, int set, int src) {
  static_assert(offsetof(LLCtrl, cdone) == sizeof(uint64_t) * 2 * kMaxRanks, "LLCtrl counters are contiguous");
  static_assert(offsetof(LLCtrl, cfree) == 2 * sizeof(uint64_t) * 2 * kMaxRanks, "LLCtrl counters are contiguous");
  return reinterpret_cast<uint64_t*>(llCtrl(v, r)) + (int(kind) * 2 + set) * kMaxRanks + src;
}

// Ranks an epCommShrink removed (bit r; docs/SHRINK.md, "GPUs"): read from
// this rank's device memory at every call, so that a graph captured before
// the shrink masks them when replayed after it. A survivor writes
// nothing into a removed rank's buffer (llSignal, the ntok words, the
// flagged headers) and sends it no record: its experts' ids read as -1
// where a token is routed (routeToken) and numbered (numberPairs); the shrink set the
// removed sources' counters in this rank's LLCtrl beyond any target and
// zeroed their counts, and the receives take their ntok words as sources of
// no tokens without loading them (llDeadSourceWord), so that no wait of a
// survivor waits for them. Their combine landing rows hold NaN from the
// shrink on (LLEngine::resetForShrink): a term read from a removed rank
// shows in the output instead of adding +0.0.
// The kernels are built twice (EP_LL_SHRINK, ll_variant.h): without
// config.enable_shrink the launches take the build in which this is 0 and
// every test of it folds away, so that the mask costs those calls nothing
// (read at run time, it made them 0.5 us slower at one token,
// docs/BENCHMARKS.md).
#if EP_LL_SHRINK
__device__ __forceinline__ unsigned llDeadRanks(const LLView& v) { return v.local->dead; }
#else
__device__ __forceinline__ unsigned llDeadRanks(const LLView&) { return 0u; }
#endif
__device__ __forceinline__ bool llIsDead(const LLView& v, int r) { return (llDeadRanks(v) >> r) & 1u; }

// This block is done with the step `kind` signals: add 1 to counter
// [kind][set][me] in every rank, after a CTA barrier.
// - Data signals (dispatch sent, combine sent) are release reductions: the
//   barrier orders every thread's stores before them (release is cumulative).
// - kLLCombineRead only says "this block has read what it needed": every value
//   it loaded was consumed before the barrier, so the loads are complete and a
//   relaxed reduction suffices. A release would also wait for the block's own
//   output stores, which no peer reads (measured: 1-1.5 us).
__device__ __forceinline__ void llSignal(const LLView& v, LLCounter kind, int set) {
  __syncthreads();
  if (threadIdx.x < v.nranks && !llIsDead(v, threadIdx.x)) {
    uint64_t* c = llCounter(v, threadIdx.x, kind, set, v.rank);
    if (kind == kLLCombineRead)
      asm volatile("red.relaxed.sys.global.add.u64 [%0], 1;" ::"l"(c) : "memory");
    else
      asm volatile("red.release.sys.global.add.u64 [%0], 1;" ::"l"(c) : "memory");
  }
}

// Threads < R wait until counter [kind][set][r] of this rank reached target;
// the caller syncs the block.
__device__ __forceinline__ void llWaitAll(const LLView& v, LLCounter kind, int set, uint64_t target, int what) {
  if (threadIdx.x < v.nranks) llWait(v, llCounter(v, v.rank, kind, set, threadIdx.x), target, what, threadIdx.x);
}

// Kernel timing (v.timing set): the earliest start and latest end over the blocks.
// Slots are reused every kLLTimingSlots pairs: the dispatch of pair p clears
// the slot of pair p + kLLTimingSlots / 2, long before that pair runs.
__device__ __forceinline__ void llTimeStart(const LLView& v, uint64_t pair, LLKernelKind kind) {
  if (v.timing == nullptr || threadIdx.x != 0) return;
  atomicMin(&v.timing->start[pair % kLLTimingSlots][kind], globalTimer());
  if (kind == kLLKindDispatch && blockIdx.x == 0) {
    const uint32_t ahead = uint32_t((pair + kLLTimingSlots / 2) % kLLTimingSlots);
    for (int k = 0; k < kLLKinds; k++) {
      v.timing->start[ahead][k] = ~0ull;
      v.timing->end[ahead][k] = 0;
      for (int m = 0; m < kLLMarks; m++) v.timing->mark[ahead][k][m] = 0;
    }
  }
}
// Phase mark m: when thread 0 of the latest block passed this point (a
// breakdown of the kernel time; the marks each kernel sets are listed where
// it sets them).
__device__ __forceinline__ void llMark(const LLView& v, uint64_t pair, LLKernelKind kind, int m) {
  if (v.timing == nullptr || threadIdx.x != 0) return;
  atomicMax(&v.timing->mark[pair % kLLTimingSlots][kind][m], globalTimer());
}
__device__ __forceinline__ void llTimeEnd(const LLView& v, uint64_t pair, LLKernelKind kind) {
  if (v.timing == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&v.timing->end[pair % kLLTimingSlots][kind], globalTimer());
}

// Every LL kernel's first step. Launched with programmatic dependent launch
// (LLLaunch::pdl), a kernel may start while the previous kernel on its
// stream still runs; griddepcontrol.wait holds it until that kernel has
// finished and its stores are visible, so nothing of the call (the pair
// word included) is read before. Launched the usual way, the wait is a no-op.
// Returns the call's pair, read from `pair_word`.
__device__ __forceinline__ uint64_t llEnter(const LLView& v, const uint64_t* pair_word, LLKernelKind kind) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const uint64_t pair = *pair_word;
  llTimeStart(v, pair, kind);
  return pair;
}

// Launches an LL kernel with llGrid(l.sms) blocks on l.stream.
template <typename Params>
inline int llLaunch(void (*kernel)(Params), const Params& p, int threads, const LLLaunch& l) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(llGrid(l.sms));
  cfg.blockDim = dim3(threads);
  cfg.stream = static_cast<cudaStream_t>(l.stream);
  if (l.pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return int(cudaLaunchKernelEx(&cfg, kernel, p));
}

// The end of a dispatch send: the pair counter (v.local->pairs, which every
// block read at its start, llEnter) is bumped once every block of the kernel
// has counted its send in this rank's own dispatch counter ([set][rank]):
// by thread 0 of block 0, which waits for that count. A block counts after
// its read of the pair completed (the count's address depends on the value
// read), so no block can read the bumped value. The other blocks end at
// once, without the round trip of a last-block count; in a kernel that
// receives after it sends, block 0's receive waits for every source's count
// anyway. No fence: the value is read by this GPU's next kernels only,
// which follow in stream order.
__device__ __forceinline__ void llBumpPair(const LLView& v, uint64_t pair) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  llWait(v, llCounter(v, v.rank, kLLDispatchSent, int(pair & 1u), v.rank), llTarget(pair), kLLWhatDispatch, v.rank);
  v.local->pairs = pair + 1;
}

}  // namespace cuda
}  // namespace ep
