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
#pragma once

#include <cuda_fp8.h>

#include "fp8_soft.h"
#include "ll_device.cuh"
#include "ll_flagged.cuh"

namespace ep {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// 16-byte loads in flight per thread. The receive loops unrolled over them
// leave at the first unit past the end (units grow with u): a check per
// iteration jumps over every later iteration's code, an instruction-cache
// miss each (profiled: a third of the receive kernel's warp stalls, more at
// one token). The send loops keep their checks: breaks there made the
// 128-token send half 0.3-0.6 us slower (one token 0.7-1.2 us faster), though
// later A/Bs found that send half bimodal and moved by unrelated changes
// (docs/BENCHMARKS.md), so that cost may not be the breaks' own.
constexpr int kInFlight = 8;
constexpr int kTokGroup = 32;           // tokens a sending block describes in shared memory at once
constexpr int kIdStage = 2048;          // expert ids staged per round for the numbering
constexpr int kBlockExperts = 64;       // experts a block numbers per batch
constexpr int kRecGroup = 32;           // records a receiving block describes in shared memory at once

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

constexpr int kHdrPerWarp = kTokGroup / kWarps;  // tokens (or records) a warp describes per group
constexpr int kIdRegs = kIdStage / kThreads;       // staged ids per thread per round
constexpr int kStagedBases = 4096;                 // slot bases a receiving block keeps in shared memory

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
  const unsigned mask = __reduce_or_sync(0xffffffffu, id >= 0 ? 1u << (id / v.local_experts) : 0u);
  if (kSingles) {
    const int dest = id >= 0 ? id / v.local_experts : -1;
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

// Stores the pieces of rows [t0, t0 + n) loaded for `base` (quantised for FP8).
// Its FP8 quantisation has a twin in storeSlicePiece (ll_dispatch_small.cu):
// a shared helper changed this function's SASS and the 128-token send time
// (measured), so a change to the wire format goes into both.
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
    float f[8];
    float amax = 0.0f;
    if (active) {
      const uint32_t words[4] = {uint32_t(raw[u].x), uint32_t(raw[u].y), uint32_t(raw[u].z), uint32_t(raw[u].w)};
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
    float scale = fmaxf(amax, 1e-4f) / 448.0f;
    if (p.pow2) scale = roundScalePow2(scale);
    const float inv = 1.0f / scale;
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
      llCounts(v, e / L, set)[v.rank * L + e % L] = s_run[b];
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

// The send half; `pair` was read from v.local->pairs at kernel start (it is
// bumped once every block has counted this phase, after every block read it).
// The numbering and the rows run in different blocks, side by side (measured:
// in the same blocks, one after the other, the numbering added ~3 us at 128
// tokens).
template <bool kSingles>
__device__ __forceinline__ void dispatchSendPhase(const LLDispatchParams& p, uint64_t pair) {
  const LLView& v = p.v;
  const int set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);  // record tags: the low 32 bits
  const int NB = numberingBlocks(v), G = gridDim.x, b = blockIdx.x;
  const bool numbers = NB == 0 || b < NB;
  const bool rows = NB == 0 || b >= NB;
  int lo = 0, hi = 0;
  if (rows) llShare(p.num_tokens, b - NB, G - NB, lo, hi);  // NB == 0: every block
  // Loads first: the first token group, or the first numbering round.
  TokenLoads tl;
  if (hi > lo) loadTokens(p, lo, min(kTokGroup, hi - lo), tl);
  long long first_ids[kIdRegs];
  if (numbers) loadIdRound(p, 0, min(kIdStage / p.num_topk, p.num_tokens), first_ids);
  // Pair - 2 used this set: every peer must have finished its combine send of it.
  if (pair >= 2) llWaitAll(v, kLLCombineSent, set, llTarget(pair - 2), kLLWhatFree);
  if (b == 0) {
    if (threadIdx.x < v.nranks)
      llCtrl(v, threadIdx.x)->ntok[set][v.rank] = llNtokWord(tag, p.num_tokens, p.fp8);
    if (threadIdx.x == 0) {
      p.hd->pair = pair;
      p.hd->num_tokens = p.num_tokens;
    }
  }
  __shared__ unsigned s_mask[kTokGroup];
  if (numbers) {
    numberPairs(p, set, b, NB == 0 ? G : NB, first_ids);
    llMark(v, pair, kLLKindDispatch, 0);  // numbers and counts stored
  }
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
  llMark(v, pair, kLLKindDispatch, 1);  // rows stored
  llSignal(v, kLLDispatchSent, set);
  llMark(v, pair, kLLKindDispatch, 2);  // signalled (the release waited for the stores)
  llBumpPair(v, pair);
}

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

// ---- receive of calls with flagged sources (ll_flagged.cuh) ----

// Pieces (16 bytes) of a record row a receiving slice takes at least, and its
// alignment: 8 pieces are one FP8 scale block of 128 values.
constexpr int kRecvSliceStep = 32;
constexpr int kRecvSliceAlign = 8;

// What a receiving block keeps of the flagged sources' headers, in shared
// memory its caller lends (the receive kernels' own arrays, unused on this
// path: a kernel's shared memory size sets the L1 / shared split, and a
// split that changes between consecutive kernels costs each launch).
// Record (s, t) is entry s * tcap + t, tcap the most tokens any rank sends
// flagged (LLDispatchParams::flag_cap); a record's ids and weights take
// max_topk entries each. The engine keeps R * tcap * (1 + max_topk) within
// kLLFlagStageInts (llFlagTokensFit), which bounds both stages below.
struct FlagStage {
  int* k;    // [R * tcap]: K
  int* id;   // [R * tcap][max_topk]: expert ids as sent (-1: none)
  float* w;  // the same for the weights; null: read from the record when needed
  int* n;    // [1]: local experts of the record a block copies
  int* dst;  // [32]: their local expert * cap + slot
  int* hits; // [32] per owned expert, the flagged records naming it (dispatchRecvFlaggedPhase);
             // [64] in recvFlaggedSlice: per entry of the block's record, the records before
             // it naming its expert, then per owned expert the records naming it
  int tcap, stride;  // tokens per source, entries per record
};
// K and ids in `a` (kLLFlagStageInts ints; the whole-row receive's).
// n: n and dst (33 ints); hits: 32 ints.
__device__ __forceinline__ FlagStage flagStageKIds(const LLDispatchParams& p, int* a, int* n, int* hits) {
  const int entries = p.v.nranks * p.flag_cap;
  return FlagStage{a, a + entries, nullptr, n, n + 1, hits, p.flag_cap, p.v.max_topk};
}
// All of a FlagStage (k, id, w, n, dst, hits) in `a`, of this many ints.
constexpr int kFlagStageFull = 2 * kLLFlagStageInts + 1 + 32 + 64;
__device__ __forceinline__ FlagStage flagStageAll(const LLDispatchParams& p, int* a) {
  const int entries = p.v.nranks * p.flag_cap, ids = entries * p.v.max_topk;
  int* n = a + entries + 2 * ids;
  return FlagStage{a, a + entries, reinterpret_cast<float*>(a + entries + ids), n, n + 1, n + 33, p.flag_cap,
                   p.v.max_topk};
}
__device__ __forceinline__ int& fsK(const FlagStage& fs, int s, int t) { return fs.k[s * fs.tcap + t]; }
__device__ __forceinline__ int& fsId(const FlagStage& fs, int s, int t, int k) {
  return fs.id[(s * fs.tcap + t) * fs.stride + k];
}
__device__ __forceinline__ float& fsW(const FlagStage& fs, int s, int t, int k) {
  return fs.w[(s * fs.tcap + t) * fs.stride + k];
}

// Header word w of flagged record (s, t) into fh: w = 0 is K, then the
// max_topk ids, then the weights. After a failed poll (ok false, reported)
// the record counts as one without entries.
__device__ __forceinline__ void fsStage(const LLView& v, const FlagStage& fh, int s, int t, int w, bool ok,
                                        uint32_t val) {
  if (!ok) val = w == 0 ? 0u : ~0u;
  if (w == 0) fsK(fh, s, t) = min(int(val), v.max_topk);
  else if (w <= v.max_topk) fsId(fh, s, t, w - 1) = int(val);
  else fsW(fh, s, t, w - 1 - v.max_topk) = __uint_as_float(val);
}

// One warp, lane k for entry k of a record (le >= 0: a local expert, its
// row going to `slot`): the record's destinations, in lane order, into
// fh.dst and their number into *fh.n. Returns the lanes that have one.
__device__ __forceinline__ unsigned flagListLocal(const FlagStage& fh, int lane, int le, int cap, int slot) {
  const unsigned local = __ballot_sync(0xffffffffu, le >= 0);
  if (le >= 0) fh.dst[__popc(local & ((1u << lane) - 1u))] = le * cap + slot;
  if (lane == 0) *fh.n = __popc(local);
  return local;
}

// One warp: a flagged record's header (K, the ids, the weights, the absolute
// slots) written into the plain record `rec` of its (source, token t), where
// the combine reads it.
__device__ __forceinline__ void flagHeaderToPlain(const LLView& v, char* rec, int lane, int k, int id, float w,
                                                  int slot, int t, uint32_t tag) {
  if (lane < k) {
    llIds(v, rec)[lane] = id;
    llWeights(v, rec)[lane] = w;
    llSlots(v, rec)[lane] = slot;
  }
  if (lane == 0) {
    LLRecordHeader* hp = reinterpret_cast<LLRecordHeader*>(rec);
    hp->token = t;
    hp->num_topk = uint32_t(k);
    hp->tag = tag;
  }
}

// Tokens t' < t_end of flagged source q that chose global expert e (once each).
__device__ __forceinline__ int flagCount(const FlagStage& fh, int q, int t_end, int e) {
  int n = 0;
#pragma unroll 1
  for (int t = 0; t < t_end; t++) {
    bool has = false;
#pragma unroll 4
    for (int k = 0; k < fsK(fh, q, t); k++) has |= fsId(fh, q, t, k) == e;
    n += has;
  }
  return n;
}

// One warp: whether the ids of flagged record (s, t) name a (na) and b (nb),
// per lane. The record's ids pass every lane in shuffles, unrolled by 8
// (lanes past the record's K hold -1); a record names an expert once
// however often its top-k lists it.
__device__ __forceinline__ void flagRecordNames(const FlagStage& fh, int s, int t, int a, int b, bool& na,
                                                bool& nb) {
  const int lane = threadIdx.x & 31;
  const int k = fsK(fh, s, t);
  const int idc = lane < k ? fsId(fh, s, t, lane) : -1;
  na = nb = false;
#pragma unroll 1
  for (int q0 = 0; q0 < k; q0 += 8) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int x = __shfl_sync(0xffffffffu, idc, q0 + i);
      na |= x == a;
      nb |= x == b;
    }
  }
}

