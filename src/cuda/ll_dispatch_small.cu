// Low-latency dispatch of small calls: the row slices. With fewer tokens
// than row blocks, whole rows leave most row blocks idle and give the busy
// ones several unrolled rounds of FP8 work each (one token: one block, four
// rounds). Here each token's pieces are cut into slices over several blocks
// (llSliceShare: one piece per thread, whole FP8 scale blocks), so a
// one-token call stores its row in one round on four blocks.
//
// Kernels of their own, in a file of their own: every version that changed
// the whole-row send code, even only its index arithmetic, made the
// 128-token send half 0.5-0.8 us slower (measured), so ll_dispatch.cu's
// device code is left exactly as it was, and the numbering and signalling
// steps around the rows are repeated here rather than shared.
#include "ll_dispatch.cuh"
#include "preload.cuh"

namespace ep {
namespace cuda {

namespace {

// Piece plo + base + threadIdx.x of the row, if inside the slice
// [plo, plo + width) and the row (FP8 pads rows to whole scale blocks).
__device__ __forceinline__ bool slicePiece(const LLDispatchParams& p, int plo, int width, int base, int& j) {
  j = plo + base + int(threadIdx.x);
  return base + int(threadIdx.x) < width && j < rowPieces(p);
}

__device__ __forceinline__ void loadSlicePiece(const LLDispatchParams& p, int t, int plo, int width, int base,
                                               int4& raw) {
  int j;
  if (slicePiece(p, plo, width, base, j)) raw = ldNc(reinterpret_cast<const int4*>(p.x + size_t(t) * p.v.hidden) + j);
}

// The ids and weights of token t (warp 0), as loadTokens leaves them for n = 1.
__device__ __forceinline__ void loadSliceIds(const LLDispatchParams& p, int t, TokenLoads& tl) {
  const int K = p.num_topk, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < kHdrPerWarp; m++) {
    tl.id[m] = -1;
    tl.w[m] = 0.0f;
  }
  if (warp == 0 && lane < K) {
    tl.id[0] = topkLoad(p.topk, p.idx64, size_t(t) * K + lane);
    tl.w[0] = p.weights ? p.weights[size_t(t) * K + lane] : 1.0f;
  }
}

// Stores this thread's piece j of row t (quantised for FP8) into the record
// of every destination rank in `mask` (storeRowPieces for one unit). For
// FP8 every lane comes, for the shuffles: a half-warp is all in or all out.
__device__ __forceinline__ void storeSlicePiece(const LLDispatchParams& p, int set, int t, int j, bool active,
                                                int4 raw, unsigned mask) {
  const LLView& v = p.v;
  const int H = v.hidden, me = v.rank, lane = threadIdx.x & 31;
  if (!p.fp8) {
    if (active)
      for (unsigned bits = mask; bits; bits &= bits - 1)
        reinterpret_cast<int4*>(llRecord(v, __ffs(bits) - 1, set, me, t) + v.hdr_bytes)[j] = raw;
    return;
  }
  float f[8], scale, inv;
  fp8PieceScale(p, active, raw, f, scale, inv);
  if (!active) return;
  const uint2 q = make_uint2(packFp8x4(f[0] * inv, f[1] * inv, f[2] * inv, f[3] * inv),
                             packFp8x4(f[4] * inv, f[5] * inv, f[6] * inv, f[7] * inv));
  for (unsigned bits = mask; bits; bits &= bits - 1) {
    char* row = llRecord(v, __ffs(bits) - 1, set, me, t) + v.hdr_bytes;
    reinterpret_cast<uint2*>(row)[j] = q;
    if ((lane & 15) == 0) reinterpret_cast<float*>(row + size_t(H) * 2)[j / 16] = scale;
  }
}

// Stores this thread's piece j of row t as flagged words (ll_flagged.cuh)
// into the flagged record of every destination rank in `mask`: FP8 codes (a
// half-warp per scale block, every lane comes for the shuffles) or the BF16
// piece as is.
__device__ __forceinline__ void storeFlaggedPiece(const LLDispatchParams& p, int set, uint32_t tag, int t, int j,
                                                  bool active, int4 raw, unsigned mask) {
  const LLView& v = p.v;
  const int me = v.rank, lane = threadIdx.x & 31;
  if (!p.fp8) {
    if (active)
      for (unsigned bits = mask; bits; bits &= bits - 1) {
        uint64_t* row = llFlagRow(v, llFlagRecord(v, __ffs(bits) - 1, set, me, t)) + 4 * size_t(j);
        llStFlag2(row, tag, uint32_t(raw.x), uint32_t(raw.y));
        llStFlag2(row + 2, tag, uint32_t(raw.z), uint32_t(raw.w));
      }
    return;
  }
  float f[8], scale, inv;
  fp8PieceScale(p, active, raw, f, scale, inv);
  if (!active) return;
  const uint32_t lo = packFp8x4(f[0] * inv, f[1] * inv, f[2] * inv, f[3] * inv);
  const uint32_t hi = packFp8x4(f[4] * inv, f[5] * inv, f[6] * inv, f[7] * inv);
  for (unsigned bits = mask; bits; bits &= bits - 1) {
    uint64_t* rec = llFlagRecord(v, __ffs(bits) - 1, set, me, t);
    llStFlag2(llFlagRow(v, rec) + 2 * size_t(j), tag, lo, hi);
    if ((lane & 15) == 0) llStFlag(llFlagScales(v, rec) + j / 16, tag, __float_as_uint(scale));
  }
}

// The send half of a call of at most kLLFlagTokens tokens: flagged records
// (ll_flagged.cuh), no numbering, no signal to wait for. Every token's pieces
// are cut into slices over the blocks as in dispatchSendSlicesPhase; the first
// slice of a token also sends its header words to every rank.
template <bool kSingles>
__device__ __forceinline__ void dispatchSendFlaggedPhase(const LLDispatchParams& p, uint64_t pair) {
  const LLView& v = p.v;
  const int set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);
  const int K = p.num_topk, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const LLSliceShare sl = llSliceShare(p.num_tokens, piecesPerToken(p), blockIdx.x, gridDim.x, kThreads, 16);
  TokenLoads tl;
  if (sl.hi > sl.lo) {
    loadSliceIds(p, sl.lo, tl);
    loadSlicePiece(p, sl.lo, sl.plo, sl.width, 0, tl.raw[0]);
  }
  // Pair - 2 used this set: every peer must have finished its combine send of it.
  if (pair >= 2) llWaitAll(v, kLLCombineSent, set, llTarget(pair - 2), kLLWhatFree);
  if (blockIdx.x == 0) {
    if (threadIdx.x < v.nranks)
      llAnnounce(p, set, threadIdx.x, llNtokWord(tag, p.num_tokens, p.fp8, true),
                 [](uint64_t* w, uint64_t word) { llStRelaxed64(w, word); });
    if (threadIdx.x == 0) {
      p.hd->pair = pair;
      p.hd->num_tokens = p.num_tokens;
    }
  }
  __shared__ unsigned s_mask;
  for (int t = sl.lo; t < sl.hi; t++) {
    __syncthreads();  // the wait above; s_mask of the previous token is no longer read
    if (t != sl.lo) {
      loadSliceIds(p, t, tl);
      loadSlicePiece(p, t, sl.plo, sl.width, 0, tl.raw[0]);
    }
    if (warp == 0) {
      int id;
      const unsigned mask = routeToken<kSingles>(p, t, tl.id[0], id);  // tl.id: -1 for lanes >= K
      if (lane == 0) s_mask = mask;
      if (sl.plo == 0)
        for (int r = 0; r < v.nranks; r++) {
          if (llIsDead(v, r)) continue;  // nothing into a removed rank's buffer
          uint64_t* h = llFlagRecord(v, r, set, v.rank, t);
          if (lane == 0) llStFlag(h, tag, uint32_t(K));
          if (lane < v.max_topk) {
            llStFlag(h + 1 + lane, tag, uint32_t(id));
            llStFlag(h + 1 + v.max_topk + lane, tag, __float_as_uint(lane < K ? tl.w[0] : 0.0f));
          }
        }
    }
    __syncthreads();
    for (int base = 0; base < sl.width; base += kThreads) {
      if (base != 0) loadSlicePiece(p, t, sl.plo, sl.width, base, tl.raw[0]);
      int j;
      const bool active = slicePiece(p, sl.plo, sl.width, base, j);
      storeFlaggedPiece(p, set, tag, t, j, active, tl.raw[0], s_mask);
    }
  }
  llMark(v, pair, kLLKindDispatch, 1);  // rows stored
  llCountRelaxed(v, kLLDispatchSent, set);
  // The kernel bumps v.local->pairs at its end (llBumpPair): not between the
  // halves, where block 0's wait for every block's count would delay its
  // receive (the flagged receive waits for no count).
}

// The send half of a small call: dispatchSendPhase with slices for rows.
// Every slice of a token writes its headers (the same values: the extra
// stores are a few hundred bytes, and no block waits for another).
template <bool kSingles>
__device__ __forceinline__ void dispatchSendSlicesPhase(const LLDispatchParams& p, uint64_t pair) {
  const LLView& v = p.v;
  const auto [set, tag, NB, numbers, rows] = sendRoles(v, pair);
  LLSliceShare sl{0, 0, 0, 0};
  if (rows)  // NB == 0: every block
    sl = llSliceShare(p.num_tokens, piecesPerToken(p), int(blockIdx.x) - NB, int(gridDim.x) - NB, kThreads, 16);
  // Loads first: the first token's ids and piece, or the first numbering round.
  TokenLoads tl;
  if (sl.hi > sl.lo) {
    loadSliceIds(p, sl.lo, tl);
    loadSlicePiece(p, sl.lo, sl.plo, sl.width, 0, tl.raw[0]);
  }
  long long first_ids[kIdRegs];
  if (numbers) loadIdRound(p, 0, min(kIdStage / p.num_topk, p.num_tokens), first_ids);
  sendStart(p, pair, NB, numbers, first_ids);
  __shared__ unsigned s_mask[kTokGroup];
  // One token per block when the host picks these kernels (smallCall); more
  // (whole rows of a larger call) are correct too, one after the other.
  for (int t = sl.lo; t < sl.hi; t++) {
    __syncthreads();  // the wait above; s_mask of the previous token is no longer read
    if (t != sl.lo) {
      loadSliceIds(p, t, tl);
      loadSlicePiece(p, t, sl.plo, sl.width, 0, tl.raw[0]);
    }
    writeHeaders<kSingles>(p, set, tag, t, 1, tl, s_mask);
    __syncthreads();
    for (int base = 0; base < sl.width; base += kThreads) {
      if (base != 0) loadSlicePiece(p, t, sl.plo, sl.width, base, tl.raw[0]);
      int j;
      const bool active = slicePiece(p, sl.plo, sl.width, base, j);
      storeSlicePiece(p, set, t, j, active, tl.raw[0], s_mask[0]);
    }
  }
  sendEnd(v, pair);
}

// ---- receive ----

// The receive half of a small call (few records: at most half a grid): each
// record's row cut into slices over several blocks (llSliceShare), a slice
// of at most one piece per thread, which each of the block's threads stores
// into every expert slot of the record, its scales beside. dispatchRecvPhase
// gives a record to one block, which at one token copies its row 4-8 times
// in rounds and then loads and copies the scales: a chain of latencies on
// one SM where the other SMs wait. Larger calls (also a small call of this
// rank that meets large calls of its peers) go to dispatchRecvPhase, which
// waits and reads the counts again (passing at once). The wait and the
// token counts are dispatchRecvPhase's lines repeated, like the send steps
// above, so that the whole-row kernels keep the code that was measured.
// Marks 4-7 of `kind` as dispatchRecvPhase's. kSources: which kinds of
// records the sources may have sent (a kernel carries only the receives it
// may need).
enum LLSources {
  kSourcesPlain = 0,        // no rank sends flagged records (p.flag_cap == 0)
  kSourcesMixed = 1,        // this rank sent plain records, a peer may have sent flagged ones
  kSourcesSelfFlagged = 2,  // this rank sent flagged records: the flagged receive takes the call
};
template <int kSources>
__device__ __forceinline__ void dispatchRecvSlicesPhase(const LLDispatchParams& p, uint64_t pair, LLKernelKind kind) {
  constexpr bool kSelfFlagged = kSources == kSourcesSelfFlagged;
  const LLView& v = p.v;
  const int R = v.nranks, M = v.max_tokens, H = v.hidden, L = v.local_experts, G = gridDim.x;
  const int set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);  // record tags: the low 32 bits
  const int lane = threadIdx.x & 31;
  __shared__ int src_base[kMaxRanks + 1];
  __shared__ int s_base[kStagedBases];
  __shared__ unsigned s_flagged;
  const uint64_t word = llSourceWord<kSources == kSourcesPlain>(p, pair, s_flagged);
  int ntok = 0;
  bool wrong_wire = false;
  if (threadIdx.x < R) {
    const uint32_t sent = uint32_t(word);
    ntok = int(sent & kLLNtokCount);
    wrong_wire = ((sent & kLLNtokFp8) != 0) != (p.fp8 != 0);
    if (wrong_wire) ntok = 0;
  }
  llPrefix(src_base, R, ntok);
  if (kSelfFlagged || (kSources == kSourcesMixed && s_flagged != 0)) {
    if (wrong_wire && blockIdx.x == 0) llReport(v, 5 /* epInvalidUsage */, kLLWhatWire, threadIdx.x, !p.fp8, p.fp8);
    if (blockIdx.x == 0 && threadIdx.x <= R) p.hd->src_base[threadIdx.x] = src_base[threadIdx.x];
    // Removed sources (llDeadRanks) send nothing: flagged as sources of no records.
    const unsigned all = (1u << R) - 1u, flagged = s_flagged | llDeadRanks(v);  // R <= kMaxRanks
    llMark(v, pair, kind, 4);
    // The staged bases' array is free on this path: the flagged headers go there.
    static_assert(kFlagStageFull <= kStagedBases, "flagged stage");
    const FlagStage fs = flagStageAll(p, s_base);
    if (flagged == all && flaggedSliceFits(p, src_base[R]))
      recvFlaggedSlice(p, pair, kind, src_base, fs);
    else
      dispatchRecvFlaggedPhase(p, pair, kind, src_base, flagged, fs);
    return;
  }
  const int N = src_base[R];
  const size_t row_bytes = p.fp8 ? size_t(H) : size_t(H) * 2;
  const int pieces = int(row_bytes / 16), nb = fp8ScaleBlocks(H), cap = R * M;
  const LLSlices cut = llSlicesOf(N, pieces, G, kRecvSliceStep, kRecvSliceAlign);
  if (cut.S < 2 || cut.chunk > kThreads || R * L > kStagedBases) {
    dispatchRecvPhase<kSources != kSourcesPlain, false>(p, pair, kind);
    return;
  }
  if (wrong_wire && blockIdx.x == 0) llReport(v, 5 /* epInvalidUsage */, kLLWhatWire, threadIdx.x, !p.fp8, p.fp8);
  llMark(v, pair, kind, 4);
  if (blockIdx.x == 0 && threadIdx.x <= R) p.hd->src_base[threadIdx.x] = src_base[threadIdx.x];
  // This block's slice [plo, plo + width) of record c, if any; the loads
  // first (header: warp 0; piece plo + thread; scale block plo / 8 + thread).
  const LLSliceShare sl = llSliceShare(N, pieces, blockIdx.x, G, kRecvSliceStep, kRecvSliceAlign);
  const bool mine = sl.hi > sl.lo;
  const int c = sl.lo;
  const int src = mine ? llSourceOf(src_base, c) : 0, t = mine ? c - src_base[src] : 0;
  char* rec = llRecord(v, v.rank, set, src, t);
  const bool has_piece = mine && int(threadIdx.x) < sl.width;
  const int b = sl.plo / kRecvSliceAlign + int(threadIdx.x);
  const bool has_scale = p.fp8 && mine && int(threadIdx.x) < (sl.width + kRecvSliceAlign - 1) / kRecvSliceAlign && b < nb;
  LLHeader h;
  h.tag = 0;
  int4 raw = make_int4(0, 0, 0, 0);
  float scale = 0.0f;
  if (mine && threadIdx.x < 32) llLoadHeader(v, rec, lane, h);
  if (has_piece) raw = ldStaged(reinterpret_cast<const int4*>(rec + v.hdr_bytes) + sl.plo + threadIdx.x);
  if (has_scale) scale = reinterpret_cast<const float*>(rec + v.hdr_bytes + size_t(H) * 2)[b];
  stageBases(p, set, s_base);
  __syncthreads();
  llMark(v, pair, kind, 5);
  __shared__ int s_n;
  __shared__ int s_dst[32];  // local expert * cap + slot
  int le = -1, slot = 0;     // warp 0: expert k = lane of the record, if local
  uint32_t* readers = &reinterpret_cast<LLRecordHeader*>(rec)->slice_readers;
  uint32_t before = 0;
  if (threadIdx.x < 32) {
    if (mine && h.tag == tag && lane < h.k) {
      le = h.id - v.first_expert;
      if (le >= 0 && le < L) {
        slot = h.slot + s_base[src * L + le];
        if (sl.plo == 0 && p.recv_src) p.recv_src[size_t(le) * cap + slot] = src * M + t;
      } else {
        le = -1;
      }
    }
    const unsigned local = __ballot_sync(0xffffffffu, le >= 0);
    if (le >= 0) s_dst[__popc(local & ((1u << lane) - 1u))] = le * cap + slot;
    if (lane == 0) s_n = __popc(local);
    // The record's slots field holds the sender's numbers, which every slice
    // reads; the combine reads the absolute slots there. So the slice that
    // reads it last writes them: each slice counts itself in the header's slice_readers
    // word (zero between calls: the last one resets it). The count is a
    // relaxed add: warp 0 (the only reader) has used every value it loaded
    // (the ballot above), so its loads were performed before the add; and the
    // last slice's writes wait for the add's result. (An acq_rel add fenced
    // warp 0 here: +0.2 us at one token.) Its round trip runs while the
    // block copies.
    if (mine && lane == 0) before = atomicAdd(readers, 1u);
  }
  __syncthreads();
  llMark(v, pair, kind, 6);
  const int n = s_n;
  if (has_piece)
    for (int d = 0; d < n; d++)
      reinterpret_cast<int4*>(p.recv_x + size_t(s_dst[d]) * row_bytes)[sl.plo + threadIdx.x] = raw;
  if (has_scale)
    for (int d = 0; d < n; d++) {
      const int e = s_dst[d] / cap, sd = s_dst[d] - e * cap;
      p.recv_scales[(size_t(e) * nb + b) * cap + sd] = scale;
    }
  if (threadIdx.x < 32 && __shfl_sync(0xffffffffu, before, 0) == uint32_t(cut.filled - 1) && mine) {
    if (le >= 0) llSlots(v, rec)[lane] = slot;
    if (lane == 0) *readers = 0;
  }
  llMark(v, pair, kind, 7);
}

