// Low-latency combine kernels (see ll_common.h for who writes what).
//
// Send: every block takes a contiguous share of the arrived (source, token)
// records (fewer records than blocks, e.g. one token: a slice of one
// record's units, llSliceShare); a warp per record lists the rows of y of
// this rank's experts the token chose (k order) with their weights; then all
// threads form the weighted sums, 8 values per unit, with fused multiply-adds
// into float32 in k order (exactly as the host backend), and store them into
// the home rank's combine landing: one row per (token, rank), whatever the
// number of experts. With more than two ranks (kSingles), a rank that holds
// only one of the token's experts sends that expert's BF16 row and its weight
// instead (half the bytes; at EP8, top-8 of 288, most (token, rank) pairs):
// the home rank forms fmaf(w, y, 0) itself, the same float32 value.
// Receive: the (token, 8 values) units of this rank's tokens are spread over
// all threads; each sums the partial rows of the ranks the token went to, in
// ascending rank order, and rounds to BF16.
#include "ll_device.cuh"
#include "preload.cuh"

namespace ep {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRecGroup = 32;  // records a block describes in shared memory at once
constexpr int kUnits = 2;      // units per thread per step (up to 4 rows of y each in flight)
// Receive: partial-row pieces (units x ranks) per thread per step, at least
// one unit. Measured at two ranks, 128 tokens: 4 (two units) -0.1 to -0.7 us
// against 8 (four units), 16 +0.2-0.6 us.
constexpr int kRecvRows = 4;

constexpr int kHdrPerWarp = kRecGroup / kWarps;

// Header fields of a record group (warp per record), loaded together.
struct RecordLoads {
  LLHeader h[kHdrPerWarp];  // slot field: the absolute slot the dispatch receive wrote
  float w[kHdrPerWarp];
};

// The send's record order: the flat (source, token) order rotated to begin
// after this rank's own records, so that the records whose sums cross the
// link come first and go to the blocks that start first (block b's share is
// contiguous in this order); the own records, local stores, come last.
__device__ __forceinline__ int sendOrder(const LLView& v, const int* src_base, int c) {
  const int n = src_base[v.nranks], c2 = c + src_base[v.rank + 1];
  return c2 >= n ? c2 - n : c2;
}

__device__ __forceinline__ void loadRecords(const LLView& v, int set, const int* src_base, int c0, int n,
                                            RecordLoads& rl) {
  const auto order = [&](int c) { return sendOrder(v, src_base, c); };
  llLoadHeaders(v, set, src_base, c0, n, kWarps, order, rl.h, rl.w);
}

template <bool kSingles>
__device__ __forceinline__ void combineSendPhase(const LLCombineParams& p) {
  const LLView& v = p.v;
  const int R = v.nranks, me = v.rank, H = v.hidden, L = v.local_experts;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The pair and where each source's records start, as the dispatch left them.
  // The pair is read again here (and in combineRecvUnits) although llEnter
  // read it: passing llEnter's value down measured +0.3 us on the 128-token
  // combine (docs/BENCHMARKS.md, 2026-12-01, the deferred mends).
  __shared__ int src_base[kMaxRanks + 1];
  __shared__ uint64_t s_pair;
  if (threadIdx.x <= R) src_base[threadIdx.x] = p.hd->src_base[threadIdx.x];
  if (threadIdx.x == 0) s_pair = p.hd->pair;
  __syncthreads();
  const uint64_t pair = s_pair;
  const int set = int(pair & 1u);
  const uint32_t tag = uint32_t(pair + 1);  // record tags: the low 32 bits
  const size_t cap = size_t(R) * v.max_tokens;
  const int pieces = H / 8;
  __shared__ int s_n[kRecGroup];
  __shared__ int s_row[kRecGroup][32];  // local expert * cap + slot
  __shared__ float s_w[kRecGroup][32];
  __shared__ float* s_dst[kRecGroup];
  // Fewer records than blocks: each record's units are cut into slices over
  // several blocks (llSliceShare), one step per block at one token.
  const LLSliceShare sh =
      llSliceShare(src_base[R], pieces, int(blockIdx.x), int(gridDim.x), kThreads * kUnits, 1);
  const int lo = sh.lo, hi = sh.hi;           // records [lo, hi)
  const int plo = sh.plo, width = sh.width;  // units [plo, plo + width) of each
  RecordLoads rl;
  if (hi > lo) loadRecords(v, set, src_base, lo, min(kRecGroup, hi - lo), rl);
  // Pair - 2 used this set: every home rank must have read its rows of it.
  if (pair >= 2) llWaitAll(v, kLLCombineRead, set, llTarget(pair - 2), kLLWhatFree);
  for (int c0 = lo; c0 < hi; c0 += kRecGroup) {
    const int n = min(kRecGroup, hi - c0);
    __syncthreads();  // the wait; the previous group's descriptions are no longer read
    if (c0 == lo) llMark(v, pair, kLLKindCombine, 0);  // first headers loaded, set free
    if (c0 != lo) loadRecords(v, set, src_base, c0, n, rl);
#pragma unroll
    for (int m = 0; m < kHdrPerWarp; m++) {  // warp per record: this rank's experts of the token, k ascending
      const int i = warp + m * kWarps;
      if (i >= n) break;
      int le = -1;
      if (rl.h[m].tag == tag && lane < rl.h[m].k) {
        le = rl.h[m].id - v.first_expert;
        if (le >= L) le = -1;
      }
      const unsigned local = __ballot_sync(0xffffffffu, le >= 0);
      if (le >= 0) {
        const int idx = __popc(local & ((1u << lane) - 1u));
        s_row[i][idx] = int(le * cap) + rl.h[m].slot;
        s_w[i][idx] = rl.w[m];
      }
      if (lane == 0) {
        const int c = sendOrder(v, src_base, c0 + i), s = llSourceOf(src_base, c);
        s_n[i] = __popc(local);
        s_dst[i] = llCombineRow(v, s, set, me, c - src_base[s]);
      }
    }
    __syncthreads();
    if (c0 == lo) llMark(v, pair, kLLKindCombine, 1);  // rows of the first group listed
    const int total = n * width;
    for (int base = 0; base < total; base += kThreads * kUnits) {
      int i[kUnits], j[kUnits], nk[kUnits];
      float acc[kUnits][8];
      int most = 0;
#pragma unroll
      for (int u = 0; u < kUnits; u++) {
        const int unit = base + u * kThreads + threadIdx.x;
        i[u] = unit / width;
        j[u] = plo + unit - i[u] * width;
        nk[u] = unit < total ? s_n[i[u]] : 0;
        most = max(most, nk[u]);
#pragma unroll
        for (int q = 0; q < 8; q++) acc[u][q] = 0.0f;
      }
      int4 raw[kUnits][4];  // a one-expert unit's row stays in raw[u][0] (kSingles)
      for (int k0 = 0; k0 < most; k0 += 4) {  // up to 4 rows per unit in flight, summed in k order
#pragma unroll
        for (int u = 0; u < kUnits; u++)
#pragma unroll
          for (int k = 0; k < 4; k++)
            if (k0 + k < nk[u])
              raw[u][k] = ldNc(reinterpret_cast<const int4*>(p.y + size_t(s_row[i[u]][k0 + k]) * H) + j[u]);
#pragma unroll
        for (int u = 0; u < kUnits; u++)
#pragma unroll
          for (int k = 0; k < 4; k++) {
            if (k0 + k >= nk[u]) break;
            const float w = s_w[i[u]][k0 + k];
            const uint32_t words[4] = {uint32_t(raw[u][k].x), uint32_t(raw[u][k].y), uint32_t(raw[u][k].z),
                                       uint32_t(raw[u][k].w)};
#pragma unroll
            for (int q = 0; q < 4; q++) {
              acc[u][2 * q] = fmaf(w, bf16ToFloat(words[q] & 0xffffu), acc[u][2 * q]);
              acc[u][2 * q + 1] = fmaf(w, bf16ToFloat(words[q] >> 16), acc[u][2 * q + 1]);
            }
          }
      }
#pragma unroll
      for (int u = 0; u < kUnits; u++) {
        if (nk[u] == 0) continue;
        if (kSingles && nk[u] == 1) {
          char* row = reinterpret_cast<char*>(s_dst[i[u]]);
          reinterpret_cast<int4*>(row + kLLSingleRowHead)[j[u]] = raw[u][0];
          if (j[u] == 0) *reinterpret_cast<float*>(row) = s_w[i[u]][0];
          continue;
        }
        float4* dst = reinterpret_cast<float4*>(s_dst[i[u]] + size_t(j[u]) * 8);
        dst[0] = make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
        dst[1] = make_float4(acc[u][4], acc[u][5], acc[u][6], acc[u][7]);
      }
    }
  }
  llMark(v, pair, kLLKindCombine, 2);  // partial sums stored
  llSignal(v, kLLCombineSent, set);
  llMark(v, pair, kLLKindCombine, 3);  // signalled
}

// Marks 4-6 of `kind`: arrived, sums written, signalled.
// kSingles: the rows of ranks in the token's singles mask are BF16 with their
// weight (see combineSendPhase); each adds fmaf(w, y, 0) in its rank's turn.
// Each thread takes U = max(1, kRecvRows / MR) (token, 8 values) units per step,
// strided by the grid, and issues the loads of all their partial rows (MR
// ranks at most) before it adds any: one memory round trip per step instead
// of one per unit, in a fixed number of registers whatever the rank count.
template <int MR, bool kSingles>
__device__ __forceinline__ void combineRecvUnits(const LLCombineParams& p, LLKernelKind kind) {
  const LLView& v = p.v;
  const int R = v.nranks, me = v.rank, H = v.hidden;
  const uint64_t pair = p.hd->pair;
  const int set = int(pair & 1u);
  const int pieces = H / 8;
  const int total = p.hd->num_tokens * pieces;
  const int stride = gridDim.x * kThreads;
  constexpr int U = kRecvRows / MR > 0 ? kRecvRows / MR : 1;
  static_assert(U >= 1 && MR <= kMaxRanks, "receive step shape");
  int unit = blockIdx.x * kThreads + threadIdx.x;
  unsigned mask[U];  // destination ranks of each unit's token (0: no unit)
  unsigned single[U];  // those of them that sent a BF16 row (kSingles)
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int un = unit + u * stride;
    mask[u] = un < total ? p.hd->mask[un / pieces] : 0u;  // loaded before the wait
    single[u] = kSingles && un < total ? llSingles(v, p.hd)[un / pieces] : 0u;
  }
  llWaitAll(v, kLLCombineSent, set, llTarget(pair), kLLWhatCombine);
  __syncthreads();
  llMark(v, pair, kind, 4);
  for (; unit < total; unit += U * stride) {
    int4 a[U][MR], b[U][MR];
#pragma unroll
    for (int u = 0; u < U; u++) {  // every partial row of every unit in flight at once
      const int un = unit + u * stride, t = un / pieces, j = un - t * pieces;
#pragma unroll
      for (int r = 0; r < MR; r++) {
        if (r < R && (mask[u] & (1u << r))) {
          if (kSingles && (single[u] & (1u << r))) {  // the weight in a, the 8 BF16 values in b
            const char* row = reinterpret_cast<const char*>(llCombineRow(v, me, set, r, t));
            a[u][r] = ldStaged(reinterpret_cast<const int4*>(row));
            b[u][r] = ldStaged(reinterpret_cast<const int4*>(row + kLLSingleRowHead) + j);
            continue;
          }
          const int4* src = reinterpret_cast<const int4*>(llCombineRow(v, me, set, r, t) + size_t(j) * 8);
          a[u][r] = ldStaged(src);
          b[u][r] = ldStaged(src + 1);
        }
      }
    }
    unsigned next[U], next_single[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int un = unit + (U + u) * stride;
      next[u] = un < total ? p.hd->mask[un / pieces] : 0u;
      next_single[u] = kSingles && un < total ? llSingles(v, p.hd)[un / pieces] : 0u;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int un = unit + u * stride, t = un / pieces, j = un - t * pieces;
      if (un >= total) break;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int r = 0; r < MR; r++) {  // ascending rank order, as the host
        if (!(r < R && (mask[u] & (1u << r)))) continue;
        if (kSingles && (single[u] & (1u << r))) {
          const float w = __int_as_float(a[u][r].x);
          const uint32_t words[4] = {uint32_t(b[u][r].x), uint32_t(b[u][r].y), uint32_t(b[u][r].z),
                                     uint32_t(b[u][r].w)};
#pragma unroll
          for (int q = 0; q < 4; q++) {
            acc[2 * q] += fmaf(w, bf16ToFloat(words[q] & 0xffffu), 0.0f);
            acc[2 * q + 1] += fmaf(w, bf16ToFloat(words[q] >> 16), 0.0f);
          }
          continue;
        }
        acc[0] += __int_as_float(a[u][r].x);
        acc[1] += __int_as_float(a[u][r].y);
        acc[2] += __int_as_float(a[u][r].z);
        acc[3] += __int_as_float(a[u][r].w);
        acc[4] += __int_as_float(b[u][r].x);
        acc[5] += __int_as_float(b[u][r].y);
        acc[6] += __int_as_float(b[u][r].z);
        acc[7] += __int_as_float(b[u][r].w);
      }
      uint4 packed;
      packed.x = floatToBf16(acc[0]) | (floatToBf16(acc[1]) << 16);
      packed.y = floatToBf16(acc[2]) | (floatToBf16(acc[3]) << 16);
      packed.z = floatToBf16(acc[4]) | (floatToBf16(acc[5]) << 16);
      packed.w = floatToBf16(acc[6]) | (floatToBf16(acc[7]) << 16);
      reinterpret_cast<uint4*>(p.out + size_t(t) * H)[j] = packed;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      mask[u] = next[u];
      single[u] = next_single[u];
    }
  }
  llMark(v, pair, kind, 5);
  llSignal(v, kLLCombineRead, set);
  llMark(v, pair, kind, 6);
}