// The same for one expert e per lane.
__device__ __forceinline__ bool flagRecordNames(const FlagStage& fh, int s, int t, int e) {
  bool hit, same;
  flagRecordNames(fh, s, t, e, e, hit, same);
  return hit;
}

// One warp, every lane: per lane, the records t' < t_end of flagged source q
// whose header names expert e (lane's own; -1: none, counts 0).
__device__ __forceinline__ int flagNamedWarp(const FlagStage& fh, int q, int t_end, int e) {
  int n = 0;
#pragma unroll 1
  for (int t = 0; t < t_end; t++) n += flagRecordNames(fh, q, t, e);
  return e >= 0 ? n : 0;
}

// Rows of local expert le from source q: its count (plain source) or the
// tokens whose headers name it (flagged source).
__device__ __forceinline__ int sourceCount(const LLDispatchParams& p, const FlagStage& fh, const int32_t* counts,
                                           const int* src_base, unsigned flagged, int q, int le) {
  if (flagged >> q & 1u) return flagCount(fh, q, src_base[q + 1] - src_base[q], p.v.first_expert + le);
  return counts[q * p.v.local_experts + le];
}

// The flagged receive of a small call whose sources all sent flagged records
// and whose records fit the grid with at most one slice per block and one
// piece per thread (flaggedSliceFits): its piece, its scale and the header
// words of every record are loaded at once and only then checked for this
// pair's tag (polled where one was not there yet). A record's slot for expert
// e is the number of records before it in (source, token) order that chose
// e. Loops are kept rolled: this code runs cold (once per call) and its size
// is what it costs (docs/BENCHMARKS.md, instruction-cache misses).
__device__ __forceinline__ bool flaggedSliceFits(const LLDispatchParams& p, int N) {
  const int pieces = (p.fp8 ? p.v.hidden : p.v.hidden * 2) / 16;
  return N < int(gridDim.x) && llSlicesOf(N, pieces, gridDim.x, kRecvSliceStep, kRecvSliceAlign).chunk <= kThreads;
}