// kFlagged: the call sends flagged records (p.flagged); each kernel carries
// one kind of send only.
template <bool kSingles, bool kFlagged>
__global__ void __launch_bounds__(kThreads, 1) llDispatchSlicesSendKernel(const __grid_constant__ LLDispatchParams p) {
  const uint64_t pair = llEnter(p.v, &p.v.local->pairs, kLLKindDispatch);
  if (kFlagged) {
    dispatchSendFlaggedPhase<kSingles>(p, pair);
    llBumpPair(p.v, pair);
  } else {
    dispatchSendSlicesPhase<kSingles>(p, pair);
  }
  llTimeEnd(p.v, pair, kLLKindDispatch);
}

// Both halves in one launch (see llDispatchKernel); kSources as
// dispatchRecvSlicesPhase's, which also says the kind of send.
template <bool kSingles, int kSources>
__global__ void __launch_bounds__(kThreads, 1) llDispatchSlicesKernel(const __grid_constant__ LLDispatchParams p) {
  constexpr bool kFlagged = kSources == kSourcesSelfFlagged;
  const uint64_t pair = llEnter(p.v, &p.v.local->pairs, kLLKindDispatch);
  if (kFlagged) dispatchSendFlaggedPhase<kSingles>(p, pair);
  else dispatchSendSlicesPhase<kSingles>(p, pair);
  dispatchRecvSlicesPhase<kSources>(p, pair, kLLKindDispatch);
  if (kFlagged) llBumpPair(p.v, pair);
  llTimeEnd(p.v, pair, kLLKindDispatch);
}

