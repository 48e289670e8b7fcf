// Dispatch data kernel. One block per channel; channel c owns the token slice
// [T*c/C, T*(c+1)/C) of every rank.
//
// Who writes what:
//  - sender warps of rank s, channel c read x (local) and store each row once
//    per destination: to recv_x directly for s itself, else over NVLink into the
//    destination's staging slot dst_base[d] + position (final place, so the
//    receiver never reorders). Local expert ids and weights are computed here,
//    in the meta's config.max_topk columns: ranks may pass different num_topk
//    or no ids at all, so the columns past the sender's say so (kIdPastTopk,
//    kIdNoIds) and the receiver decodes them with its own num_topk.
//    After every chunk of tokens the sender warps meet at a named barrier and
//    one lane per destination publishes the rows done with st.release.sys of
//    Ctrl::dprog[s][c] at the destination (the barrier orders the other warps'
//    stores before the release, as in NCCL and DeepEP; a fence.sys here costs
//    far more).
//  - before any row, the channel's first position and row count go to
//    Ctrl::dstart / dinfo at each destination.
//  - receiver warps of rank d, channel c poll dprog[s][c] (acquire) and copy
//    finished rows from staging to recv_x / recv_scales / recv_topk_*. Each
//    warp claims its next row from a shared counter; the sender warps join
//    once their own rows are sent, so the copy of the last chunk (what is left
//    when the link goes quiet) runs on every warp of the block, not only on
//    the receivers.
// The last block adds the per-expert counts, writes num_recv and bumps the epoch.
#include <cuda_runtime.h>

#include "device.cuh"
#include "preload.cuh"

namespace ep {
namespace cuda {
namespace {

// Copies row_bytes (multiple of 16) from src to the destinations in dmask
// (warp-uniform); lane d holds destination d's pointer in my_dst. kU 16-byte
// loads per lane are in flight per pass (the copies are load-latency bound).
// Every lane runs the same number of iterations.
template <bool kStaged, int kU>
__device__ __forceinline__ void copyRow(const int4* src, int4* my_dst, unsigned dmask, int n16, int lane) {
  for (int base = 0; base < n16; base += 32 * kU) {
    int4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; u++) {
      int i = base + u * 32 + lane;
      if (i < n16) v[u] = kStaged ? ldStaged(src + i) : ldNc(src + i);
    }
    unsigned m = dmask;
    while (m) {
      const int d = __ffs(m) - 1;
      m &= m - 1;
      int4* dst = reinterpret_cast<int4*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_dst), d));
#pragma unroll
      for (int u = 0; u < kU; u++) {
        int i = base + u * 32 + lane;
        if (i < n16) stNa(dst + i, v[u]);
      }
    }
  }
}

// Column `lane` (< num_topk) of a row's ids into recv_topk_idx / weights and
// the per-expert counts: a local id, or -1 (weight 0) for any code that is not.
__device__ __forceinline__ void storeId(const DispatchParams& p, long long row, int code, float w, int lane,
                                        int* hist) {
  const int local = code >= 0 && code < p.cv.experts_per_rank ? code : -1;
  if (p.recv_idx) p.recv_idx[row * p.num_topk + lane] = local;
  if (p.recv_w) p.recv_w[row * p.num_topk + lane] = local >= 0 ? w : 0.0f;
  if (local >= 0) atomicAdd(&hist[local], 1);
}

// What a block saw that is reported once, after its row loops: a branch to
// reportError inside them would grow the loops' code and wait on its load.
struct BlockNotes {
  int rows_without_ids;             // a row of a sender that passed no ids came to this block
  int wider;                        // a sender with more id columns than this rank: columns << 8 | its
                                    // rank, the widest (one atomicMax keeps the pair consistent)
  unsigned long long bad_id_at;     // first token * num_topk + column with an out-of-range id
};

// A received row's id column `lane` (code from the sender's meta, w its
// weight) into recv_topk_idx / weights and the per-expert counts, with this
// rank's num_topk: columns past the sender's read -1 / 0. A sender with more
// columns than this rank cannot fit its rows: noted, reported after the loop
// (the host backend refuses the call the same way).
__device__ __forceinline__ void decodeIds(const DispatchParams& p, int src, long long row, int code, float w, int lane,
                                          int* hist, BlockNotes& notes) {
  if (lane == 0 && code == kIdNoIds) notes.rows_without_ids = 1;
  if (lane >= p.num_topk && lane < p.max_topk && code != kIdPastTopk && code != kIdNoIds)
    atomicMax(&notes.wider, (lane + 1) << 8 | src);
  if (lane < p.num_topk) storeId(p, row, code, w, lane, hist);
}

