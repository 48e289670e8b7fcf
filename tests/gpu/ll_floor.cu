// Floor of a low-latency call on this machine: per-kernel time of a CUDA
// graph of `kernels` back-to-back kernels on each of two GPUs, for kernels
// that do (a) nothing, (b) what every LL kernel does at the least: each block
// adds 1 to a counter on every GPU (release reduction over NVLink) and waits
// until its own GPU's counters reached the blocks of all GPUs, (c) as (b) with
// one block, (d) as (a) but alternating 29 KB and 8 KB of static shared
// memory (as the dispatch and combine kernels do), (e) and (f): (a) and (b)
// launched with programmatic dependent launch (the kernel waits for the
// previous grid with griddepcontrol.wait), (g)-(i): other ways to signal
// (b)'s arrival: (g) block b adds to counter b % 8 of its source, each in a
// cache line of its own (reductions spread over L2 slices), (h) only the
// last block of a GPU to finish adds (one reduction per GPU pair; the blocks
// count themselves in local memory first), (i) as (b) with relaxed
// reductions (what the release costs), (j) as (h), but the blocks count
// themselves with a GPU-scope acq_rel atomic and only the last one releases
// at system scope (faster here than (b), but slower in the library's kernels,
// where the blocks do not all signal at once: docs/BENCHMARKS.md), (k) no
// counter: block b stores one 16-byte line of two (value, tag) words into
// line [me][b] of every GPU (relaxed, no fence) and polls line [src][b] of
// its own GPU for every source until both tags are this round's: the data
// carries its own arrival, as in NCCL's LL protocol. (l)-(o): programmatic
// dependent launch again, now with the next kernel let in early (every block
// runs griddepcontrol.launch_dependents right after its wait, so the next
// grid's blocks can be placed while this one works): (l) empty, (m) (k)
// waiting only, (n) (k) let in early, (o) (b) let in early.
// With one GPU, every variant runs on it alone (the peer is itself).
// Build: nvcc -O2 -arch=sm_90 tests/gpu/ll_floor.cu -o build/ll_floor
#include <cuda_runtime.h>

#include <cstdio>
#include <thread>
#include <vector>

#include "gpu/cuda_check.h"

struct Peers {
  unsigned long long* ctr[2];  // counters [src] on each GPU
  int me, n;
};

constexpr int kLanes = 8;         // (g): counters per source
constexpr int kLaneStride = 16;   // u64 per counter: one 128-byte line each
constexpr int kLocalCount = 512;  // (h): u64 index of the local block count
constexpr int kLinesAt = 1024;    // (k): u64 index of the lines [src][block], two u64 each
constexpr int kMaxBlocks = 256;
constexpr size_t kCtrBytes = (kLinesAt + 2 * 2 * kMaxBlocks) * sizeof(unsigned long long);

