// Combine kernel. One block per channel, as dispatch.
//
// Who writes what:
//  - pusher warps of rank d, channel c take the rows d received from source s
//    in channel c (positions chan_start[s][c] .. + chan_count[s][c], recorded by
//    the dispatch) and store y rows (and recv_topk_weights) over NVLink into s's
//    staging slots comb_base[s] + position; after every chunk one lane
//    publishes the rows done in s's Ctrl::cprog[d][c] (st.release.sys after the
//    pushers' named barrier).
//  - reducer warps of rank s, channel c, for each token of the channel's slice:
//    wait until every rank that received it has pushed its row (acquire),
//    then acc = 0; acc += row of rank r for r ascending (own row read straight
//    from y); acc += bias; round to the type. Same order as the host backend,
//    so the result is bit-identical to it.
#include <cuda_runtime.h>

#include "device.cuh"
#include "preload.cuh"

namespace ep {
namespace cuda {
namespace {

constexpr int kChunkRows = 16;
// Pushers are few: a whole BF16 row of 7168 in two passes keeps enough bytes in
// flight per warp to feed the link.
constexpr int kPushUnroll = 14;

template <int kType>
struct Elems {
  static constexpr int kPer16 = kType == 2 ? 4 : 8;
};

template <int kType>
__device__ __forceinline__ void addRow(float* acc, int4 v) {
  const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
  if (kType == 2) {
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i] += __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float lo = kType == 0 ? bf16ToFloat(w[i] & 0xffffu) : fp16ToFloat(w[i] & 0xffffu);
      float hi = kType == 0 ? bf16ToFloat(w[i] >> 16) : fp16ToFloat(w[i] >> 16);
      acc[2 * i] += lo;
      acc[2 * i + 1] += hi;
    }
  }
}

template <int kType>
__device__ __forceinline__ int4 packRow(const float* acc) {
  uint32_t w[4];
  if (kType == 2) {
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = __float_as_uint(acc[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      uint32_t lo = kType == 0 ? floatToBf16(acc[2 * i]) : floatToFp16(acc[2 * i]);
      uint32_t hi = kType == 0 ? floatToBf16(acc[2 * i + 1]) : floatToFp16(acc[2 * i + 1]);
      w[i] = lo | (hi << 16);
    }
  }
  return make_int4(int(w[0]), int(w[1]), int(w[2]), int(w[3]));
}

template <int kType>
__global__ void __launch_bounds__(512) combineKernel(CombineParams p) {
  const CommView& cv = p.cv;
  const int R = cv.nranks, me = cv.rank, C = gridDim.x, c = blockIdx.x;
  const uint32_t epoch = cv.local->epoch + 1;
  const HState* hs = p.hv.hs;
  if (htStaleHandle(cv, hs)) return;
  const int* tp = p.hv.tok_pos;
  const int K = p.recv_w ? p.num_topk : 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n16 = int(p.row_bytes / 16);
  peersFinishedPrevious(cv, epoch);

  if (warp < p.push_warps) {
    const int pw = warp;
    for (int i = 1; i < R; i++) {
      const int s = (me + i) % R;
      if (htIsDead(cv, s)) continue;  // removed (htDead): it received nothing, nothing goes into its buffer
      const int start = p.hv.chan_start[s * C + c], count = p.hv.chan_count[s * C + c];
      const long long src_first = hs->recv_offset[s] + start;
      const long long dst_first = hs->comb_base[s] + start;
      char* rows = cv.bufs[s] + cv.rows_off;
      char* metas = cv.bufs[s] + cv.meta_off;
      for (int a = 0; a < count; a += kChunkRows) {
        const int b = min(a + kChunkRows, count);
        for (int j = a + pw; j < b; j += p.push_warps) {
          const int4* src = reinterpret_cast<const int4*>(p.y + (src_first + j) * p.y_stride);
          int4* dst = reinterpret_cast<int4*>(rows + (dst_first + j) * cv.row_stride);
          for (int base = 0; base < n16; base += 32 * kPushUnroll) {
            int4 v[kPushUnroll];
#pragma unroll
            for (int u = 0; u < kPushUnroll; u++) {
              int q = base + u * 32 + lane;
              if (q < n16) v[u] = ldNc(src + q);
            }
#pragma unroll
            for (int u = 0; u < kPushUnroll; u++) {
              int q = base + u * 32 + lane;
              if (q < n16) stNa(dst + q, v[u]);
            }
          }
          if (lane < K)
            reinterpret_cast<float*>(metas + (dst_first + j) * cv.meta_stride)[lane] =
                p.recv_w[(src_first + j) * K + lane];
        }
        namedBarrier(1, p.push_warps * 32);
        if (pw == 0 && lane == 0) {
            Ctrl* peer = reinterpret_cast<Ctrl*>(cv.bufs[s]);
          stReleaseSys(&peer->cprog[me][c], tagged(epoch, uint32_t(b)));
        }
      }
    }
  } else {
    const int qw = warp - p.push_warps, nq = p.reduce_warps;
    const int T = hs->num_tokens;
    const int t0 = int((long long)T * c / C), t1 = int((long long)T * (c + 1) / C);
    Ctrl* mine = reinterpret_cast<Ctrl*>(cv.bufs[me]);
    const char* rows = cv.bufs[me] + cv.rows_off;
    const char* metas = cv.bufs[me] + cv.meta_off;
    // Lane d caches how many rows of rank d this channel has seen.
    int start_d = lane < R ? (tp[size_t(t0) * R + lane] & 0x7fffffff) : 0;
    int seen = 0;
    const long long own_first = hs->recv_offset[me];
    const long long back_first = lane < R ? hs->send_base[lane] : 0;
    bool failed = false;
    for (int t = t0 + qw; t < t1; t += nq) {
      int v = lane < R ? tp[size_t(t) * R + lane] : 0;
      unsigned mask = __ballot_sync(0xffffffffu, v < 0);
      const int pos = v & 0x7fffffff;
      if (!failed && lane < R && lane != me && v < 0) {
        const int need = pos - start_d + 1;
        if (seen < need) {
          long long got = waitTagged(cv, &mine->cprog[lane][c], epoch, uint32_t(need), kWhatCombineData, lane);
          if (got < 0) failed = true;
          else seen = int(got);
        }
      }
      failed = __any_sync(0xffffffffu, failed);
      // Source row of each rank, as lane d sees it.
      const char* src = nullptr;
      const float* wsrc = nullptr;
      if (lane < R && v < 0) {
        if (lane == me) {
          src = p.y + (own_first + pos) * p.y_stride;
          if (K) wsrc = p.recv_w + (own_first + pos) * K;
        } else {
          src = rows + (back_first + pos) * cv.row_stride;
          wsrc = reinterpret_cast<const float*>(metas + (back_first + pos) * cv.meta_stride);
        }
      }
      const char* bias_row = p.bias ? p.bias + size_t(t) * p.row_bytes : nullptr;
      int4* out_row = reinterpret_cast<int4*>(p.out + size_t(t) * p.row_bytes);
      constexpr int kPer = Elems<kType>::kPer16;
      constexpr int kU = 4;  // 16-byte chunks per lane and source in flight
      // Warp-uniform trip count: the loop shuffles.
      for (int qb0 = 0; qb0 < n16; qb0 += 32 * kU) {
        const int qb = qb0 + lane;
        float acc[kU][kPer];
#pragma unroll
        for (int u = 0; u < kU; u++)
#pragma unroll
          for (int i = 0; i < kPer; i++) acc[u][i] = 0.0f;
        // Ascending rank order, as the host: acc = 0; acc += y_r ...; acc += bias.
        // Two sources at a time: both rows' loads are in flight before the adds.
        unsigned m = mask;
        while (m) {
          const int d0 = __ffs(m) - 1;
          m &= m - 1;
          const int d1 = m ? __ffs(m) - 1 : -1;
          if (m) m &= m - 1;
          const int4* s0 = reinterpret_cast<const int4*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), d0));
          const int4* s1 = reinterpret_cast<const int4*>(
              __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), d1 < 0 ? d0 : d1));
          int4 v0[kU], v1[kU];
#pragma unroll
          for (int u = 0; u < kU; u++) {
            const int q = qb + u * 32;
            if (q < n16) v0[u] = d0 == me ? ldNc(s0 + q) : ldStaged(s0 + q);
          }
          if (d1 >= 0) {
#pragma unroll
            for (int u = 0; u < kU; u++) {
              const int q = qb + u * 32;
              if (q < n16) v1[u] = d1 == me ? ldNc(s1 + q) : ldStaged(s1 + q);
            }
          }
#pragma unroll
          for (int u = 0; u < kU; u++)
            if (qb + u * 32 < n16) addRow<kType>(acc[u], v0[u]);
          if (d1 >= 0) {
#pragma unroll
            for (int u = 0; u < kU; u++)
              if (qb + u * 32 < n16) addRow<kType>(acc[u], v1[u]);
          }
        }
        if (bias_row) {
          int4 v[kU];
#pragma unroll
          for (int u = 0; u < kU; u++) {
            const int q = qb + u * 32;
            if (q < n16) v[u] = ldNc(reinterpret_cast<const int4*>(bias_row) + q);
          }
#pragma unroll
          for (int u = 0; u < kU; u++)
            if (qb + u * 32 < n16) addRow<kType>(acc[u], v[u]);
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
          const int q = qb + u * 32;
          if (q < n16) out_row[q] = packRow<kType>(acc[u]);
        }
      }
      if (K && p.out_w) {
        float acc = 0.0f;
        unsigned m = mask;
        while (m) {
          const int d = __ffs(m) - 1;
          m &= m - 1;
          const float* ws = reinterpret_cast<const float*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(wsrc), d));
          if (lane < K) acc += ws[lane];
        }
        if (lane < K) p.out_w[size_t(t) * K + lane] = acc;
      }
    }
  }
  if (!lastBlockDone(cv.local)) return;
  publishFinished(cv, epoch);
  if (threadIdx.x == 0) {
    cv.local->blocks_done = 0;
    cv.local->epoch = epoch;
  }
}

}  // namespace

int launchCombine(const CombineParams& p, int blocks, void* stream) {
  const int threads = (p.push_warps + p.reduce_warps) * 32;
  auto kernel = p.type == 0 ? combineKernel<0> : p.type == 1 ? combineKernel<1> : combineKernel<2>;
  // The launch's own result: CUDA's last error may hold the caller's (cuda_check.h: launchFailure).
  void* args[] = {const_cast<CombineParams*>(&p)};
  return int(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(blocks), dim3(threads), args, 0,
                              static_cast<cudaStream_t>(stream)));
}

int preloadCombineKernels() { return preloadKernels(combineKernel<0>, combineKernel<1>, combineKernel<2>); }

}  // namespace cuda
}  // namespace ep
