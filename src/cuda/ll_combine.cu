// Low-latency combine kernels (see ll_common.h for who writes what).
//
// Send: one warp per arrived (source, token) record. The warp forms the
// weighted sum of the rows of y of this rank's experts the token chose, in
// k order with fused multiply-adds into float32 (exactly as the host backend),
// and stores it into the home rank's combine landing: one row per (token,
// rank), whatever the number of experts.
// Receive: one warp per token of this rank sums the partial rows of the ranks
// the token went to, in ascending rank order, and rounds to BF16.
#include "ll_device.cuh"

namespace ep {
namespace cuda {

namespace {

__global__ void __launch_bounds__(512) llCombineSendKernel(LLCombineParams p) {
  const LLView& v = p.v;
  const int R = v.nranks, me = v.rank, M = v.max_tokens, H = v.hidden;
  const uint32_t pair = p.hd->pair;
  const int set = int(pair & 1u);
  const uint32_t tag = pair + 1;
  __shared__ int src_base[kMaxRanks + 1];
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
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int c = blockIdx.x * warps + warp; c < total; c += gridDim.x * warps) {
    int s = 0;
    while (c >= src_base[s + 1]) s++;
    const int t = c - src_base[s];
    const char* rec = llRecord(v, me, set, s, t);
    const LLRecordHeader* h = reinterpret_cast<const LLRecordHeader*>(rec);
    if (h->tag != tag) continue;  // token t of s did not come here
    const int K = int(h->pad[0]);
    int my_e = -1, my_slot = 0;
    float my_w = 0.0f;
    if (lane < K) {
      const int id = reinterpret_cast<const int32_t*>(rec + 16)[lane];
      if (id >= v.first_expert && id < v.first_expert + v.local_experts) {
        my_e = id - v.first_expert;
        my_w = reinterpret_cast<const float*>(rec + 16 + 4 * v.max_topk)[lane];
        my_slot = reinterpret_cast<const int32_t*>(rec + 16 + 8 * v.max_topk)[lane];
      }
    }
    const unsigned local = __ballot_sync(0xffffffffu, my_e >= 0);
    float* dst = llCombineRow(v, s, set, me, t);
    for (int base = 0; base < H; base += 256) {
      const int j = base + lane * 8;
      const bool active = j < H;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (unsigned bits = local; bits; bits &= bits - 1) {  // k ascending, as the host
        const int k = __ffs(bits) - 1;
        const int e = __shfl_sync(0xffffffffu, my_e, k);
        const int slot = __shfl_sync(0xffffffffu, my_slot, k);
        const float w = __shfl_sync(0xffffffffu, my_w, k);
        if (!active) continue;
        const int4 raw = ldNc(reinterpret_cast<const int4*>(p.y + (size_t(e) * cap + slot) * H + j));
        const uint32_t words[4] = {uint32_t(raw.x), uint32_t(raw.y), uint32_t(raw.z), uint32_t(raw.w)};
#pragma unroll
        for (int i = 0; i < 4; i++) {
          acc[2 * i] = fmaf(w, bf16ToFloat(words[i] & 0xffffu), acc[2 * i]);
          acc[2 * i + 1] = fmaf(w, bf16ToFloat(words[i] >> 16), acc[2 * i + 1]);
        }
      }
      if (active) {
        reinterpret_cast<float4*>(dst + j)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        reinterpret_cast<float4*>(dst + j)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      }
    }
  }
  if (llLastBlock(v, 2)) {
    if (threadIdx.x < R) {
      stReleaseSys(&llCtrl(v, threadIdx.x)->cdone[set][me], tagged(tag, 0));
      stReleaseSys(&llCtrl(v, threadIdx.x)->dfree[set][me], tagged(tag, 0));
    }
  }
}

__global__ void __launch_bounds__(256) llCombineRecvKernel(LLCombineParams p) {
  const LLView& v = p.v;
  const int R = v.nranks, me = v.rank, H = v.hidden;
  const uint32_t pair = p.hd->pair;
  const int set = int(pair & 1u);
  const uint32_t tag = pair + 1;
  if (threadIdx.x < R) llWait(v, &llCtrl(v, me)->cdone[set][threadIdx.x], tag, false, kLLWhatCombine, threadIdx.x);
  __syncthreads();
  const int T = p.hd->num_tokens;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int t = blockIdx.x * warps + warp; t < T; t += gridDim.x * warps) {
    const unsigned mask = p.hd->mask[t];
    for (int j = lane * 8; j < H; j += 256) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int r = 0; r < R; r++) {
        if (!(mask & (1u << r))) continue;
        const int4* src = reinterpret_cast<const int4*>(llCombineRow(v, me, set, r, t) + j);
        const int4 a = ldStaged(src), b = ldStaged(src + 1);
        acc[0] += __int_as_float(a.x);
        acc[1] += __int_as_float(a.y);
        acc[2] += __int_as_float(a.z);
        acc[3] += __int_as_float(a.w);
        acc[4] += __int_as_float(b.x);
        acc[5] += __int_as_float(b.y);
        acc[6] += __int_as_float(b.z);
        acc[7] += __int_as_float(b.w);
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

}  // namespace

int launchLLCombineSend(const LLCombineParams& p, int sms, void* stream) {
  const int warps = 16;
  const int rows = p.v.nranks * p.v.max_tokens;
  int blocks = (rows + warps - 1) / warps;
  blocks = blocks < 1 ? 1 : (blocks > sms ? sms : blocks);
  llCombineSendKernel<<<blocks, warps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

int launchLLCombineRecv(const LLCombineParams& p, int sms, void* stream) {
  const int warps = 8;
  int blocks = (p.v.max_tokens + warps - 1) / warps;
  blocks = blocks < 1 ? 1 : (blocks > sms ? sms : blocks);
  llCombineRecvKernel<<<blocks, warps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

}  // namespace cuda
}  // namespace ep