// Records (q, t') before (s, t) whose header names expert `id` (once each).
__device__ __forceinline__ int flagRecordsBefore(const FlagStage& fh, const int* src_base, int s, int t, int id) {
  int n = flagCount(fh, s, t, id);
#pragma unroll 1
  for (int q = 0; q < s; q++) n += flagCount(fh, q, src_base[q + 1] - src_base[q], id);
  return n;
}

__device__ __forceinline__ void recvFlaggedSlice(const LLDispatchParams& p, uint64_t pair, LLKernelKind kind,
                                                 const int* src_base, const FlagStage& fh) {
  const LLView& v = p.v;
  const int R = v.nranks, M = v.max_tokens, H = v.hidden, L = v.local_experts, G = gridDim.x;
  const int set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int words = 1 + 2 * v.max_topk, N = src_base[R], cap = R * M, nb = (H + 127) / 128;
  const size_t row_bytes = p.fp8 ? size_t(H) : size_t(H) * 2;
  const LLSliceShare sl = llSliceShare(N, int(row_bytes / 16), blockIdx.x, G, kRecvSliceStep, kRecvSliceAlign);
  const bool mine = sl.hi > sl.lo;
  const int src = mine ? llSourceOf(src_base, sl.lo) : 0, t = mine ? sl.lo - src_base[src] : 0;
  uint64_t* frec = llFlagRecord(v, v.rank, set, src, t);
  const bool has_piece = mine && int(threadIdx.x) < sl.width;
  const int b = sl.plo / kRecvSliceAlign + int(threadIdx.x);
  const bool has_scale =
      p.fp8 && mine && int(threadIdx.x) < (sl.width + kRecvSliceAlign - 1) / kRecvSliceAlign && b < nb;
  // Loads first: the piece, the scale, and (warp w) the first words of
  // records w and w + 8 (calls of up to 16 records load every header word
  // in one round trip where top-k is at most 15).
  const uint64_t* piece = llFlagRow(v, frec) + 4 * size_t(sl.plo + int(threadIdx.x));
  const uint64_t* scale_word = llFlagScales(v, frec) + b;
  const uint64_t none = uint64_t(tag ^ 1u) << 32;  // not this pair's: polled if used
  uint64_t w[4] = {none, none, none, none}, sw = none, hw = none, hw_next = none;
  if (has_piece) {
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[0]), "=l"(w[1]) : "l"(piece) : "memory");
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[2]), "=l"(w[3]) : "l"(piece + 2) : "memory");
  }
  if (has_scale) asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(sw) : "l"(scale_word) : "memory");
  if (threadIdx.x < 64) fh.hits[threadIdx.x] = 0;
  if (lane < words) {
    if (warp < N) {
      const int s0 = llSourceOf(src_base, warp);
      asm volatile("ld.relaxed.sys.global.u64 %0, [%1];"
                   : "=l"(hw)
                   : "l"(llFlagRecord(v, v.rank, set, s0, warp - src_base[s0]) + lane)
                   : "memory");
    }
    if (warp + kWarps < N) {
      const int s1 = llSourceOf(src_base, warp + kWarps);
      asm volatile("ld.relaxed.sys.global.u64 %0, [%1];"
                   : "=l"(hw_next)
                   : "l"(llFlagRecord(v, v.rank, set, s1, warp + kWarps - src_base[s1]) + lane)
                   : "memory");
    }
  }
  // The header words, checked, into fh (the first 32 of the warp's first two
  // records as loaded above, the others loaded here).