// The receive half of a split small call.
template <int kSources>
__global__ void __launch_bounds__(kThreads, 1) llDispatchRecvSlicesKernel(const __grid_constant__ LLDispatchParams p) {
  const uint64_t pair = llEnter(p.v, &p.hd->pair, kLLKindDispatchRecv);
  dispatchRecvSlicesPhase<kSources>(p, pair, kLLKindDispatchRecv);
  llTimeEnd(p.v, pair, kLLKindDispatchRecv);
}

}  // namespace

namespace EP_LL_VARIANT {

// The sources a call's receive must read (LLSources).
static int sourcesOf(const LLDispatchParams& p) {
  return p.flagged ? kSourcesSelfFlagged : p.flag_cap ? kSourcesMixed : kSourcesPlain;
}

int launchLLDispatchRecvSlices(const LLDispatchParams& p, const LLLaunch& l) {
  switch (sourcesOf(p)) {
    case kSourcesSelfFlagged:
      return llLaunch(llDispatchRecvSlicesKernel<kSourcesSelfFlagged>, p, kThreads, l);
    case kSourcesMixed: return llLaunch(llDispatchRecvSlicesKernel<kSourcesMixed>, p, kThreads, l);
    default: return llLaunch(llDispatchRecvSlicesKernel<kSourcesPlain>, p, kThreads, l);
  }
}

template <bool kSingles>
static int launchSlices(const LLDispatchParams& p, const LLLaunch& l, bool send_only) {
  if (send_only)
    return p.flagged ? llLaunch(llDispatchSlicesSendKernel<kSingles, true>, p, kThreads, l)
                     : llLaunch(llDispatchSlicesSendKernel<kSingles, false>, p, kThreads, l);
  switch (sourcesOf(p)) {
    case kSourcesSelfFlagged:
      return llLaunch(llDispatchSlicesKernel<kSingles, kSourcesSelfFlagged>, p, kThreads, l);
    case kSourcesMixed: return llLaunch(llDispatchSlicesKernel<kSingles, kSourcesMixed>, p, kThreads, l);
    default: return llLaunch(llDispatchSlicesKernel<kSingles, kSourcesPlain>, p, kThreads, l);
  }
}

int launchLLDispatchSlices(const LLDispatchParams& p, const LLLaunch& l, bool send_only) {
  return llUsesSingles(p.v) ? launchSlices<true>(p, l, send_only) : launchSlices<false>(p, l, send_only);
}

int preloadLLDispatchSlicesKernels() {
  return preloadKernels(
      llDispatchSlicesSendKernel<true, false>, llDispatchSlicesSendKernel<false, false>,
      llDispatchSlicesSendKernel<true, true>, llDispatchSlicesSendKernel<false, true>,
      llDispatchSlicesKernel<true, kSourcesPlain>, llDispatchSlicesKernel<false, kSourcesPlain>,
      llDispatchSlicesKernel<true, kSourcesMixed>, llDispatchSlicesKernel<false, kSourcesMixed>,
      llDispatchSlicesKernel<true, kSourcesSelfFlagged>, llDispatchSlicesKernel<false, kSourcesSelfFlagged>,
      llDispatchRecvSlicesKernel<kSourcesPlain>, llDispatchRecvSlicesKernel<kSourcesMixed>,
      llDispatchRecvSlicesKernel<kSourcesSelfFlagged>);
}

}  // namespace EP_LL_VARIANT

}  // namespace cuda
}  // namespace ep
