// Low-latency dispatch: the device code of both kernel files (ll_dispatch.cu:
// the kernels of every call; ll_dispatch_small.cu: the row slices of small
// calls). See ll_common.h for who writes what.
//
// Send, side by side in two groups of blocks (numberingBlocks; a grid of
// fewer than 4 blocks does both in every block, one after the other):
//   1. numbering blocks, a share of the experts each: warp per expert numbers
//      the tokens that chose it (once each), in token order, from ids staged in
//      shared memory, and writes the numbers into the records and the count
//      into the expert's rank;
//   2. row blocks, a share of the tokens each: warp per token reads the
//      expert ids, works out the destination ranks and writes the record
//      headers; then the rows, as
//      16-byte pieces spread over all threads with kInFlight loads in flight
//      each, quantised once (FP8: a scale per 128 values, each 16-lane half-warp
//      owning one block) and stored into landing[me][t] of every destination —
//      one crossing per destination rank, however many of its experts live there.
// Receive: every block takes a contiguous share of the arrived records, works
// out each record's slots (counts of the earlier sources + the number) and
// copies the row to all of them, again in 16-byte pieces over all threads.
//
// Files: ll_dispatch_common.cuh (block shape, sizes), ll_dispatch_send.cuh
// (the send), ll_dispatch_recv_flagged.cuh (the receive where some source
// sent flagged records), this file (the receive of plain records).
#pragma once

#include "ll_dispatch_send.cuh"
#include "ll_dispatch_recv_flagged.cuh"