#pragma unroll 1
  for (int c = warp; c < N; c += kWarps) {
    const int s = llSourceOf(src_base, c), tt = c - src_base[s];
#pragma unroll 1
    for (int wi = lane; wi < words; wi += 32) {
      uint32_t val = uint32_t(hw), unused = 0;
      bool ok = true;
      if (wi != lane || uint32_t(hw >> 32) != tag)
        ok = llPollFlag(v, llFlagRecord(v, v.rank, set, s, tt) + wi, 1, tag, s, val, unused);
      fsStage(v, fh, s, tt, wi, ok, val);
    }
    hw = hw_next;
    hw_next = none;
  }
  __syncthreads();
  llMark(v, pair, kind, 5);
  // Slots and counts, every warp a share of the records: lane j of every
  // warp holds entry j of the block's own record, lane o the block's o-th
  // owned expert (e % G == block), and each record's entries pass by in
  // shuffles. A record before the own one (in (source, token) order) that
  // names entry j's expert moves that slot by one; a record naming owned
  // expert o adds one to its recv_count; each record once per expert (an
  // expert repeated in a top-k takes one row). (One warp looping over the
  // earlier records, and the other warps over all records per owned expert,
  // cost 0.4 us more at 4 tokens than at 1.)
  const int k = mine ? fsK(fh, src, t) : 0;
  const int id = lane < k ? fsId(fh, src, t, lane) : -1;
  const bool local_id = id >= v.first_expert && id < v.first_expert + L;
  const int own_le = int(blockIdx.x) + lane * G;
  const int own_id = own_le < L ? v.first_expert + own_le : -1;
