// Layout (epLayout) and routing (the first half of a new dispatch) kernels.
//
// layout: many blocks read topk_idx; per-block histograms in shared memory are
// added into a zeroed global scratch; the last block copies the scratch to the
// caller's outputs and zeroes it again. Only this rank's memory is touched.
//
// routing: one block per tile of kRouteTile tokens; each tile writes tok_pos
// of its tokens (send lists in ascending token order, as the host's
// buildSendSide) from a block scan plus the counts of the tiles before it; the
// last block does the count exchange: this rank writes its count vector into
// every rank's Ctrl::counts[epoch & 1][me] (double-buffered by epoch parity so
// a rank one call ahead cannot overwrite counts still being read), waits for
// every rank's vector and derives the offsets of HState.
#include <cuda_runtime.h>

#include "device.cuh"
#include "preload.cuh"

namespace ep {
namespace cuda {
namespace {

// A token whose experts lie on more nodes than config.max_nodes_per_token:
// reported (epInvalidArgument, at the next call or after an exact dispatch's
// rows moved); the call goes on as if no bound were declared, which on one
// node's GPUs changes nothing it computes.
__device__ __forceinline__ void reportNodeLimit(DevLocal* local, ErrorInfo* err, int token, int nodes) {
  recordError(local, err, 4 /* epInvalidArgument */, kWhatNodeLimit, -1, token, nodes);
}

__global__ void __launch_bounds__(256) layoutKernel(LayoutParams p) {
  extern __shared__ int sh[];  // [E] experts, [R] ranks, [N] nodes
  const int E = p.num_experts, R = p.nranks, N = p.num_nodes, nsh = E + R + N;
  for (int i = threadIdx.x; i < nsh; i += blockDim.x) sh[i] = 0;
  __syncthreads();
  int* sh_rank = sh + E;
  int* sh_node = sh + E + R;
  const unsigned dead = p.local->dead;  // ranks removed by epCommShrink (htDead)
  const int lane = threadIdx.x & 31;
  // Warp-uniform trip count so ballots see every lane.
  const int T = p.num_tokens, stride = gridDim.x * blockDim.x;
  for (int base = blockIdx.x * blockDim.x; base < T; base += stride) {
    int t = base + threadIdx.x;
    unsigned rmask = 0, nmask = 0, limit_mask = 0;
    if (t < T) {
      for (int k = 0; k < p.num_topk; k++) {
        long long e = topkLoad(p.topk, p.idx64, size_t(t) * p.num_topk + k);
        if (e < -1 || e >= E) {
          if (p.err->code == 0 && atomicCAS(&p.local->err_claim, 0, 1) == 0) {
            p.err->what = kWhatBadTopk;
            p.err->a = (long long)t * p.num_topk + k;
            p.err->b = e;
            __threadfence_system();
            p.err->code = 4;  // epInvalidArgument
          }
          continue;
        }
        if (e < 0) continue;
        int r = int(e / p.experts_per_rank);
        limit_mask |= 1u << p.node_of_rank[r];     // the node limit counts masked experts too (their ids are there)
        if ((dead >> r) & 1u) continue;  // removed by epCommShrink: counted nowhere, as the routing does
        atomicAdd(&sh[e], 1);
        rmask |= 1u << r;
        nmask |= 1u << p.node_of_rank[r];
      }
      if (p.is_token_in_rank)
        for (int r = 0; r < R; r++) p.is_token_in_rank[size_t(t) * R + r] = (rmask >> r) & 1u;
      if (p.max_nodes > 0) {
        const int nodes = __popc(limit_mask);
        if (nodes > p.max_nodes) reportNodeLimit(p.local, p.err, t, nodes);
      }
    }
    for (int r = 0; r < R; r++) {
      int n = __popc(__ballot_sync(0xffffffffu, (rmask >> r) & 1u));
      if (lane == 0 && n) atomicAdd(&sh_rank[r], n);
    }
    for (int q = 0; q < N; q++) {
      int n = __popc(__ballot_sync(0xffffffffu, (nmask >> q) & 1u));
      if (lane == 0 && n) atomicAdd(&sh_node[q], n);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nsh; i += blockDim.x)
    if (sh[i]) atomicAdd(&p.scratch[i], sh[i]);
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) last = atomicAdd(&p.local->layout_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < nsh; i += blockDim.x) {
    int v = atomicExch(&p.scratch[i], 0);
    if (i < E) {
      if (p.tokens_per_expert) p.tokens_per_expert[i] = v;
    } else if (i < E + R) {
      if (p.tokens_per_rank) p.tokens_per_rank[i - E] = v;
    } else if (p.tokens_per_node) {
      p.tokens_per_node[i - E - R] = v;
    }
  }
  if (threadIdx.x == 0) p.local->layout_done = 0;
}

// Exclusive scan over the block of per-rank bits packed 16 bits per rank (ranks
// 0-3 in lo, 4-7 in hi; a field never exceeds blockDim.x <= 1024, so no carry
// crosses into the next field). Returns the exclusive prefix, *total the block sum.
__device__ __forceinline__ void packedBlockScan(unsigned long long lo, unsigned long long hi, unsigned long long* ex_lo,
                                                unsigned long long* ex_hi, unsigned long long* tot_lo,
                                                unsigned long long* tot_hi) {
  __shared__ unsigned long long warp_sums[2][32];
  __shared__ unsigned long long block_total[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const unsigned long long il = warpInclusiveSum(lo), ih = warpInclusiveSum(hi);
  if (lane == 31) {
    warp_sums[0][warp] = il;
    warp_sums[1][warp] = ih;
  }
  __syncthreads();
  if (warp == 0) {
    unsigned long long sl = lane < nwarps ? warp_sums[0][lane] : 0, sh = lane < nwarps ? warp_sums[1][lane] : 0;
    const unsigned long long cl = warpInclusiveSum(sl), ch = warpInclusiveSum(sh);
    if (lane == 31) {
      block_total[0] = cl;
      block_total[1] = ch;
    }
    __syncwarp();
    if (lane < nwarps) {
      warp_sums[0][lane] = cl - sl;
      warp_sums[1][lane] = ch - sh;
    }
  }
  __syncthreads();
  *ex_lo = warp_sums[0][warp] + il - lo;
  *ex_hi = warp_sums[1][warp] + ih - hi;
  *tot_lo = block_total[0];
  *tot_hi = block_total[1];
  __syncthreads();  // the shared sums are reused by the next call
}

__device__ __forceinline__ int fieldOf(unsigned long long lo, unsigned long long hi, int d) {
  return int(((d < 4 ? lo : hi) >> (16 * (d & 3))) & 0xffffu);
}

// One block per tile of kRouteTile tokens (tile number from a ticket, so a
// tile only ever waits for tiles already running). The tile's ids are loaded
// coalesced and ORed into per-token rank masks in shared memory; a packed block
// scan gives each token's position per destination within the tile; the tile
// publishes its counts (epoch-tagged) and adds up those of the tiles before it.
// The last block sums every tile, writes the totals and does the count
// exchange. Send lists in ascending token order, as the host's buildSendSide.
__global__ void __launch_bounds__(kRouteTile) routingKernel(RoutingParams p) {
  const CommView& cv = p.cv;
  const int R = cv.nranks, me = cv.rank, T = p.num_tokens, K = p.num_topk;
  const int E = cv.num_experts, epr = cv.experts_per_rank;
  const uint32_t epoch = cv.local->epoch + 1;
  __shared__ unsigned smask[kRouteTile];
  __shared__ int tile_sh;
  __shared__ int totals[kMaxRanks];
  __shared__ int mat[kMaxRanks][kMaxRanks];
  smask[threadIdx.x] = 0;
  if (threadIdx.x < kMaxRanks) totals[threadIdx.x] = 0;
  if (threadIdx.x == 0) tile_sh = int(atomicAdd(&cv.local->route_ticket, 1u));
  __syncthreads();
  const int tile = tile_sh, base = tile * kRouteTile;
  const int nt = max(0, min(kRouteTile, T - base));
  int bad_flat = -1;
  long long bad_val = 0;
  {
    const size_t f0 = size_t(base) * K;
    const int n = nt * K;
    constexpr int kU = 8;
    for (int i0 = 0; i0 < n; i0 += kRouteTile * kU) {
      long long ev[kU];
#pragma unroll
      for (int u = 0; u < kU; u++) {
        const int i = i0 + u * kRouteTile + int(threadIdx.x);
        ev[u] = i < n ? topkLoad(p.topk, p.idx64, f0 + i) : -1;
      }
#pragma unroll
      for (int u = 0; u < kU; u++) {
        const int i = i0 + u * kRouteTile + int(threadIdx.x);
        const long long e = ev[u];
        if (i >= n) continue;
        if (e < -1 || e >= E) {
          bad_flat = int(f0 + i);
          bad_val = e;
          continue;
        }
        if (e >= 0) atomicOr(&smask[i / K], 1u << (int(e) / epr));
      }
    }
  }
  __syncthreads();
  const int t = base + int(threadIdx.x);
  // The ranks of the token's experts, those an epCommShrink removed masked
  // (htDead): no row goes there and no count, as if their ids were -1.
  const unsigned routed = int(threadIdx.x) < nt ? smask[threadIdx.x] : 0u;
  const unsigned m = routed & ~htDead(cv);
  unsigned long long lo = 0, hi = 0;
#pragma unroll
  for (int d = 0; d < kMaxRanks; d++) {
    const unsigned long long bit = (m >> d) & 1u;
    if (d < 4) lo |= bit << (16 * d);
    else hi |= bit << (16 * (d - 4));
  }
  if (p.max_nodes > 0) {
    const int nodes = nodesOfRanks(routed, p.node_ranks);  // masked experts too, as the host checks the ids
    if (nodes > p.max_nodes) reportNodeLimit(cv.local, cv.err, t, nodes);
  }
  unsigned long long ex_lo, ex_hi, tot_lo, tot_hi;
  packedBlockScan(lo, hi, &ex_lo, &ex_hi, &tot_lo, &tot_hi);
  uint64_t* sc = p.scratch;
  if (threadIdx.x == 0) {
    sc[size_t(tile) * 4 + 1] = tot_lo;
    sc[size_t(tile) * 4 + 2] = tot_hi;
    stReleaseSys(&sc[size_t(tile) * 4], tagged(epoch, 0));
  }
  // Rows of the tiles before this one (per rank; shared totals[] as the sum).
  for (int j = threadIdx.x; j < tile; j += kRouteTile) {
    waitTagged(cv, &sc[size_t(j) * 4], epoch, 0, kWhatCounts, me);
    const unsigned long long jl = ldAcquireSys(&sc[size_t(j) * 4 + 1]);
    const unsigned long long jh = ldAcquireSys(&sc[size_t(j) * 4 + 2]);
    for (int d = 0; d < R; d++) atomicAdd(&totals[d], fieldOf(jl, jh, d));
  }
  __syncthreads();
  int* tp = p.hv.tok_pos;
  if (t < T) {
#pragma unroll
    for (int d = 0; d < kMaxRanks; d++) {
      if (d >= R) break;
      const unsigned bit = (m >> d) & 1u;
      tp[size_t(t) * R + d] = (totals[d] + fieldOf(ex_lo, ex_hi, d)) | int(bit << 31);
    }
  }
  if (bad_flat >= 0) reportError(cv, 4 /* epInvalidArgument */, kWhatBadTopk, -1, bad_flat, bad_val);
  if (!lastBlockDone(cv.local)) return;
  // Last block: the totals over every tile.
  __syncthreads();
  if (threadIdx.x < kMaxRanks) totals[threadIdx.x] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < int(gridDim.x); j += kRouteTile) {
    const unsigned long long jl = ldAcquireSys(&sc[size_t(j) * 4 + 1]);
    const unsigned long long jh = ldAcquireSys(&sc[size_t(j) * 4 + 2]);
    for (int d = 0; d < R; d++) atomicAdd(&totals[d], fieldOf(jl, jh, d));
  }
  __syncthreads();
  if (threadIdx.x < R) tp[size_t(T) * R + threadIdx.x] = totals[threadIdx.x];

  // Count exchange.
  // A removed rank (htDead) gets no counts and sends none: its row and
  // column of the matrix are 0 (no live rank routes to it).
  const int par = epoch & 1;
  if (threadIdx.x < R && !htIsDead(cv, threadIdx.x)) {
    Ctrl* peer = reinterpret_cast<Ctrl*>(cv.bufs[threadIdx.x]);
    for (int d = 0; d < R; d++) stReleaseSys(&peer->counts[par][me][d], tagged(epoch, uint32_t(totals[d])));
  }
  if (threadIdx.x < R * R) {
    const int s = threadIdx.x / R, d = threadIdx.x % R;
    Ctrl* mine = reinterpret_cast<Ctrl*>(cv.bufs[me]);
    long long v = htIsDead(cv, s) ? 0 : waitTagged(cv, &mine->counts[par][s][d], epoch, 0, kWhatCounts, s);
    mat[s][d] = v < 0 ? 0 : int(v);
  }
  __syncthreads();
  publishFinished(cv, epoch);  // the counts of this epoch are read
  if (threadIdx.x == 0) {
    HState* hs = p.hv.hs;
    long long off = 0;
    for (int s = 0; s < R; s++) {
      hs->recv_offset[s] = off;
      hs->recv_count[s] = mat[s][me];
      off += mat[s][me];
    }
    hs->recv_offset[R] = off;
    hs->num_recv = off;
    int sb = 0;
    for (int d = 0; d < R; d++) {
      int base = 0;
      for (int s = 0; s < me; s++) base += mat[s][d];
      hs->dst_base[d] = base;
      int cb = 0;
      for (int q = 0; q < me; q++) cb += mat[d][q];
      hs->comb_base[d] = cb;
      hs->send_base[d] = sb;
      hs->send_count[d] = mat[me][d];
      sb += mat[me][d];
    }
    hs->num_tokens = T;
    hs->num_topk = K;
    hs->shrinks = cv.local->shrinks;
    cv.local->blocks_done = 0;
    cv.local->route_ticket = 0;
    cv.local->epoch = epoch;
  }
}

// One thread per token: its destination ranks, then its nodes.
__global__ void __launch_bounds__(256) nodeLimitKernel(NodeLimitParams p) {
  const int stride = gridDim.x * blockDim.x;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < p.num_tokens; t += stride) {
    unsigned ranks = 0;
    for (int k = 0; k < p.num_topk; k++) {
      const long long e = topkLoad(p.topk, p.idx64, size_t(t) * p.num_topk + k);
      if (e >= 0 && e < p.num_experts) ranks |= 1u << int(e / p.experts_per_rank);
    }
    const int nodes = nodesOfRanks(ranks, p.node_ranks);
    if (nodes > p.max_nodes) claimError(p.err_claim, p.err, 4 /* epInvalidArgument */, p.what, -1, t, nodes);
  }
}

}  // namespace

int launchLayout(const LayoutParams& p, void* stream) {
  int blocks = (p.num_tokens + 255) / 256;
  blocks = blocks < 1 ? 1 : blocks > 64 ? 64 : blocks;
  size_t smem = size_t(p.num_experts + p.nranks + p.num_nodes) * sizeof(int);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(layoutKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return int(e);
  }
  // The launch's own result: CUDA's last error may hold the caller's (cuda_check.h: launchFailure).
  void* args[] = {const_cast<LayoutParams*>(&p)};
  return int(cudaLaunchKernel(reinterpret_cast<const void*>(layoutKernel), dim3(blocks), dim3(256), args, smem,
                              static_cast<cudaStream_t>(stream)));
}

int launchRouting(const RoutingParams& p, void* stream) {
  const int tiles = p.num_tokens > 0 ? (p.num_tokens + kRouteTile - 1) / kRouteTile : 1;
  void* args[] = {const_cast<RoutingParams*>(&p)};
  return int(cudaLaunchKernel(reinterpret_cast<const void*>(routingKernel), dim3(tiles), dim3(kRouteTile), args, 0,
                              static_cast<cudaStream_t>(stream)));
}

int launchNodeLimit(const NodeLimitParams& p, void* stream) {
  int blocks = (p.num_tokens + 255) / 256;
  blocks = blocks < 1 ? 1 : blocks > 64 ? 64 : blocks;
  void* args[] = {const_cast<NodeLimitParams*>(&p)};
  return int(cudaLaunchKernel(reinterpret_cast<const void*>(nodeLimitKernel), dim3(blocks), dim3(256), args, 0,
                              static_cast<cudaStream_t>(stream)));
}

int preloadLayoutKernels() { return preloadKernels(layoutKernel, routingKernel, nodeLimitKernel); }

}  // namespace cuda
}  // namespace ep
