// Low-latency dispatch, the send half (ll_dispatch.cuh has the overview).
#pragma once

#include <cuda_fp8.h>

#include "fp8_soft.h"
#include "ll_dispatch_common.cuh"

namespace ep {
namespace cuda {

namespace {

__device__ __forceinline__ float roundScalePow2(float s) {
  uint32_t bits = __float_as_uint(s);
  if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
  return __uint_as_float(bits);
}

// Four FP8 codes, a in the low byte: the conversion instruction from sm_89 on;
// before, fp8_soft.h (CUDA's emulation of the instruction costs ~10 us per
// 128-token send half, docs/BENCHMARKS.md).
__device__ __forceinline__ uint32_t packFp8x4(float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 890
  __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return uint32_t(lo) | (uint32_t(hi) << 16);
#else
  return fp8soft::packE4M3x4(a, b, c, d);
#endif
}

// ---- send ----

// The first loads of a token group, issued before anything is stored: the
// expert ids and weights (warp per token) and the first kInFlight pieces per
// thread of the rows.
struct TokenLoads {
  long long id[kHdrPerWarp];
  float w[kHdrPerWarp];
  int4 raw[kInFlight];
};

__device__ __forceinline__ int rowPieces(const LLDispatchParams& p) { return p.v.hidden / 8; }
// FP8 pads every token to whole 16-piece scale blocks (a half-warp per block).
__device__ __forceinline__ int piecesPerToken(const LLDispatchParams& p) {
  return p.fp8 ? (rowPieces(p) + 15) / 16 * 16 : rowPieces(p);
}

__device__ __forceinline__ void loadRowPieces(const LLDispatchParams& p, int t0, int n, int base, int4 (&raw)[kInFlight]) {
  const int pieces = rowPieces(p), per_token = piecesPerToken(p), total = n * per_token;
#pragma unroll
  for (int u = 0; u < kInFlight; u++) {
    const int unit = base + u * kThreads + threadIdx.x;
    const int i = unit / per_token, j = unit - i * per_token;
    if (unit < total && j < pieces) raw[u] = ldNc(reinterpret_cast<const int4*>(p.x + size_t(t0 + i) * p.v.hidden) + j);
  }
}

__device__ __forceinline__ void loadTokens(const LLDispatchParams& p, int t0, int n, TokenLoads& tl) {
  const int K = p.num_topk, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < kHdrPerWarp; m++) {
    const int i = warp + m * kWarps;
    tl.id[m] = -1;
    tl.w[m] = 0.0f;
    if (i < n && lane < K) {
      tl.id[m] = topkLoad(p.topk, p.idx64, size_t(t0 + i) * K + lane);
      tl.w[m] = p.weights ? p.weights[size_t(t0 + i) * K + lane] : 1.0f;
    }
  }
  loadRowPieces(p, t0, n, 0, tl.raw);
}

// One warp, lane k holding entry k of token t's top-k (e: -1 for lanes >= K):
// reports an id out of range (the entry then counts as -1), sets id (the
// lane's expert or -1) and returns the destination ranks of the token (bit
// r), which it keeps in the handle for the combine, with (kSingles) the
// ranks holding exactly one of the token's entries.
template <bool kSingles>
__device__ __forceinline__ unsigned routeToken(const LLDispatchParams& p, int t, long long e, int& id) {
  const LLView& v = p.v;
  const int lane = threadIdx.x & 31;
  if (lane < p.num_topk && (e < -1 || e >= v.num_experts))
    llReport(v, 4 /* epInvalidArgument */, kLLWhatBadTopk, -1, t, e);
  id = (e < 0 || e >= v.num_experts) ? -1 : int(e);
  const int dest = id >= 0 ? id / v.local_experts : -1;
  if (dest >= 0 && llIsDead(v, dest)) id = -1;  // masked (llDeadRanks): no record, no term in the combine
  const unsigned mask = __reduce_or_sync(0xffffffffu, id >= 0 ? 1u << dest : 0u);
  if (kSingles) {
    const unsigned same = __match_any_sync(0xffffffffu, id >= 0 ? dest : -1 - lane);
    const unsigned singles = __reduce_or_sync(0xffffffffu, id >= 0 && __popc(same) == 1 ? 1u << dest : 0u);
    if (lane == 0) llSingles(v, p.hd)[t] = uint8_t(singles);
  }
  if (lane == 0) p.hd->mask[t] = uint8_t(mask);
  return mask;
}

// Headers of tokens [t0, t0 + n); s_mask[i] = destination ranks of token t0 + i.
// kSingles (more than two ranks): also the ranks holding exactly one of each
// token's (k) entries, whose combine rows come back as BF16 (ll_combine.cu).
template <bool kSingles>
__device__ __forceinline__ void writeHeaders(const LLDispatchParams& p, int set, uint32_t tag, int t0, int n,
                                             const TokenLoads& tl, unsigned* s_mask) {
  const LLView& v = p.v;
  const int K = p.num_topk, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < kHdrPerWarp; m++) {
    const int i = warp + m * kWarps;
    if (i >= n) break;
    const int t = t0 + i;
    int id;
    const unsigned mask = routeToken<kSingles>(p, t, tl.id[m], id);
    if (lane == 0) s_mask[i] = mask;
    for (unsigned bits = mask; bits; bits &= bits - 1) {
      char* rec = llRecord(v, __ffs(bits) - 1, set, v.rank, t);
      if (lane < K) {
        llIds(v, rec)[lane] = id;
        llWeights(v, rec)[lane] = tl.w[m];
      }
      if (lane == 0) {
        LLRecordHeader* h = reinterpret_cast<LLRecordHeader*>(rec);
        h->token = t;
        h->num_topk = uint32_t(K);
        h->tag = tag;  // read only after the dispatch signal, which orders it
      }
    }
  }
}

// The FP8 scale of this thread's half-warp (128 values) and the piece's 8
// values as floats (f; only when active). Every lane must come, for the
// shuffles: a half-warp is all in or all out of range.
__device__ __forceinline__ void fp8PieceScale(const LLDispatchParams& p, bool active, int4 raw, float (&f)[8],
                                              float& scale, float& inv) {
  float amax = 0.0f;
  if (active) {
    const uint32_t words[4] = {uint32_t(raw.x), uint32_t(raw.y), uint32_t(raw.z), uint32_t(raw.w)};
#pragma unroll
    for (int q = 0; q < 4; q++) {
      f[2 * q] = bf16ToFloat(words[q] & 0xffffu);
      f[2 * q + 1] = bf16ToFloat(words[q] >> 16);
    }
#pragma unroll
    for (int q = 0; q < 8; q++) amax = fmaxf(amax, fabsf(f[q]));
  }
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  scale = fmaxf(amax, 1e-4f) / 448.0f;
  if (p.pow2) scale = roundScalePow2(scale);
  inv = 1.0f / scale;
}

// Stores the pieces of rows [t0, t0 + n) loaded for `base` (quantised for FP8).
// Its FP8 scale is fp8PieceScale's, as the row slices' (ll_dispatch_small.cu):
// that helper leaves this function's machine code as it was when timed
// (tests/gpu/sass_digest.py); check it again after changing either.
__device__ __forceinline__ void storeRowPieces(const LLDispatchParams& p, int set, int t0, int n, int base,
                                               const int4 (&raw)[kInFlight], const unsigned* s_mask) {
  const LLView& v = p.v;
  const int H = v.hidden, me = v.rank, lane = threadIdx.x & 31;
  const int pieces = rowPieces(p), per_token = piecesPerToken(p), total = n * per_token;
#pragma unroll
  for (int u = 0; u < kInFlight; u++) {
    const int unit = base + u * kThreads + threadIdx.x;
    const int i = unit / per_token, j = unit - i * per_token;
    const bool active = unit < total && j < pieces;
    if (!p.fp8) {
      if (active)
        for (unsigned bits = s_mask[i]; bits; bits &= bits - 1)
          reinterpret_cast<int4*>(llRecord(v, __ffs(bits) - 1, set, me, t0 + i) + v.hdr_bytes)[j] = raw[u];
      continue;
    }
    // FP8: the shuffles need every lane (a half-warp is all in or all out of range).
    float f[8], scale, inv;
    fp8PieceScale(p, active, raw[u], f, scale, inv);
    if (!active) continue;
    const uint2 q = make_uint2(packFp8x4(f[0] * inv, f[1] * inv, f[2] * inv, f[3] * inv),
                               packFp8x4(f[4] * inv, f[5] * inv, f[6] * inv, f[7] * inv));
    for (unsigned bits = s_mask[i]; bits; bits &= bits - 1) {
      char* row = llRecord(v, __ffs(bits) - 1, set, me, t0 + i) + v.hdr_bytes;
      reinterpret_cast<uint2*>(row)[j] = q;
      if ((lane & 15) == 0) reinterpret_cast<float*>(row + size_t(H) * 2)[j / 16] = scale;
    }
  }
}

// Expert ids of one numbering round (tokens [t0, t0 + nt)), kIdRegs per thread;
// -1 where the id is not a valid expert.
__device__ __forceinline__ void loadIdRound(const LLDispatchParams& p, int t0, int nt, long long (&ids)[kIdRegs]) {
  const size_t first = size_t(t0) * p.num_topk;
  const int n = nt * p.num_topk;
#pragma unroll
  for (int q = 0; q < kIdRegs; q++) {
    const int i = q * kThreads + threadIdx.x;
    ids[q] = i < n ? topkLoad(p.topk, p.idx64, first + i) : -1;
  }
}

// Numbering block `nb` of `G`: for experts e = nb + b * G, numbers the
// tokens that chose e in token order — the receiver's slot order within a
// source, as the host backend; a token that lists e more than once has one
// number, written into each of those entries — and sends the count to e's
// rank. `first_ids` holds the first round's ids (loaded at kernel start).
__device__ __forceinline__ void numberPairs(const LLDispatchParams& p, int set, int nb, int G,
                                            const long long (&first_ids)[kIdRegs]) {
  const LLView& v = p.v;
  const int K = p.num_topk, T = p.num_tokens, E = v.num_experts, L = v.local_experts;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ int s_ids[kIdStage];
  __shared__ int s_run[kBlockExperts];
  const int tok_per_round = kIdStage / K;
  for (int first = nb; first < E; first += G * kBlockExperts) {
    const int nbe = min(kBlockExperts, (E - first + G - 1) / G);
    __syncthreads();  // s_run / s_ids of the previous batch are no longer read
    if (threadIdx.x < nbe) s_run[threadIdx.x] = 0;
    for (int t0 = 0; t0 < T; t0 += tok_per_round) {
      const int nt = min(tok_per_round, T - t0);
      long long ids[kIdRegs];
      if (first == nb && t0 == 0) {
#pragma unroll
        for (int q = 0; q < kIdRegs; q++) ids[q] = first_ids[q];
      } else {
        loadIdRound(p, t0, nt, ids);
      }
      __syncthreads();
#pragma unroll
      for (int q = 0; q < kIdRegs; q++) {
        const int i = q * kThreads + threadIdx.x;
        if (i < nt * K) s_ids[i] = (ids[q] < 0 || ids[q] >= E) ? -1 : int(ids[q]);
      }
      __syncthreads();
      for (int b = warp; b < nbe; b += kWarps) {
        const int e = first + b * G, r = e / L;
        if (llIsDead(v, r)) continue;  // masked (llDeadRanks): no number, its count stays 0 and is not sent
        int run = s_run[b];
        for (int c = 0; c < nt; c += 32) {
          const int tl = c + lane;
          // One number per token, however often e is in its top-k (the
          // receiver's expert has room for one row per (source, token)).
          int n = 0;
          if (tl < nt)
            for (int k = 0; k < K; k++) n |= s_ids[tl * K + k] == e;
          const int incl = warpInclusiveSum(n);
          if (n) {
            const int number = run + incl - 1;
            int32_t* slots = llSlots(v, llRecord(v, r, set, v.rank, t0 + tl));
            for (int k = 0; k < K; k++)
              if (s_ids[tl * K + k] == e) slots[k] = number;
          }
          run += __shfl_sync(0xffffffffu, incl, 31);
        }
        __syncwarp();  // every lane's read of s_run[b] is ordered before the write (racecheck)
        if (lane == 0) s_run[b] = run;
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < nbe; b += kThreads) {
      const int e = first + b * G;
      if (!llIsDead(v, e / L)) llCounts(v, e / L, set)[v.rank * L + e % L] = s_run[b];  // 0 for a removed rank
    }
  }
}

// Blocks that number (the others send rows; with fewer than 4 blocks every
// block does both): enough for one expert per warp, at most half the grid.
__device__ __forceinline__ int numberingBlocks(const LLView& v) {
  const int G = gridDim.x;
  if (G < 4) return 0;
  return min((v.num_experts + kWarps - 1) / kWarps, G / 2);
}

// A send half's part of pair in this block: the buffer set, the records'
// tag (the low 32 bits of pair + 1), how many blocks number (NB, 0: every
// block numbers and sends rows) and which of the two this block does.
struct SendRoles {
  int set;
  uint32_t tag;
  int NB;
  bool numbers, rows;
};
__device__ __forceinline__ SendRoles sendRoles(const LLView& v, uint64_t pair) {
  const int NB = numberingBlocks(v), b = blockIdx.x;
  return {int(pair & 1u), uint32_t(pair + 1), NB, NB == 0 || b < NB, NB == 0 || b >= NB};
}

// What both send halves (this file's and the row slices' of
// ll_dispatch_small.cu) do once their first loads are issued: wait until
// every peer finished its combine send of pair - 2 (it used this set); block
// 0 announces this rank's tokens (the ntok word at every rank, the handle's
// pair and count); the numbering blocks number. NB, numbers: as the caller
// split the grid (numberingBlocks).
__device__ __forceinline__ void sendStart(const LLDispatchParams& p, uint64_t pair, int NB, bool numbers,
                                          const long long (&first_ids)[kIdRegs]) {
  const LLView& v = p.v;
  const int set = int(pair & 1u);
  if (pair >= 2) llWaitAll(v, kLLCombineSent, set, llTarget(pair - 2), kLLWhatFree);
  if (blockIdx.x == 0) {
    if (threadIdx.x < v.nranks)
      llAnnounce(p, set, threadIdx.x, llNtokWord(uint32_t(pair + 1), p.num_tokens, p.fp8),
                 [](uint64_t* w, uint64_t word) { *w = word; });
    if (threadIdx.x == 0) {
      p.hd->pair = pair;
      p.hd->num_tokens = p.num_tokens;
    }
  }
  if (numbers) {
    numberPairs(p, set, blockIdx.x, NB == 0 ? int(gridDim.x) : NB, first_ids);
    llMark(v, pair, kLLKindDispatch, 0);  // numbers and counts stored
  }
}

// The end of both send halves once the block's rows are stored: the
// dispatch signal, then the pair counter (llBumpPair).
__device__ __forceinline__ void sendEnd(const LLView& v, uint64_t pair) {
  llMark(v, pair, kLLKindDispatch, 1);  // rows stored
  llSignal(v, kLLDispatchSent, int(pair & 1u));
  llMark(v, pair, kLLKindDispatch, 2);  // signalled (the release waited for the stores)
  llBumpPair(v, pair);
}

// The send half; `pair` was read from v.local->pairs at kernel start (it is
// bumped once every block has counted this phase, after every block read it).
// The numbering and the rows run in different blocks, side by side (measured:
// in the same blocks, one after the other, the numbering added ~3 us at 128
// tokens).
template <bool kSingles>
__device__ __forceinline__ void dispatchSendPhase(const LLDispatchParams& p, uint64_t pair) {
  const LLView& v = p.v;
  const auto [set, tag, NB, numbers, rows] = sendRoles(v, pair);
  int lo = 0, hi = 0;
  if (rows) llShare(p.num_tokens, int(blockIdx.x) - NB, int(gridDim.x) - NB, lo, hi);  // NB == 0: every block
  // Loads first: the first token group, or the first numbering round.
  TokenLoads tl;
  if (hi > lo) loadTokens(p, lo, min(kTokGroup, hi - lo), tl);
  long long first_ids[kIdRegs];
  if (numbers) loadIdRound(p, 0, min(kIdStage / p.num_topk, p.num_tokens), first_ids);
  sendStart(p, pair, NB, numbers, first_ids);
  __shared__ unsigned s_mask[kTokGroup];
  for (int t0 = lo; t0 < hi; t0 += kTokGroup) {
    const int n = min(kTokGroup, hi - t0);
    __syncthreads();  // the wait above; s_mask of the previous group is no longer read
    if (t0 != lo) loadTokens(p, t0, n, tl);
    writeHeaders<kSingles>(p, set, tag, t0, n, tl, s_mask);
    __syncthreads();
    // One copy of the (large, unrolled) store code: the first round's pieces
    // were loaded with the group's ids, the later rounds load theirs here.
    for (int base = 0; base < n * piecesPerToken(p); base += kThreads * kInFlight) {
      if (base != 0) loadRowPieces(p, t0, n, base, tl.raw);
      storeRowPieces(p, set, t0, n, base, tl.raw, s_mask);
    }
  }
  sendEnd(v, pair);
}

}  // namespace
}  // namespace cuda
}  // namespace ep