// kU: 16-byte loads per lane in flight per row pass: 14 for rows of up to
// 7168 bytes (an FP8 row of 7168 in one pass; 16 spills), else 8 (a BF16 row
// of 7168 in four).
template <int kU>
__global__ void __launch_bounds__(512) dispatchKernel(DispatchParams p) {
  extern __shared__ int hist[];  // [local experts]
  const CommView& cv = p.cv;
  const int R = cv.nranks, me = cv.rank, C = gridDim.x, c = blockIdx.x;
  const int EL = cv.experts_per_rank;
  const uint32_t epoch = cv.local->epoch + 1;
  const HState* hs = p.hv.hs;
  if (htStaleHandle(cv, hs)) return;
  const int* tp = p.hv.tok_pos;
  const int T = p.num_tokens, K = p.num_topk, MK = p.max_topk;
  const bool with_topk = p.topk != nullptr;
  __shared__ int claimed[kMaxRanks];  // [source]: rows of it claimed by a warp
  __shared__ BlockNotes notes;
  for (int i = threadIdx.x; i < EL; i += blockDim.x) hist[i] = 0;
  if (threadIdx.x < kMaxRanks) claimed[threadIdx.x] = 0;
  if (threadIdx.x == 0) notes = BlockNotes{0, 0, ~0ull};
  peersFinishedPrevious(cv, epoch);

  const long long num_recv = hs->num_recv;
  const bool drop = p.drop || num_recv > p.capacity;
  if (drop && !p.drop && c == 0 && threadIdx.x == 0)
    reportError(cv, 4, kWhatCapacity, -1, num_recv, p.capacity);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n16 = int(p.row_bytes / 16);
  const int nb = p.nb;
  const size_t scale_bytes = size_t(nb) * 4;

  if (warp < p.send_warps) {
    const int t0 = int((long long)T * c / C), t1 = int((long long)T * (c + 1) / C);
    __shared__ int start_pos[kMaxRanks];
    if (warp == 0 && lane < R) {
      int start = tp[size_t(t0) * R + lane] & 0x7fffffff;
      start_pos[lane] = start;
      if (lane != me && !htIsDead(cv, lane)) {  // nothing into a removed rank's buffer
        Ctrl* peer = reinterpret_cast<Ctrl*>(cv.bufs[lane]);
        int count = (tp[size_t(t1) * R + lane] & 0x7fffffff) - start;
        stRelaxedSys32(&peer->dstart[me][c], uint32_t(start));
        stReleaseSys(&peer->dinfo[me][c], tagged(epoch, uint32_t(count)));
      }
    }
    namedBarrier(1, p.send_warps * 32);
    const long long own_base = hs->recv_offset[me];
    // Where destination `lane` keeps this rank's rows.
    char* dst_rows = nullptr;
    char* dst_meta = nullptr;
    long long dst_first = 0;
    if (lane < R && lane != me) {
      dst_rows = cv.bufs[lane] + cv.rows_off;
      dst_meta = cv.bufs[lane] + cv.meta_off;
      dst_first = hs->dst_base[lane];
    }
    const int SW = p.send_warps;
    for (int a = t0; a < t1; a += p.chunk_tokens) {
      const int b = min(a + p.chunk_tokens, t1);
      int t = a + warp;
      int v = (t < b && lane < R) ? tp[size_t(t) * R + lane] : 0;
      for (; t < b; t += SW) {
        // Next token's positions, and this token's scales, expert ids and
        // weights, are loaded before the row so their latencies overlap.
        const int tn = t + SW;
        const int vn = (tn < b && lane < R) ? tp[size_t(tn) * R + lane] : 0;
        float s0 = 0.0f, s1 = 0.0f;
        if (lane < nb) s0 = p.x_scales[size_t(t) * p.s_tok + size_t(lane) * p.s_blk];
        if (lane + 32 < nb) s1 = p.x_scales[size_t(t) * p.s_tok + size_t(lane + 32) * p.s_blk];
        long long e = -1;
        float w = 0.0f;
        if (with_topk && lane < K) {
          e = topkLoad(p.topk, p.idx64, size_t(t) * K + lane);
          if (p.topk_w) w = p.topk_w[size_t(t) * K + lane];
        }
        unsigned mask = __ballot_sync(0xffffffffu, v < 0);
        if (drop) mask &= ~(1u << me);
        long long slot = lane == me ? own_base + (v & 0x7fffffff) : dst_first + (v & 0x7fffffff);
        int4* my_dst = nullptr;
        char* my_meta = nullptr;
        if (lane < R && v < 0) {
          if (lane == me) {
            my_dst = reinterpret_cast<int4*>(p.recv_x + slot * p.row_bytes);
          } else {
            my_dst = reinterpret_cast<int4*>(dst_rows + slot * cv.row_stride);
            my_meta = dst_meta + slot * cv.meta_stride;
          }
        }
        copyRow<false, kU>(reinterpret_cast<const int4*>(p.x + size_t(t) * p.x_stride), my_dst, mask, n16, lane);
        // A new routing's ids were checked by the routing kernel; other ids (a
        // prepared handle's, a cached re-dispatch's) are checked here, after
        // the row's loads are issued: a branch on the id before them would
        // wait for its load every token (+2-3% at EP2). Noted, reported at
        // the next call; the id is taken as -1.
        if (p.check_ids && (e < -1 || e >= cv.num_experts))
          atomicMin(&notes.bad_id_at, (unsigned long long)t * K + lane);
        // The rank of this column's expert (-1: none), once per token, in 32
        // bits: a 64-bit division per destination costs ~100 instructions.
        const int e_rank = e >= 0 && e < cv.num_experts ? int(e) / EL : -1;
        // Scales and expert ids, per destination.
        unsigned m = mask;
        while (m) {
          const int d = __ffs(m) - 1;
          m &= m - 1;
          const long long row = __shfl_sync(0xffffffffu, slot, d);
          char* meta = reinterpret_cast<char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_meta), d));
          float* sdst = d == me ? p.recv_scales + row * nb : reinterpret_cast<float*>(meta);
          if (lane < nb) sdst[lane] = s0;
          if (lane + 32 < nb) sdst[lane + 32] = s1;
          for (int q = lane + 64; q < nb; q += 32) sdst[q] = p.x_scales[size_t(t) * p.s_tok + size_t(q) * p.s_blk];
          // Column `lane`: a local id, -1, or why there is none; this rank's
          // own rows are decoded as a peer's would be.
          const bool mine = e_rank == d;
          const int code = mine ? int(e) - d * EL : !with_topk ? kIdNoIds : lane < K ? -1 : kIdPastTopk;
          const float wv = mine ? w : 0.0f;
          // (Not decodeIds: its checks of a peer's columns cannot fail for
          // this rank's own, and in the send loop they spill registers.)
          if (d == me) {
            if (lane < K) storeId(p, row, code, wv, lane, hist);
            if (!with_topk && lane == 0) notes.rows_without_ids = 1;
          } else if (lane < MK) {
            reinterpret_cast<int*>(meta + scale_bytes)[lane] = code;
            reinterpret_cast<float*>(meta + scale_bytes + size_t(MK) * 4)[lane] = wv;
          }
        }
        v = vn;
      }
      namedBarrier(1, p.send_warps * 32);
      if (warp == 0 && lane < R && lane != me && !htIsDead(cv, lane)) {
        int done = (tp[size_t(b) * R + lane] & 0x7fffffff) - start_pos[lane];
        Ctrl* peer = reinterpret_cast<Ctrl*>(cv.bufs[lane]);
        stReleaseSys(&peer->dprog[me][c], tagged(epoch, uint32_t(done)));
      }
    }
  }
  // Rows of channel c from every other rank: receiver warps from the start,
  // sender warps once their rows are sent.
  {
    Ctrl* mine = reinterpret_cast<Ctrl*>(cv.bufs[me]);
    const char* rows = cv.bufs[me] + cv.rows_off;
    const char* metas = cv.bufs[me] + cv.meta_off;
    for (int i = 1; i < R; i++) {
      const int s = (me + i) % R;
      if (htIsDead(cv, s)) {  // removed by epCommShrink: it sends nothing, its words are not waited for
        if (warp == p.send_warps && lane == 0) p.hv.chan_start[s * C + c] = p.hv.chan_count[s * C + c] = 0;
        continue;
      }
      long long info = 0;
      if (lane == 0) info = waitTagged(cv, &mine->dinfo[s][c], epoch, 0, kWhatDispatchInfo, s);
      info = __shfl_sync(0xffffffffu, info, 0);
      if (info < 0) break;
      const int count = int(info);
      int start = 0;
      if (lane == 0) start = int(ldRelaxedSys32(&mine->dstart[s][c]));
      start = __shfl_sync(0xffffffffu, start, 0);
      if (warp == p.send_warps && lane == 0) {
        p.hv.chan_start[s * C + c] = start;
        p.hv.chan_count[s * C + c] = count;
      }
      const long long first = hs->recv_offset[s] + start;
      int avail = 0;
      bool failed = false;
      for (;;) {
        int j = 0;
        if (lane == 0) j = atomicAdd(&claimed[s], 1);
        j = __shfl_sync(0xffffffffu, j, 0);
        if (j >= count) break;
        if (j >= avail) {
          long long got = 0;
          if (lane == 0) got = waitTagged(cv, &mine->dprog[s][c], epoch, uint32_t(j + 1), kWhatDispatchData, s);
          got = __shfl_sync(0xffffffffu, got, 0);
          if (got < 0) { failed = true; break; }
          avail = int(got);
        }
        if (drop) continue;
        const long long row = first + j;
        // Meta first, so its loads overlap the row's.
        const char* meta = metas + row * cv.meta_stride;
        float s0 = 0.0f, s1 = 0.0f;
        if (lane < nb) s0 = reinterpret_cast<const float*>(meta)[lane];
        if (lane + 32 < nb) s1 = reinterpret_cast<const float*>(meta)[lane + 32];
        int code = kIdPastTopk;
        float w = 0.0f;
        if (lane < MK) code = reinterpret_cast<const int*>(meta + scale_bytes)[lane];
        if (lane < K) w = reinterpret_cast<const float*>(meta + scale_bytes + size_t(MK) * 4)[lane];
        copyRow<true, kU>(reinterpret_cast<const int4*>(rows + row * cv.row_stride),
                          reinterpret_cast<int4*>(p.recv_x + row * p.row_bytes), 1u, n16, lane);
        float* sdst = p.recv_scales + row * nb;
        if (lane < nb) sdst[lane] = s0;
        if (lane + 32 < nb) sdst[lane + 32] = s1;
        for (int q = lane + 64; q < nb; q += 32) sdst[q] = reinterpret_cast<const float*>(meta)[q];
        decodeIds(p, s, row, code, w, lane, hist, notes);
      }
      if (failed) break;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < EL; i += blockDim.x)
    if (hist[i]) atomicAdd(&p.hv.expert_acc[i], hist[i]);
  if (threadIdx.x == 0) {
    if (notes.rows_without_ids) atomicOr(p.hv.rows_without_ids, 1);
    if (notes.wider)
      reportError(cv, 5 /* epInvalidUsage */, kWhatWiderTopk, notes.wider & 0xff, notes.wider >> 8, K);
    if (notes.bad_id_at != ~0ull)
      reportError(cv, 4 /* epInvalidArgument */, kWhatBadTopk, -1, (long long)notes.bad_id_at,
                  topkLoad(p.topk, p.idx64, size_t(notes.bad_id_at)));
  }
  // Rows past num_recv are marked unused, with either sizing. (num_recv read
  // again: a register less across the row loops.)
  if (!drop && p.recv_idx) {
    const long long num_recv = *reinterpret_cast<const volatile long long*>(&hs->num_recv);
    const long long n = (p.capacity - num_recv) * K;
    for (long long i = (long long)c * blockDim.x + threadIdx.x; i < n; i += (long long)C * blockDim.x)
      p.recv_idx[num_recv * K + i] = -1;
  }
  if (!lastBlockDone(cv.local)) return;
  publishFinished(cv, epoch);
  // Counts from this call's ids only when every row came with them (a cached
  // re-dispatch without ids, on any rank, keeps the first dispatch's counts).
  __shared__ int ids_complete;
  if (threadIdx.x == 0) {
    ids_complete = *reinterpret_cast<volatile int*>(p.hv.rows_without_ids) == 0;
    *p.hv.rows_without_ids = 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < EL; i += blockDim.x) {
    int v = atomicExch(&p.hv.expert_acc[i], 0);
    if (ids_complete) {
      if (!drop) p.hv.expert_saved[i] = v;
    } else {
      v = p.hv.expert_saved[i];
    }
    if (p.recv_tpe && !drop) {
      int a = p.alignment;
      p.recv_tpe[i] = a > 1 ? (v + a - 1) / a * a : v;
    }
  }
  if (threadIdx.x == 0) {
    if (p.num_recv_dev && !drop) *p.num_recv_dev = hs->num_recv;
    cv.local->blocks_done = 0;
    cv.local->epoch = epoch;
  }
}

}  // namespace

int launchDispatch(const DispatchParams& p, int blocks, void* stream) {
  const int threads = (p.send_warps + p.recv_warps) * 32;
  size_t smem = size_t(p.cv.experts_per_rank) * sizeof(int);
  const bool small_rows = p.row_bytes <= 32 * 16 * 14;
  auto kernel = small_rows ? dispatchKernel<14> : dispatchKernel<8>;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return int(e);
  }
  // The launch's own result: CUDA's last error may hold the caller's (cuda_check.h: launchFailure).
  void* args[] = {const_cast<DispatchParams*>(&p)};
  return int(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(blocks), dim3(threads), args, smem,
                              static_cast<cudaStream_t>(stream)));
}

int preloadDispatchKernels() { return preloadKernels(dispatchKernel<14>, dispatchKernel<8>); }

}  // namespace cuda
}  // namespace ep