#pragma unroll 1
  for (int c = warp; c < N; c += kWarps) {
    const int s = llSourceOf(src_base, c), tt = c - src_base[s];
    // flagRecordNames written out: through it this kernel's SASS differs
    // (scheduling), and this code is the one measured (docs/BENCHMARKS.md).
    const int kc = fsK(fh, s, tt);
    const int idc = lane < kc ? fsId(fh, s, tt, lane) : -1;
    bool names_id = false, names_own = false;
#pragma unroll 1
    for (int q0 = 0; q0 < kc; q0 += 8) {  // lanes past kc hold -1: never a match that counts
#pragma unroll
      for (int q = 0; q < 8; q++) {
        const int x = __shfl_sync(0xffffffffu, idc, q0 + q);
        names_id |= x == id;
        names_own |= x == own_id;
      }
    }
    if (names_id && local_id && c < sl.lo) atomicAdd(&fh.hits[lane], 1);
    if (names_own && own_id >= 0) atomicAdd(&fh.hits[32 + lane], 1);
  }
  // Owned experts past the 32nd (grids of fewer than L / 32 blocks): one thread each.
#pragma unroll 1
  for (int le = int(blockIdx.x) + (32 + int(threadIdx.x)) * G; le < L; le += kThreads * G)
    p.recv_count[le] = flagRecordsBefore(fh, src_base, R, 0, v.first_expert + le);
  __syncthreads();
  if (warp == 0) {
    const int le = local_id ? id - v.first_expert : -1;
    const int slot = local_id ? fh.hits[lane] : 0;
    if (local_id && sl.plo == 0 && p.recv_src) p.recv_src[size_t(le) * cap + slot] = src * M + t;
    const unsigned local = flagListLocal(fh, lane, le, cap, slot);
    if (sl.plo == 0 && local != 0)  // the header in the plain layout, for the combine
      flagHeaderToPlain(v, llRecord(v, v.rank, set, src, t), lane, k, id, lane < k ? fsW(fh, src, t, lane) : 0.0f,
                        slot, t, tag);
  } else if (warp == 1 && own_id >= 0) {
    p.recv_count[own_le] = fh.hits[32 + lane];
  }
  __syncthreads();
  llMark(v, pair, kind, 6);
  const int n = *fh.n;
  if (n > 0 && has_piece) {  // a flagged row comes only to the ranks the token chose
    const int4 raw = llFlagPieceCheck(v, piece, w, tag, src);
#pragma unroll 1
    for (int q = 0; q < n; q++)
      reinterpret_cast<int4*>(p.recv_x + size_t(fh.dst[q]) * row_bytes)[sl.plo + threadIdx.x] = raw;
  }
  if (n > 0 && has_scale) {
    uint32_t bits = uint32_t(sw), unused;
    if (uint32_t(sw >> 32) != tag) llPollFlag(v, scale_word, 1, tag, src, bits, unused);
#pragma unroll 1
    for (int q = 0; q < n; q++) {
      const int e = fh.dst[q] / cap, sd = fh.dst[q] - e * cap;
      p.recv_scales[(size_t(e) * nb + b) * cap + sd] = __uint_as_float(bits);
    }
  }
  llMark(v, pair, kind, 7);
}