__global__ void emptyKernel() {}
__global__ void emptyPdlKernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Programmatic dependent launch: 0 none, 1 wait for the previous grid, 2 also
// let the next grid's blocks in right away.
__device__ __forceinline__ void pdlEnter(int pdl) {
  if (pdl >= 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__global__ void emptyEarlyKernel() { pdlEnter(2); }

template <int kSmem>
__global__ void smemKernel(int* sink) {
  __shared__ int s[kSmem / 4];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (s[(threadIdx.x + 1) % blockDim.x] == -1) *sink = 1;
}

__device__ __forceinline__ void redSys(unsigned long long* c, bool release) {
  if (release) asm volatile("red.release.sys.global.add.u64 [%0], 1;" ::"l"(c) : "memory");
  else asm volatile("red.relaxed.sys.global.add.u64 [%0], 1;" ::"l"(c) : "memory");
}

__device__ __forceinline__ void spinUntil(const unsigned long long* p, unsigned long long target) {
  unsigned long long got;
  do {
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(got) : "l"(p) : "memory");
  } while (got < target);
}

// (b), (c), (f) with release reductions; (i) with relaxed ones.
template <bool kRelease>
__global__ void signalWaitKernel(Peers p, unsigned long long round, int pdl) {
  pdlEnter(pdl);
  __syncthreads();
  if (threadIdx.x < p.n) {
    redSys(p.ctr[threadIdx.x] + p.me, kRelease);
    spinUntil(p.ctr[p.me] + threadIdx.x, round * gridDim.x);
  }
  __syncthreads();
}

// (g): block b adds to counter lane b % kLanes; threads [src * kLanes, +kLanes) wait on src's lanes.
__global__ void signalSpreadKernel(Peers p, unsigned long long round) {
  __syncthreads();
  const int lane = blockIdx.x % kLanes;
  if (threadIdx.x < p.n) redSys(p.ctr[threadIdx.x] + (p.me * kLanes + lane) * kLaneStride, true);
  if (threadIdx.x < p.n * kLanes) {
    const int l = threadIdx.x % kLanes;
    const unsigned long long per_round = gridDim.x / kLanes + (l < int(gridDim.x % kLanes) ? 1 : 0);
    spinUntil(p.ctr[p.me] + threadIdx.x * kLaneStride, round * per_round);
  }
  __syncthreads();
}

// (h) (kSysFence): each block counts itself on its own GPU after a
// system-scope fence (its stores visible to the peers before the count); the
// last one adds 1 to every GPU's counter [me]. (j): no fence, the count is a
// GPU-scope acq_rel atomic: one system-scope release per grid, the last
// block's, which is cumulative over the counts it acquired.
template <bool kSysFence>
__global__ void signalLastKernel(Peers p, unsigned long long round) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long old;
    if (kSysFence) asm volatile("fence.acq_rel.sys;" ::: "memory");
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;"
                 : "=l"(old) : "l"(p.ctr[p.me] + kLocalCount) : "memory");
    last = old == round * gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x < p.n) redSys(p.ctr[threadIdx.x] + p.me, true);
  if (threadIdx.x < p.n) spinUntil(p.ctr[p.me] + threadIdx.x, round);
  __syncthreads();
}