template <bool kSingles>
__global__ void __launch_bounds__(kThreads, 1) llCombineSendKernel(LLCombineParams p) {
  const uint64_t pair = llEnter(p.v, &p.hd->pair, kLLKindCombine);
  combineSendPhase<kSingles>(p);
  llTimeEnd(p.v, pair, kLLKindCombine);
}

// MR: the most ranks the kernel sums (2: two units per thread per step; 8:
// one). One instance per kernel, the host picks by the rank count: a kernel
// holding both would run one and carry the other's code. kSingles (more than
// two ranks): BF16 rows from ranks that hold one of a token's experts.
template <int MR, bool kSingles>
__global__ void __launch_bounds__(kThreads, 1) llCombineRecvKernel(LLCombineParams p) {
  const uint64_t pair = llEnter(p.v, &p.hd->pair, kLLKindCombineRecv);
  combineRecvUnits<MR, kSingles>(p, kLLKindCombineRecv);
  llTimeEnd(p.v, pair, kLLKindCombineRecv);
}

// Both halves in one launch; at most one block per SM (see llDispatchKernel).
template <int MR, bool kSingles>
__global__ void __launch_bounds__(kThreads, 1) llCombineKernel(LLCombineParams p) {
  const uint64_t pair = llEnter(p.v, &p.hd->pair, kLLKindCombine);
  combineSendPhase<kSingles>(p);
  combineRecvUnits<MR, kSingles>(p, kLLKindCombine);
  llTimeEnd(p.v, pair, kLLKindCombine);
}

}  // namespace

