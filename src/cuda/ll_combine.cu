// Low-latency combine kernels (see ll_common.h for who writes what).
//
// Send: one block per arrived (source, token) record. The block forms the
// weighted sum of the rows of y of this rank's experts the token chose, in
// k order with fused multiply-adds into float32 (exactly as the host backend),
// and stores it into the home rank's combine landing: one row per (token,
// rank), whatever the number of experts.
// Receive: one block per token of this rank sums the partial rows of the ranks
// the token went to, in ascending rank order, and rounds to BF16.
#include "ll_device.cuh"

namespace ep {
namespace cuda {

namespace {

constexpr int kThreads = 256;  // one block per row: 8 values per thread per step

__device__ __forceinline__ void combineSendPhase(const LLCombineParams& p) {
  const LLView& v = p.v;
  const int R = v.nranks, me = v.rank, M = v.max_tokens, H = v.hidden;
  const uint32_t pair = p.hd->pair;
  const int set = int(pair & 1u);
  const uint32_t tag = pair + 1;
  __shared__ int src_base[kMaxRanks + 1];
  __shared__ int s_count;
  __shared__ int s_e[32], s_slot[32];
  __shared__ float s_w[32];
  if (threadIdx.x < R) {
    if (pair >= 2)  // the home rank must have read the rows of pair - 2 from this set
      llWait(v, &llCtrl(v, me)->cfree[set][threadIdx.x], tag - 2, true, kLLWhatFree, threadIdx.x);
    // Tokens each source sent this pair (ddone is still this pair's: the next
    // dispatch into this set waits for the dfree this kernel sends at its end).
    src_base[threadIdx.x + 1] = int(uint32_t(ldAcquireSys(&llCtrl(v, me)->ddone[set][threadIdx.x])));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    src_base[0] = 0;
    for (int s = 0; s < R; s++) src_base[s + 1] += src_base[s];
  }
  __syncthreads();
  const int total = src_base[R];
  const size_t cap = size_t(R) * M;
  const int lane = threadIdx.x & 31;
  for (int c = blockIdx.x; c < total; c += gridDim.x) {
    int s = 0;
    while (c >= src_base[s + 1]) s++;
    const int t = c - src_base[s];
    const char* rec = llRecord(v, me, set, s, t);
    const LLRecordHeader* h = reinterpret_cast<const LLRecordHeader*>(rec);
    if (h->tag != tag) continue;  // token t of s did not come here (block-uniform)
    if (threadIdx.x < 32) {  // this rank's experts of the token, k ascending, as the host
      const int K = int(h->pad[0]);
      int e = -1;
      if (lane < K) {
        const int id = reinterpret_cast<const int32_t*>(rec + 16)[lane];
        if (id >= v.first_expert && id < v.first_expert + v.local_experts) e = id - v.first_expert;
      }
      const unsigned local = __ballot_sync(0xffffffffu, e >= 0);
      if (e >= 0) {
        const int idx = __popc(local & ((1u << lane) - 1u));
        s_e[idx] = e;
        s_w[idx] = reinterpret_cast<const float*>(rec + 16 + 4 * v.max_topk)[lane];
        s_slot[idx] = reinterpret_cast<const int32_t*>(rec + 16 + 8 * v.max_topk)[lane];
      }
      if (lane == 0) s_count = __popc(local);
    }
    __syncthreads();
    const int n = s_count;
    float* dst = llCombineRow(v, s, set, me, t);
    for (int j = threadIdx.x * 8; j < H; j += kThreads * 8) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k0 = 0; k0 < n; k0 += 4) {  // four rows of y in flight, summed in order
        int4 raw[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
          if (k0 + u < n) raw[u] = ldNc(reinterpret_cast<const int4*>(p.y + (size_t(s_e[k0 + u]) * cap + s_slot[k0 + u]) * H + j));
#pragma unroll
        for (int u = 0; u < 4; u++) {
          if (k0 + u >= n) break;
          const float w = s_w[k0 + u];
          const uint32_t words[4] = {uint32_t(raw[u].x), uint32_t(raw[u].y), uint32_t(raw[u].z), uint32_t(raw[u].w)};
#pragma unroll
          for (int i = 0; i < 4; i++) {
            acc[2 * i] = fmaf(w, bf16ToFloat(words[i] & 0xffffu), acc[2 * i]);
            acc[2 * i + 1] = fmaf(w, bf16ToFloat(words[i] >> 16), acc[2 * i + 1]);
          }
        }
      }
      reinterpret_cast<float4*>(dst + j)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(dst + j)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    __syncthreads();  // s_e / s_w / s_slot are rewritten for the next record
  }
  if (llLastBlock(v, 2)) {
    if (threadIdx.x < R) {
      stReleaseSys(&llCtrl(v, threadIdx.x)->cdone[set][me], tagged(tag, 0));
      stReleaseSys(&llCtrl(v, threadIdx.x)->dfree[set][me], tagged(tag, 0));
    }
  }
}

__device__ __forceinline__ void combineRecvPhase(const LLCombineParams& p) {
  const LLView& v = p.v;
  const int R = v.nranks, me = v.rank, H = v.hidden;
  const uint32_t pair = p.hd->pair;
  const int set = int(pair & 1u);
  const uint32_t tag = pair + 1;
  if (threadIdx.x < R) llWait(v, &llCtrl(v, me)->cdone[set][threadIdx.x], tag, false, kLLWhatCombine, threadIdx.x);
  __syncthreads();
  const int T = p.hd->num_tokens;
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    const unsigned mask = p.hd->mask[t];
    for (int j = threadIdx.x * 8; j < H; j += kThreads * 8) {
      int4 a[kMaxRanks], b[kMaxRanks];
#pragma unroll
      for (int r = 0; r < kMaxRanks; r++) {  // every partial row in flight at once
        if (r < R && (mask & (1u << r))) {
          const int4* src = reinterpret_cast<const int4*>(llCombineRow(v, me, set, r, t) + j);
          a[r] = ldStaged(src);
          b[r] = ldStaged(src + 1);
        }
      }
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int r = 0; r < kMaxRanks; r++) {  // ascending rank order, as the host
        if (!(r < R && (mask & (1u << r)))) continue;
        acc[0] += __int_as_float(a[r].x);
        acc[1] += __int_as_float(a[r].y);
        acc[2] += __int_as_float(a[r].z);
        acc[3] += __int_as_float(a[r].w);
        acc[4] += __int_as_float(b[r].x);
        acc[5] += __int_as_float(b[r].y);
        acc[6] += __int_as_float(b[r].z);
        acc[7] += __int_as_float(b[r].w);
      }
      uint4 packed;
      packed.x = floatToBf16(acc[0]) | (floatToBf16(acc[1]) << 16);
      packed.y = floatToBf16(acc[2]) | (floatToBf16(acc[3]) << 16);
      packed.z = floatToBf16(acc[4]) | (floatToBf16(acc[5]) << 16);
      packed.w = floatToBf16(acc[6]) | (floatToBf16(acc[7]) << 16);
      *reinterpret_cast<uint4*>(p.out + size_t(t) * H + j) = packed;
    }
  }
  if (llLastBlock(v, 3)) {
    if (threadIdx.x < R) stReleaseSys(&llCtrl(v, threadIdx.x)->cfree[set][me], tagged(tag, 0));
  }
}


__global__ void __launch_bounds__(kThreads) llCombineSendKernel(LLCombineParams p) { combineSendPhase(p); }
__global__ void __launch_bounds__(kThreads) llCombineRecvKernel(LLCombineParams p) { combineRecvPhase(p); }
// Both halves in one launch; at most one block per SM (see llDispatchKernel).
__global__ void __launch_bounds__(kThreads) llCombineKernel(LLCombineParams p) {
  combineSendPhase(p);
  combineRecvPhase(p);
}

}  // namespace

int launchLLCombineSend(const LLCombineParams& p, int sms, void* stream) {
  // One block per possible record; blocks whose record did not arrive leave at once.
  const int rows = p.v.nranks * p.v.max_tokens;
  const int blocks = rows < 4 * sms ? rows : 4 * sms;
  llCombineSendKernel<<<blocks < 1 ? 1 : blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

int launchLLCombine(const LLCombineParams& p, int sms, void* stream) {
  int blocks = p.v.nranks * p.v.max_tokens;
  blocks = blocks < 1 ? 1 : (blocks > sms ? sms : blocks);
  llCombineKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

int launchLLCombineRecv(const LLCombineParams& p, int sms, void* stream) {
  const int blocks = p.v.max_tokens < 4 * sms ? p.v.max_tokens : 4 * sms;
  llCombineRecvKernel<<<blocks < 1 ? 1 : blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

}  // namespace cuda
}  // namespace ep