// (k): the line of block b carries (b, round) twice; no fence, no counter.
__global__ void flaggedLineKernel(Peers p, unsigned long long round, int pdl) {
  pdlEnter(pdl);
  const unsigned long long word = (round << 32) | blockIdx.x;
  if (threadIdx.x < p.n) {
    unsigned long long* line = p.ctr[threadIdx.x] + kLinesAt + 2 * (p.me * kMaxBlocks + blockIdx.x);
    asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(line), "l"(word), "l"(word) : "memory");
    const unsigned long long* mine = p.ctr[p.me] + kLinesAt + 2 * (threadIdx.x * kMaxBlocks + blockIdx.x);
    unsigned long long a, b;
    do {
      asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(mine) : "memory");
    } while ((a >> 32) != round || (b >> 32) != round);
  }
  __syncthreads();
}

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("SKIPPED ll_floor: no GPU\n");
    return 0;
  }
  const int ng = ndev >= 2 ? 2 : 1;  // GPUs that take part
  const int kernels = 200;
  unsigned long long* ctr[2] = {nullptr, nullptr};
  for (int d = 0; d < ng; d++) {
    CK(cudaSetDevice(d));
    if (ng == 2) CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&ctr[d], kCtrBytes));
    CK(cudaMemset(ctr[d], 0, kCtrBytes));
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int variant = 0; variant < 15; variant++) {
    const int blocks = variant == 2 ? 1 : sms;
    float per_kernel[2] = {0, 0};
    // Counter rounds go on from the previous variant: reset both first.
    for (int d = 0; d < ng; d++) {
      CK(cudaSetDevice(d));
      CK(cudaMemset(ctr[d], 0, kCtrBytes));
      CK(cudaDeviceSynchronize());
    }
    std::vector<std::thread> th;
    for (int d = 0; d < ng; d++)
      th.emplace_back([&, d] {
        CK(cudaSetDevice(d));
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        int* sink;
        CK(cudaMalloc(&sink, 4));
        Peers p{{ctr[0], ctr[1]}, d, ng};
        cudaGraph_t g;
        cudaGraphExec_t ge;
        unsigned long long round = 0;
        auto capture = [&]() {
          CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          for (int k = 0; k < kernels; k++) {
            if (variant == 0) emptyKernel<<<blocks, 256, 0, s>>>();
            else if (variant == 3 && (k & 1)) smemKernel<8192><<<blocks, 256, 0, s>>>(sink);
            else if (variant == 3) smemKernel<29696><<<blocks, 256, 0, s>>>(sink);
            else if (variant == 6) signalSpreadKernel<<<blocks, 256, 0, s>>>(p, ++round);
            else if (variant == 7) signalLastKernel<true><<<blocks, 256, 0, s>>>(p, ++round);
            else if (variant == 8) signalWaitKernel<false><<<blocks, 256, 0, s>>>(p, ++round, 0);
            else if (variant == 9) signalLastKernel<false><<<blocks, 256, 0, s>>>(p, ++round);
            else if (variant == 10) flaggedLineKernel<<<blocks, 256, 0, s>>>(p, ++round, 0);
            else if (variant >= 4) {
              cudaLaunchConfig_t cfg = {};
              cudaLaunchAttribute attr[1];
              attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
              attr[0].val.programmaticStreamSerializationAllowed = 1;
              cfg.gridDim = blocks;
              cfg.blockDim = 256;
              cfg.stream = s;
              cfg.attrs = attr;
              cfg.numAttrs = 1;
              if (variant == 4) CK(cudaLaunchKernelEx(&cfg, emptyPdlKernel));
              else if (variant == 11) CK(cudaLaunchKernelEx(&cfg, emptyEarlyKernel));
              else if (variant == 12 || variant == 13)
                CK(cudaLaunchKernelEx(&cfg, flaggedLineKernel, p, ++round, variant == 12 ? 1 : 2));
              else CK(cudaLaunchKernelEx(&cfg, signalWaitKernel<true>, p, ++round, variant == 14 ? 2 : 1));
            } else signalWaitKernel<true><<<blocks, 256, 0, s>>>(p, ++round, 0);
          }
          CK(cudaStreamEndCapture(s, &g));
          CK(cudaGraphInstantiate(&ge, g, 0));
        };
        // One graph per replay: the counter targets grow with every kernel.
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        for (int rep = 0; rep < 3; rep++) {
          capture();
          CK(cudaEventRecord(a, s));
          CK(cudaGraphLaunch(ge, s));
          CK(cudaEventRecord(b, s));
          CK(cudaStreamSynchronize(s));
          float ms;
          CK(cudaEventElapsedTime(&ms, a, b));
          per_kernel[d] = ms * 1000 / kernels;
          CK(cudaGraphExecDestroy(ge));
          CK(cudaGraphDestroy(g));
        }
        CK(cudaStreamDestroy(s));
      });
    for (auto& t : th) t.join();
    const char* names[] = {"empty kernel", "signal + wait, one block per SM", "signal + wait, 1 block",
                           "empty, 29 KB / 8 KB shared alternating", "empty, PDL", "signal + wait, PDL",
                           "signal + wait, 8 spread counters", "signal + wait, last block signals",
                           "signal + wait, relaxed reductions", "signal + wait, last block releases",
                           "flagged lines, no counter", "empty, PDL, next let in early",
                           "flagged lines, PDL", "flagged lines, PDL, next let in early",
                           "signal + wait, PDL, next let in early"};
    if (ng == 2)
      printf("ll_floor: %-40s %d blocks: %.2f / %.2f us per kernel (GPU 0 / 1)\n", names[variant], blocks,
             per_kernel[0], per_kernel[1]);
    else
      printf("ll_floor: %-40s %d blocks: %.2f us per kernel (one GPU)\n", names[variant], blocks, per_kernel[0]);
  }
  return 0;
}