namespace EP_LL_VARIANT {

int launchLLCombineSend(const LLCombineParams& p, const LLLaunch& l) {
  return llUsesSingles(p.v) ? llLaunch(llCombineSendKernel<true>, p, kThreads, l)
                         : llLaunch(llCombineSendKernel<false>, p, kThreads, l);
}

// The receive with several units in flight (MR = 2) only where it has them:
// two ranks at most, and more units than the grid has threads. Measured on
// 2 x H200 at hidden 7168: 128 tokens -0.5 to -0.6 us with four units (two are
// better still, see kRecvRows), but one token (one unit per thread or none)
// +0.3 us, so small calls keep the one-unit kernel.
static bool llCombinePipelined(const LLCombineParams& p, int sms, int tokens) {
  return p.v.nranks <= 2 && (long long)tokens * (p.v.hidden / 8) > (long long)llGrid(sms) * kThreads;
}

int launchLLCombine(const LLCombineParams& p, const LLLaunch& l, int tokens) {
  if (llUsesSingles(p.v)) return llLaunch(llCombineKernel<kMaxRanks, true>, p, kThreads, l);
  return llCombinePipelined(p, l.sms, tokens) ? llLaunch(llCombineKernel<2, false>, p, kThreads, l)
                                            : llLaunch(llCombineKernel<kMaxRanks, false>, p, kThreads, l);
}

int launchLLCombineRecv(const LLCombineParams& p, const LLLaunch& l, int tokens) {
  if (llUsesSingles(p.v)) return llLaunch(llCombineRecvKernel<kMaxRanks, true>, p, kThreads, l);
  return llCombinePipelined(p, l.sms, tokens) ? llLaunch(llCombineRecvKernel<2, false>, p, kThreads, l)
                                            : llLaunch(llCombineRecvKernel<kMaxRanks, false>, p, kThreads, l);
}

int preloadLLCombineKernels() {
  return preloadKernels(llCombineSendKernel<true>, llCombineSendKernel<false>, llCombineKernel<kMaxRanks, true>,
                        llCombineKernel<2, false>, llCombineKernel<kMaxRanks, false>,
                        llCombineRecvKernel<kMaxRanks, true>, llCombineRecvKernel<2, false>,
                        llCombineRecvKernel<kMaxRanks, false>);
}

}  // namespace EP_LL_VARIANT

}  // namespace cuda
}  // namespace ep
