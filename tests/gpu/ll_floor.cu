// Floor of a low-latency call on this machine: per-kernel time of a CUDA
// graph of `kernels` back-to-back kernels on each of two GPUs, for kernels
// that do (a) nothing, (b) what every LL kernel does at the least: each block
// adds 1 to a counter on every GPU (release reduction over NVLink) and waits
// until its own GPU's counters reached the blocks of all GPUs, (c) as (b) with
// one block, (d) as (a) but alternating 29 KB and 8 KB of static shared
// memory (as the dispatch and combine kernels do), (e) and (f): (a) and (b)
// launched with programmatic dependent launch (the kernel waits for the
// previous grid with griddepcontrol.wait).
// Build: nvcc -O2 -arch=sm_90 tests/gpu/ll_floor.cu -o build/ll_floor
#include <cuda_runtime.h>

#include <cstdio>
#include <thread>
#include <vector>

#include "cuda_check.h"

struct Peers {
  unsigned long long* ctr[2];  // counters [src] on each GPU
  int me, n;
};

__global__ void emptyKernel() {}
__global__ void emptyPdlKernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

template <int kSmem>
__global__ void smemKernel(int* sink) {
  __shared__ int s[kSmem / 4];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (s[(threadIdx.x + 1) % blockDim.x] == -1) *sink = 1;
}

__global__ void signalWaitKernel(Peers p, unsigned long long round, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  __syncthreads();
  if (threadIdx.x < p.n) {
    unsigned long long* c = p.ctr[threadIdx.x] + p.me;
    asm volatile("red.release.sys.global.add.u64 [%0], 1;" ::"l"(c) : "memory");
    const unsigned long long target = round * gridDim.x;
    const unsigned long long* mine = p.ctr[p.me] + threadIdx.x;
    unsigned long long got;
    do {
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(got) : "l"(mine) : "memory");
    } while (got < target);
  }
  __syncthreads();
}

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
    printf("SKIPPED ll_floor: needs 2 GPUs\n");
    return 0;
  }
  const int kernels = 200;
  unsigned long long* ctr[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&ctr[d], 64));
    CK(cudaMemset(ctr[d], 0, 64));
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int variant = 0; variant < 6; variant++) {
    const int blocks = variant == 2 ? 1 : sms;
    float per_kernel[2] = {0, 0};
    // Counter rounds go on from the previous variant: reset both first.
    for (int d = 0; d < 2; d++) {
      CK(cudaSetDevice(d));
      CK(cudaMemset(ctr[d], 0, 64));
      CK(cudaDeviceSynchronize());
    }
    std::vector<std::thread> th;
    for (int d = 0; d < 2; d++)
      th.emplace_back([&, d] {
        CK(cudaSetDevice(d));
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        int* sink;
        CK(cudaMalloc(&sink, 4));
        Peers p{{ctr[0], ctr[1]}, d, 2};
        cudaGraph_t g;
        cudaGraphExec_t ge;
        unsigned long long round = 0;
        auto capture = [&]() {
          CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          for (int k = 0; k < kernels; k++) {
            if (variant == 0) emptyKernel<<<blocks, 256, 0, s>>>();
            else if (variant == 3 && (k & 1)) smemKernel<8192><<<blocks, 256, 0, s>>>(sink);
            else if (variant == 3) smemKernel<29696><<<blocks, 256, 0, s>>>(sink);
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
              else CK(cudaLaunchKernelEx(&cfg, signalWaitKernel, p, ++round, 1));
            } else signalWaitKernel<<<blocks, 256, 0, s>>>(p, ++round, 0);
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
                           "empty, 29 KB / 8 KB shared alternating", "empty, PDL", "signal + wait, PDL"};
    printf("ll_floor: %-40s %d blocks: %.2f / %.2f us per kernel (GPU 0 / 1)\n", names[variant], blocks,
           per_kernel[0], per_kernel[1]);
  }
  return 0;
}