namespace ep {
namespace cuda {

namespace {

// ---- receive ----

// The first loads of a record group: header fields (warp per record) and the
// first kInFlight pieces per thread of the rows (whether or not the record
// came this pair: the memory is there either way).
struct RecordLoads {
  LLHeader h[kHdrPerWarp];  // slot field: the sender's number
  int4 raw[kInFlight];
};

__device__ __forceinline__ void loadRecordRows(const LLDispatchParams& p, int set, const int* src_base, int c0, int n,
                                               int base, int4 (&raw)[kInFlight]) {
  const int pieces = (p.fp8 ? p.v.hidden : p.v.hidden * 2) / 16, total = n * pieces;
#pragma unroll
  for (int u = 0; u < kInFlight; u++) {
    const int unit = base + u * kThreads + threadIdx.x;
    if (unit >= total) break;
    const int i = unit / pieces, j = unit - i * pieces;
    raw[u] = ldStaged(reinterpret_cast<const int4*>(llRecordAt(p.v, set, src_base, c0 + i) + p.v.hdr_bytes) + j);
  }
}

__device__ __forceinline__ void loadRecords(const LLDispatchParams& p, int set, const int* src_base, int c0, int n,
                                            RecordLoads& rl) {
  llLoadHeaders(p.v, set, src_base, c0, n, kWarps, [](int c) { return c; }, rl.h);
  loadRecordRows(p, set, src_base, c0, n, 0, rl.raw);
}

// s_base[s * L + e] = rows of local expert e from sources before s (when
// `stage` and R * L <= kStagedBases); recv_count of the experts this block owns.
__device__ __forceinline__ void stageBases(const LLDispatchParams& p, int set, int* s_base, bool stage = true) {
  const LLView& v = p.v;
  const int R = v.nranks, L = v.local_experts;
  const int32_t* counts = llCounts(v, v.rank, set);
  const bool staged = stage && R * L <= kStagedBases;
  for (int e = threadIdx.x; e < L; e += kThreads) {
    if (!staged && e % gridDim.x != blockIdx.x) continue;
    int c[kMaxRanks];
#pragma unroll
    for (int s = 0; s < kMaxRanks; s++) c[s] = s < R ? counts[s * L + e] : 0;
    int run = 0;
#pragma unroll
    for (int s = 0; s < kMaxRanks; s++) {
      if (s < R && staged) s_base[s * L + e] = run;
      run += c[s];
    }
    if (e % gridDim.x == blockIdx.x) p.recv_count[e] = run;
  }
}

// Start of a small call's receive: thread s < R gets source s's ntok word of
// this pair, and s_flagged (written by lane 0, published by the caller's
// next barrier) the sources that sent flagged records. kWaitAll (no rank
// sends flagged records): as the whole-row receive, the word loaded first,
// then the wait for every source's signal, then the word loaded again if it
// was not yet this pair's. Otherwise: the word polled until it carries the
// pair's tag (a source writes it before its records), then the signal waited
// for where the source sent plain records only: flagged ones are polled word
// by word and need none. (The first order was also timed for calls that may
// meet flagged sources: 0.05-0.2 us slower at 4-32 tokens on one H200.)
template <bool kWaitAll>
__device__ __forceinline__ uint64_t llSourceWord(const LLDispatchParams& p, uint64_t pair, unsigned& s_flagged) {
  const LLView& v = p.v;
  const int R = v.nranks, set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);
  uint64_t word = 0;
  bool flagged = false;
  if (kWaitAll) {
    const uint64_t* w = &llCtrl(v, v.rank)->ntok[set][threadIdx.x < R ? threadIdx.x : 0];
    if (threadIdx.x < R)
      word = llIsDead(v, threadIdx.x) ? llDeadSourceWord(p, tag)
                                      : *reinterpret_cast<const volatile uint64_t*>(w);
    llWaitAll(v, kLLDispatchSent, set, llTarget(pair), kLLWhatDispatch);
    if (threadIdx.x < R) {
      if (uint32_t(word >> 32) != tag) word = llPollNtok(v, w, tag, threadIdx.x);
      flagged = (uint32_t(word) & kLLNtokFlagged) != 0;
    }
  } else if (threadIdx.x < R && llIsDead(v, threadIdx.x)) {
    word = llDeadSourceWord(p, tag);
  } else if (threadIdx.x < R) {
    const uint64_t* w = &llCtrl(v, v.rank)->ntok[set][threadIdx.x];
    word = *reinterpret_cast<const volatile uint64_t*>(w);
    if (uint32_t(word >> 32) != tag) word = llPollNtok(v, w, tag, threadIdx.x);
    flagged = (uint32_t(word) & kLLNtokFlagged) != 0;
    if (!flagged) llWait(v, llCounter(v, v.rank, kLLDispatchSent, set, threadIdx.x), llTarget(pair), kLLWhatDispatch,
                         threadIdx.x);
  }
  if (threadIdx.x < 32) {
    const unsigned f = __ballot_sync(0xffffffffu, flagged);
    if (threadIdx.x == 0) s_flagged = f;
  }
  return word;
}

// The receive half of pair `pair`. kFlagSources: some rank of the
// communicator may send flagged records (EP_CUDA_LL_FLAGGED above 0 on any
// rank, agreed at init); without it the kernel keeps none of their code: the
// branch to their receive and the poll of a late ntok word cost the 128-token
// calls 1-2% when present.
// kCountsEarly: the owned experts' counts loaded with the first records
// (below); false in the small-call kernels, which take this receive only as
// a fallback and were measured with it as it was: with the early loads in
// their copy of it, their calls of 8 and 32 tokens were 0.25 us slower.
// Marks 4-7 of `kind`: arrived, first group started, its slots, rows copied.
template <bool kFlagSources, bool kCountsEarly = true>
__device__ __forceinline__ void dispatchRecvPhase(const LLDispatchParams& p, uint64_t pair, LLKernelKind kind) {
  const LLView& v = p.v;
  const int R = v.nranks, M = v.max_tokens, H = v.hidden, L = v.local_experts;
  const int set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);  // record tags: the low 32 bits
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ int src_base[kMaxRanks + 1];
  __shared__ unsigned s_flagged;
  __shared__ int s_n[kRecGroup];
  __shared__ int s_dst[kRecGroup][32];  // local expert * cap + slot
  __shared__ int s_flag_dst[1 + 32];    // FlagStage n and dst (its k and ids: s_dst)
  static_assert(kRecGroup * 32 >= kLLFlagStageInts, "s_dst holds the flagged records' K and ids");
  // Thread s loads source s's ntok word before its wait (see llNtokWord) and
  // looks again after the wait only when the word was not yet this pair's.
  // The wait is for every source: a flagged source's blocks count too
  // (relaxed, so the count orders nothing, and its word is polled for its
  // tag); a plain source's release makes its word visible by then. This
  // kernel takes the calls of large receivers; the small ones' kernel
  // (llSourceWord) waits for plain sources only.
  volatile uint64_t* ntok_word = &llCtrl(v, v.rank)->ntok[set][threadIdx.x < R ? threadIdx.x : 0];
  uint64_t word = threadIdx.x >= R ? 0 : llIsDead(v, threadIdx.x) ? llDeadSourceWord(p, tag) : *ntok_word;
  llWaitAll(v, kLLDispatchSent, set, llTarget(pair), kLLWhatDispatch);
  if (threadIdx.x < R && uint32_t(word >> 32) != tag)
    word = kFlagSources ? llPollNtok(v, const_cast<const uint64_t*>(ntok_word), tag, threadIdx.x) : *ntok_word;
  if (kFlagSources && warp == 0) {
    const unsigned f = __ballot_sync(0xffffffffu, threadIdx.x < R && (uint32_t(word) & kLLNtokFlagged) != 0);
    if (lane == 0) s_flagged = f;
  }
  int ntok = 0;
  if (threadIdx.x < R) {
    const uint32_t sent = uint32_t(word);
    ntok = int(sent & kLLNtokCount);
    // Rows of another wire type than this rank asked for cannot be read as its
    // rows: reported (at the next call), and the source's records not copied.
    if (((sent & kLLNtokFp8) != 0) != (p.fp8 != 0)) {
      if (blockIdx.x == 0) llReport(v, 5 /* epInvalidUsage */, kLLWhatWire, threadIdx.x, !p.fp8, p.fp8);
      ntok = 0;
    }
  }
  llPrefix(src_base, R, ntok);
  if (blockIdx.x == 0 && threadIdx.x <= R) p.hd->src_base[threadIdx.x] = src_base[threadIdx.x];
  if (kFlagSources && s_flagged != 0) {
    // Removed sources (llDeadRanks) as flagged ones of no records.
    dispatchRecvFlaggedPhase(p, pair, kind, src_base, s_flagged | llDeadRanks(v),
                             flagStageKIds(p, &s_dst[0][0], s_flag_dst, s_n));
    return;
  }
  llMark(v, pair, kind, 4);
  // No slot bases staged in shared memory: a record from source s adds the
  // counts of the sources before it (s loads, none for source 0) after its
  // header arrives (EP2: receive half -0.06 us; not measured above EP2), and
  // the owned experts' recv_count is written after the copy.
  const int32_t* counts = llCounts(v, v.rank, set);
  const int cap = R * M;
  const int nb = fp8ScaleBlocks(H);
  const size_t row_bytes = p.fp8 ? size_t(H) : size_t(H) * 2;
  const int pieces = int(row_bytes / 16);
  int lo, hi;
  llShare(src_base[R], blockIdx.x, gridDim.x, lo, hi);  // this block's share of the records
  RecordLoads rl;
  if (hi > lo) loadRecords(p, set, src_base, lo, min(kRecGroup, hi - lo), rl);
  // recv_count of the experts this block owns (e % grid == block: thread j
  // the block's j-th), written after the copy: their counts loaded now,
  // beside the records' loads (they are in since the wait), so that the
  // block's last step waits for no load. More local experts than the
  // block's threads can own: the rest loaded after the copy (stageBases).
  const int own_e = kCountsEarly ? blockIdx.x + threadIdx.x * gridDim.x : L;
  int own_c[kMaxRanks];
#pragma unroll
  for (int q = 0; q < kMaxRanks; q++) own_c[q] = q < R && own_e < L ? counts[q * L + own_e] : 0;
  for (int c0 = lo; c0 < hi; c0 += kRecGroup) {
    const int n = min(kRecGroup, hi - c0);
    __syncthreads();  // the previous group's descriptions are no longer read
    if (c0 == lo) llMark(v, pair, kind, 5);
    if (c0 != lo) loadRecords(p, set, src_base, c0, n, rl);
#pragma unroll
    for (int m = 0; m < kHdrPerWarp; m++) {  // warp per record: its local experts and slots
      const int i = warp + m * kWarps;
      if (i >= n) break;
      const int c = c0 + i, s = llSourceOf(src_base, c), t = c - src_base[s];
      int le = -1, slot = 0;
      if (rl.h[m].tag == tag && lane < rl.h[m].k) {
        le = rl.h[m].id - v.first_expert;
        if (le >= 0 && le < L) {
          slot = rl.h[m].slot;
          for (int q = 0; q < s; q++) slot += counts[q * L + le];
          llSlots(v, llRecord(v, v.rank, set, s, t))[lane] = slot;  // absolute, for combine
          if (p.recv_src) p.recv_src[size_t(le) * cap + slot] = s * M + t;
        } else {
          le = -1;
        }
      }
      const unsigned local = __ballot_sync(0xffffffffu, le >= 0);
      if (le >= 0) s_dst[i][__popc(local & ((1u << lane) - 1u))] = le * cap + slot;
      if (lane == 0) s_n[i] = __popc(local);
    }
    __syncthreads();
    if (c0 == lo) llMark(v, pair, kind, 6);
    const int total = n * pieces;
    for (int base = 0; base < total; base += kThreads * kInFlight) {
      if (base != 0) loadRecordRows(p, set, src_base, c0, n, base, rl.raw);
#pragma unroll
      for (int u = 0; u < kInFlight; u++) {
        const int unit = base + u * kThreads + threadIdx.x;
        if (unit >= total) break;
        const int i = unit / pieces, j = unit - i * pieces;
        for (int d = 0; d < s_n[i]; d++)
          reinterpret_cast<int4*>(p.recv_x + size_t(s_dst[i][d]) * row_bytes)[j] = rl.raw[u];
      }
    }
    if (p.fp8) {
      for (int unit = threadIdx.x; unit < n * nb; unit += kThreads) {
        const int i = unit / nb, b = unit - i * nb;
        if (s_n[i] == 0) continue;
        const float scale =
            reinterpret_cast<const float*>(llRecordAt(v, set, src_base, c0 + i) + v.hdr_bytes + size_t(H) * 2)[b];
        for (int d = 0; d < s_n[i]; d++) {
          const int le = s_dst[i][d] / cap, slot = s_dst[i][d] - le * cap;
          p.recv_scales[(size_t(le) * nb + b) * cap + slot] = scale;
        }
      }
    }
  }
  if (own_e < L) {
    int run = 0;
#pragma unroll
    for (int q = 0; q < kMaxRanks; q++) run += own_c[q];
    p.recv_count[own_e] = run;
  }
  if (!kCountsEarly || L > kThreads * int(gridDim.x))
    stageBases(p, set, nullptr, false);  // recv_count of the owned experts (the rest of them)
  llMark(v, pair, kind, 7);
}

}  // namespace
}  // namespace cuda
}  // namespace ep