// The receive half of a call in which at least one source sent flagged
// records (bit s of `flagged`; src_base: where each source's records start).
// Plain sources were waited for by the caller (their signal orders their
// records and counts). A record's slot for local expert e is, as everywhere,
// the rows of e from earlier sources plus the record's number among its
// source's tokens that chose e; for a flagged source both come from its
// headers, which every block stages. Records are cut into slices over blocks
// only when every source is flagged: a plain record's slot field holds the
// sender's numbers until its block writes the absolute slots over them for
// the combine, which with several slices per record would race. A flagged
// record's header is written out in the plain layout (tag, token, K, ids,
// weights, slots) for the combine. Not inlined: the plain receive keeps its
// code, and this runs only for calls with a flagged source. Marks 4-7 of
// `kind` as dispatchRecvPhase's (5: headers staged).
__device__ __noinline__ void dispatchRecvFlaggedPhase(const LLDispatchParams& p, uint64_t pair, LLKernelKind kind,
                                                      const int* src_base, unsigned flagged, FlagStage fh) {
  const LLView& v = p.v;
  const int R = v.nranks, M = v.max_tokens, H = v.hidden, L = v.local_experts, G = gridDim.x;
  const int set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int words = 1 + 2 * v.max_topk;  // header words of a flagged record
  llMark(v, pair, kind, 4);
  const unsigned all = R >= 32 ? ~0u : (1u << R) - 1u;
  const int N = src_base[R];
  const size_t row_bytes = p.fp8 ? size_t(H) : size_t(H) * 2;
  const int pieces = int(row_bytes / 16);
  const int32_t* counts = llCounts(v, v.rank, set);
  // recv_count of the experts this block owns (e % G == block): lane o of
  // warp 0 owns the o-th; the plain sources' counts loaded now (in since the
  // caller's wait), the flagged sources' records counted after the staging.
  const int own_le = int(blockIdx.x) + lane * G;
  int own_plain = 0;
  if (warp == 0 && own_le < L) {
#pragma unroll
    for (int q = 0; q < kMaxRanks; q++)
      if (q < R && !(flagged >> q & 1u)) own_plain += counts[q * L + own_le];
  }
  if (threadIdx.x < 32) fh.hits[threadIdx.x] = 0;
  const int cap = R * M, nb = (H + 127) / 128;
  LLSliceShare sl{0, 0, 0, pieces};
  if ((flagged & all) == all) sl = llSliceShare(N, pieces, blockIdx.x, G, kRecvSliceStep, kRecvSliceAlign);
  else llShare(N, blockIdx.x, G, sl.lo, sl.hi);
  for (int s = 0; s < R; s++) {
    if (!(flagged >> s & 1u)) continue;
    const int staged = fh.w != nullptr ? words : 1 + v.max_topk;  // without room for weights: K and ids
    const int n = (src_base[s + 1] - src_base[s]) * staged;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const int t = i / staged, w = i - t * staged;
      uint32_t a = 0, unused = 0;
      const bool ok = llPollFlag(v, llFlagRecord(v, v.rank, set, s, t) + w, 1, tag, s, a, unused);
      fsStage(v, fh, s, t, w, ok, a);
    }
  }
  __syncthreads();
  llMark(v, pair, kind, 5);
  // The flagged records naming each owned expert: every warp a share of
  // them, each record's ids shuffled past every lane (as recvFlaggedSlice).
  {
    const int own_id = own_le < L ? v.first_expert + own_le : -1;
#pragma unroll 1
    for (int s = 0; s < R; s++) {
      if (!(flagged >> s & 1u)) continue;
#pragma unroll 1
      for (int t = warp; t < src_base[s + 1] - src_base[s]; t += kWarps)
        if (flagRecordNames(fh, s, t, own_id) && own_id >= 0) atomicAdd(&fh.hits[lane], 1);
    }
  }
  __syncthreads();  // the counts are complete before any record's barrier (a block may have none)
  for (int c = sl.lo; c < sl.hi; c++) {
    const int s = llSourceOf(src_base, c), t = c - src_base[s];
    const bool fl = flagged >> s & 1u;
    char* rec = llRecord(v, v.rank, set, s, t);
    if (warp == 0) {
      int k = 0, id = -1, number = 0;
      float w = 0.0f;
      if (fl) {
        k = fsK(fh, s, t);
        if (lane < k) {
          id = fsId(fh, s, t, lane);
          if (fh.w != nullptr) {
            w = fsW(fh, s, t, lane);
          } else {
            uint32_t bits = 0, unused;
            llPollFlag(v, llFlagRecord(v, v.rank, set, s, t) + 1 + v.max_topk + lane, 1, tag, s, bits, unused);
            w = __uint_as_float(bits);
          }
        }
      } else {
        LLHeader h;
        llLoadHeader(v, rec, lane, h);
        k = h.tag == tag ? h.k : 0;
        if (lane < k) {
          id = h.id;
          number = h.slot;
        }
      }
      int le = lane < k ? id - v.first_expert : -1;
      if (le >= L) le = -1;
      // Slot: the rows of le from earlier sources (plain: their counts, the
      // loads issued first; flagged: their records naming it, warp-wide)
      // plus the record's number (plain: the sender's; flagged: its
      // source's records before it naming le).
      int before[kMaxRanks];
#pragma unroll
      for (int q = 0; q < kMaxRanks; q++)
        before[q] = q < s && le >= 0 && !(flagged >> q & 1u) ? counts[q * L + le] : 0;
      int slot = number;
#pragma unroll 1
      for (int q = 0; q <= s; q++)
        if (flagged >> q & 1u)
          slot += flagNamedWarp(fh, q, q == s ? t : src_base[q + 1] - src_base[q], le >= 0 ? id : -1);
#pragma unroll
      for (int q = 0; q < kMaxRanks; q++) slot += before[q];
      if (le >= 0 && sl.plo == 0 && p.recv_src) p.recv_src[size_t(le) * cap + slot] = s * M + t;
      const unsigned local = flagListLocal(fh, lane, le, cap, slot);
      if (fl && sl.plo == 0 && local != 0) {  // the header in the plain layout, for the combine
        flagHeaderToPlain(v, rec, lane, k, id, w, slot, t, tag);
      } else if (!fl && le >= 0) {
        llSlots(v, rec)[lane] = slot;  // absolute, for combine (a plain record is never sliced)
      }
    }
    __syncthreads();
    const int n = *fh.n;
    if (n > 0) {  // a flagged row comes only to the ranks the token chose
      uint64_t* frow = fl ? llFlagRow(v, llFlagRecord(v, v.rank, set, s, t)) : nullptr;
      for (int j = sl.plo + threadIdx.x; j < sl.plo + sl.width; j += kThreads) {
        int4 raw;
        if (fl) {
          raw = llFlagPiece(v, frow, j, tag, s);
        } else {
          raw = ldStaged(reinterpret_cast<const int4*>(rec + v.hdr_bytes) + j);
        }
        for (int d = 0; d < n; d++) reinterpret_cast<int4*>(p.recv_x + size_t(fh.dst[d]) * row_bytes)[j] = raw;
      }
      if (p.fp8) {
        const int b0 = sl.plo / kRecvSliceAlign, b1 = min(nb, (sl.plo + sl.width + kRecvSliceAlign - 1) / kRecvSliceAlign);
        for (int b = b0 + threadIdx.x; b < b1; b += kThreads) {
          uint32_t bits = 0, unused;
          if (fl) llPollFlag(v, llFlagScales(v, llFlagRecord(v, v.rank, set, s, t)) + b, 1, tag, s, bits, unused);
          else bits = __float_as_uint(reinterpret_cast<const float*>(rec + v.hdr_bytes + size_t(H) * 2)[b]);
          for (int d = 0; d < n; d++) {
            const int e = fh.dst[d] / cap, sd = fh.dst[d] - e * cap;
            p.recv_scales[(size_t(e) * nb + b) * cap + sd] = __uint_as_float(bits);
          }
        }
      }
    }
    __syncthreads();  // s_dst of this record is no longer read
  }
  llMark(v, pair, kind, 6);
  if (warp == 0 && own_le < L) p.recv_count[own_le] = own_plain + fh.hits[lane];
  // Owned experts past the 32nd (grids of fewer than L / 32 blocks): one thread each.
  for (int le = int(blockIdx.x) + (32 + int(threadIdx.x)) * G; le < L; le += kThreads * G) {
    int run = 0;
    for (int q = 0; q < R; q++) run += sourceCount(p, fh, counts, src_base, flagged, q, le);
    p.recv_count[le] = run;
  }
  llMark(v, pair, kind, 7);
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
    if (threadIdx.x < R) word = *reinterpret_cast<const volatile uint64_t*>(w);
    llWaitAll(v, kLLDispatchSent, set, llTarget(pair), kLLWhatDispatch);
    if (threadIdx.x < R) {
      if (uint32_t(word >> 32) != tag) word = llPollNtok(v, w, tag, threadIdx.x);
      flagged = (uint32_t(word) & kLLNtokFlagged) != 0;
    }
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
  uint64_t word = threadIdx.x < R ? *ntok_word : 0;
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
    dispatchRecvFlaggedPhase(p, pair, kind, src_base, s_flagged, flagStageKIds(p, &s_dst[0][0], s_flag_dst, s_n));
    return;
  }
  llMark(v, pair, kind, 4);
  // No slot bases staged in shared memory: a record from source s adds the
  // counts of the sources before it (s loads, none for source 0) after its
  // header arrives (EP2: receive half -0.06 us; not measured above EP2), and
  // the owned experts' recv_count is written after the copy.
  const int32_t* counts = llCounts(v, v.rank, set);
  const int cap = R * M;
  const int nb = (H + 127) / 128;
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
