// Low-latency dispatch, the receive of calls where some source sent flagged
// records (ll_flagged.cuh says what they are; ll_dispatch.cuh has the
// overview and the receive of calls whose sources are all plain).
#pragma once

#include "ll_dispatch_common.cuh"
#include "ll_flagged.cuh"

namespace ep {
namespace cuda {

namespace {

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
  const int words = 1 + 2 * v.max_topk, N = src_base[R], cap = R * M, nb = fp8ScaleBlocks(H);
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
  const int cap = R * M, nb = fp8ScaleBlocks(H);
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

}  // namespace
}  // namespace cuda
}  // namespace ep
