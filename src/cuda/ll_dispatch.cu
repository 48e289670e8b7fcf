// Low-latency dispatch kernels (see ll_common.h for who writes what).
//
// Send: one block per token (latency: a row spread over 256 threads with
// several loads in flight each). Warp 0 reads the token's expert ids, works
// out its destination ranks and writes the record headers (ids, weights); all
// threads quantise the row once (FP8: a scale per 128 values, each 16-lane
// half-warp owning one block) and store it into landing[me][t] of every
// destination — one crossing per destination rank, however many of its
// experts live there.
// Receive: one block per local expert scans the arrived records in (source,
// token) order, numbers the ones that chose the expert, copies their rows into
// the expert-major outputs and notes each slot in the record for combine.
#include <cuda_fp8.h>

#include "ll_device.cuh"

namespace ep {
namespace cuda {

namespace {

__device__ __forceinline__ float roundScalePow2(float s) {
  uint32_t bits = __float_as_uint(s);
  if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
  return __uint_as_float(bits);
}

__device__ __forceinline__ uint32_t packFp8x4(float a, float b, float c, float d) {
  __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

constexpr int kSendThreads = 256;  // one block per token: its row is spread over 256 threads
constexpr int kChunks = 4;         // 16-byte loads in flight per thread (8 values each)

// The send half; `pair` was read from v.local->pairs at kernel start (it is
// bumped by the last block to finish this phase, after every block read it).
__device__ __forceinline__ void dispatchSendPhase(const LLDispatchParams& p, uint32_t pair) {
  const LLView& v = p.v;
  const int set = int(pair & 1u);
  const uint32_t tag = pair + 1;
  const int R = v.nranks, me = v.rank, K = p.num_topk, H = v.hidden;
  if (pair >= 2 && threadIdx.x < R)  // pair - 2 used this set: every peer must have released it
    llWait(v, &llCtrl(v, me)->dfree[set][threadIdx.x], tag - 2, true, kLLWhatFree, threadIdx.x);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p.hd->pair = pair;
    p.hd->num_tokens = p.num_tokens;
  }
  __shared__ unsigned s_mask;
  const int lane = threadIdx.x & 31;
  for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    __syncthreads();  // s_mask of the previous token is no longer read
    if (threadIdx.x < 32) {  // warp 0: destinations and the record headers
      int id = -1;
      float w = 0.0f;
      if (lane < K) {
        long long e = topkLoad(p.topk, p.idx64, size_t(t) * K + lane);
        if (e < -1 || e >= v.num_experts) {
          llReport(v, 4 /* epInvalidArgument */, kLLWhatBadTopk, -1, t, e);
          e = -1;
        }
        id = int(e);
        w = p.weights ? p.weights[size_t(t) * K + lane] : 1.0f;
      }
      const unsigned mask = __reduce_or_sync(0xffffffffu, id >= 0 ? 1u << (id / v.local_experts) : 0u);
      if (lane == 0) {
        p.hd->mask[t] = uint8_t(mask);
        s_mask = mask;
      }
      for (unsigned bits = mask; bits; bits &= bits - 1) {
        char* rec = llRecord(v, __ffs(bits) - 1, set, me, t);
        if (lane < K) {
          reinterpret_cast<int32_t*>(rec + 16)[lane] = id;
          reinterpret_cast<float*>(rec + 16 + 4 * v.max_topk)[lane] = w;
        }
        if (lane == 0) {
          LLRecordHeader* h = reinterpret_cast<LLRecordHeader*>(rec);
          h->token = t;
          h->pad[0] = uint32_t(K);
          h->tag = tag;  // read only after ddone, which the fences order after this
        }
      }
    }
    __syncthreads();
    const unsigned mask = s_mask;
    if (mask == 0) continue;
    const uint16_t* xr = p.x + size_t(t) * H;
    // All loads of a group first, then the stores: kChunks round trips in flight.
    for (int base = 0; base < H; base += kSendThreads * 8 * kChunks) {
      int4 raw[kChunks];
#pragma unroll
      for (int u = 0; u < kChunks; u++) {
        const int j = base + (u * kSendThreads + threadIdx.x) * 8;
        if (j < H) raw[u] = ldNc(reinterpret_cast<const int4*>(xr + j));
      }
#pragma unroll
      for (int u = 0; u < kChunks; u++) {
        const int j = base + (u * kSendThreads + threadIdx.x) * 8;
        if (!p.fp8) {
          if (j < H)
            for (unsigned bits = mask; bits; bits &= bits - 1)
              *reinterpret_cast<int4*>(llRecord(v, __ffs(bits) - 1, set, me, t) + v.hdr_bytes + size_t(j) * 2) = raw[u];
          continue;
        }
        // FP8: each half-warp owns one block of 128 values (the shuffles need every lane).
        const bool active = j < H;
        float f[8];
        float amax = 0.0f;
        if (active) {
          const uint32_t words[4] = {uint32_t(raw[u].x), uint32_t(raw[u].y), uint32_t(raw[u].z), uint32_t(raw[u].w)};
#pragma unroll
          for (int i = 0; i < 4; i++) {
            f[2 * i] = bf16ToFloat(words[i] & 0xffffu);
            f[2 * i + 1] = bf16ToFloat(words[i] >> 16);
          }
#pragma unroll
          for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(f[i]));
        }
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        float scale = fmaxf(amax, 1e-4f) / 448.0f;
        if (p.pow2) scale = roundScalePow2(scale);
        const float inv = 1.0f / scale;
        if (!active) continue;
        const uint2 q = make_uint2(packFp8x4(f[0] * inv, f[1] * inv, f[2] * inv, f[3] * inv),
                                   packFp8x4(f[4] * inv, f[5] * inv, f[6] * inv, f[7] * inv));
        for (unsigned bits = mask; bits; bits &= bits - 1) {
          char* row = llRecord(v, __ffs(bits) - 1, set, me, t) + v.hdr_bytes;
          *reinterpret_cast<uint2*>(row + j) = q;
          if ((lane & 15) == 0) reinterpret_cast<float*>(row + size_t(H) * 2)[j / 128] = scale;
        }
      }
    }
  }
  if (llLastBlock(v, 0)) {
    if (threadIdx.x < R) stReleaseSys(&llCtrl(v, threadIdx.x)->ddone[set][me], tagged(tag, uint32_t(p.num_tokens)));
    if (threadIdx.x == 0) v.local->pairs = pair + 1;
  }
}

constexpr int kRecvThreads = kSendThreads;  // the fused kernel runs both phases in one block

// The receive half of pair `pair`.
__device__ __forceinline__ void dispatchRecvPhase(const LLDispatchParams& p, uint32_t pair) {
  const LLView& v = p.v;
  const int R = v.nranks, me = v.rank, M = v.max_tokens, H = v.hidden;
  const int set = int(pair & 1u);
  const uint32_t tag = pair + 1;
  __shared__ int src_base[kMaxRanks + 1];
  __shared__ int warp_count[kRecvThreads / 32];
  __shared__ int match_c[kRecvThreads], match_slot[kRecvThreads];
  if (threadIdx.x < R) {
    long long n = llWait(v, &llCtrl(v, me)->ddone[set][threadIdx.x], tag, false, kLLWhatDispatch, threadIdx.x);
    src_base[threadIdx.x + 1] = n < 0 ? 0 : int(n);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    src_base[0] = 0;
    for (int s = 0; s < R; s++) src_base[s + 1] += src_base[s];
  }
  __syncthreads();
  const int total = src_base[R];
  const size_t cap = size_t(R) * M;
  const int nb = (H + 127) / 128;
  const size_t row_bytes = p.fp8 ? size_t(H) : size_t(H) * 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = kRecvThreads / 32;

  for (int e = blockIdx.x; e < v.local_experts; e += gridDim.x) {
    const int eg = v.first_expert + e;
    int count = 0;  // slots given so far, the same in every thread
    for (int c0 = 0; c0 < total; c0 += kRecvThreads) {
      const int c = c0 + threadIdx.x;
      int k_match = -1, s = 0, t = 0;
      char* rec = nullptr;
      if (c < total) {
        while (c >= src_base[s + 1]) s++;
        t = c - src_base[s];
        rec = llRecord(v, me, set, s, t);
        const LLRecordHeader* h = reinterpret_cast<const LLRecordHeader*>(rec);
        if (h->tag == tag) {
          const int K = int(h->pad[0]);
          const int32_t* ids = reinterpret_cast<const int32_t*>(rec + 16);
          for (int k = 0; k < K; k++)
            if (ids[k] == eg) {
              k_match = k;
              break;
            }
        }
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, k_match >= 0);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, chunk_total = 0;
      for (int w = 0; w < nwarps; w++) {
        before += w < warp ? warp_count[w] : 0;
        chunk_total += warp_count[w];
      }
      if (k_match >= 0) {
        const int idx = before + __popc(ballot & ((1u << lane) - 1u));
        const int slot = count + idx;
        reinterpret_cast<int32_t*>(rec + 16 + 8 * v.max_topk)[k_match] = slot;  // for combine
        if (p.recv_src) p.recv_src[size_t(e) * cap + slot] = s * M + t;
        match_c[idx] = c;
        match_slot[idx] = slot;
      }
      __syncthreads();
      for (int i = warp; i < chunk_total; i += nwarps) {  // one warp per row
        const int cc = match_c[i], slot = match_slot[i];
        int ss = 0;
        while (cc >= src_base[ss + 1]) ss++;
        const char* src_rec = llRecord(v, me, set, ss, cc - src_base[ss]);
        const int4* from = reinterpret_cast<const int4*>(src_rec + v.hdr_bytes);
        int4* to = reinterpret_cast<int4*>(p.recv_x + (size_t(e) * cap + slot) * row_bytes);
        const int n16 = int(row_bytes / 16);
        for (int q0 = 0; q0 < n16; q0 += 32 * 8) {  // 8 loads in flight per lane
          int4 buf[8];
#pragma unroll
          for (int u = 0; u < 8; u++)
            if (q0 + u * 32 + lane < n16) buf[u] = ldStaged(from + q0 + u * 32 + lane);
#pragma unroll
          for (int u = 0; u < 8; u++)
            if (q0 + u * 32 + lane < n16) to[q0 + u * 32 + lane] = buf[u];
        }
        if (p.fp8) {
          const float* scales = reinterpret_cast<const float*>(src_rec + v.hdr_bytes + size_t(H) * 2);
          for (int b = lane; b < nb; b += 32) p.recv_scales[(size_t(e) * nb + b) * cap + slot] = scales[b];
        }
      }
      count += chunk_total;
      __syncthreads();
    }
    if (threadIdx.x == 0) p.recv_count[e] = count;
  }
}


__global__ void __launch_bounds__(kSendThreads) llDispatchSendKernel(LLDispatchParams p) {
  dispatchSendPhase(p, p.v.local->pairs);
}

__global__ void __launch_bounds__(kRecvThreads) llDispatchRecvKernel(LLDispatchParams p) {
  dispatchRecvPhase(p, p.hd->pair);
}

// Both halves in one launch (a call that is not split): every block sends its
// tokens, then receives. The grid is at most one block per SM so that all
// blocks are resident: blocks waiting in the receive half never keep a
// sending block from running.
__global__ void __launch_bounds__(kSendThreads) llDispatchKernel(LLDispatchParams p) {
  const uint32_t pair = p.v.local->pairs;
  dispatchSendPhase(p, pair);
  dispatchRecvPhase(p, pair);
}

}  // namespace

int launchLLDispatchSend(const LLDispatchParams& p, int sms, void* stream) {
  int blocks = p.num_tokens < 4 * sms ? p.num_tokens : 4 * sms;
  llDispatchSendKernel<<<blocks < 1 ? 1 : blocks, kSendThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

int launchLLDispatch(const LLDispatchParams& p, int sms, void* stream) {
  int blocks = p.num_tokens > p.v.local_experts ? p.num_tokens : p.v.local_experts;
  blocks = blocks < 1 ? 1 : (blocks > sms ? sms : blocks);
  llDispatchKernel<<<blocks, kSendThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

int launchLLDispatchRecv(const LLDispatchParams& p, int sms, void* stream) {
  int blocks = p.v.local_experts < sms ? p.v.local_experts : sms;
  llDispatchRecvKernel<<<blocks < 1 ? 1 : blocks, kRecvThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

}  // namespace cuda
}  // namespace ep
