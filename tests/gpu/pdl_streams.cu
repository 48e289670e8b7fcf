// Programmatic dependent launch on every kind of stream a caller may pass to
// the low-latency calls: the legacy default stream (0), the per-thread
// default stream, a blocking and a non-blocking stream. On each, a primary
// kernel lets its dependents in at once (griddepcontrol.launch_dependents)
// and writes a word 200 us later; the secondary, launched the way llLaunch
// launches the LL kernels (cudaLaunchAttributeProgrammaticStreamSerialization),
// waits with griddepcontrol.wait (as llEnter) and must read the word. Fails
// when a launch is refused or the secondary reads early.
// Build: nvcc -O2 -arch=sm_90 tests/gpu/pdl_streams.cu -o build/tests/pdl_streams
#include <cuda_runtime.h>

#include <cstdio>

#include "gpu/cuda_check.h"
#include "early_producer.cuh"

namespace {

constexpr int kWritten = 42;

__global__ void primaryKernel(int* word, unsigned long long delay_ns) {
  letDependentsInThenWait(delay_ns);
  if (threadIdx.x == 0 && blockIdx.x == 0) *word = kWritten;
}

__global__ void secondaryKernel(const int* word, int* seen) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0 && blockIdx.x == 0) *seen = *word;
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("SKIPPED pdl_streams: no GPU\n");
    return 0;
  }
  int major = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (major < 9) {
    printf("SKIPPED pdl_streams: compute capability %d.x (the library launches with PDL from 9.0 on)\n", major);
    return 0;
  }
  int *word, *seen;
  CK(cudaMalloc(&word, 4));
  CK(cudaMalloc(&seen, 4));
  cudaStream_t blocking, nonblocking;
  CK(cudaStreamCreate(&blocking));
  CK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  const struct {
    const char* name;
    cudaStream_t stream;
  } cases[] = {{"legacy default stream", nullptr},
               {"per-thread default stream", cudaStreamPerThread},
               {"blocking stream", blocking},
               {"non-blocking stream", nonblocking}};
  int failed = 0;
  for (const auto& c : cases) {
    CK(cudaMemset(word, 0, 4));
    CK(cudaMemset(seen, 0xff, 4));
    CK(cudaDeviceSynchronize());
    primaryKernel<<<8, 128, 0, c.stream>>>(word, 200000);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(sms);
    cfg.blockDim = dim3(256);
    cfg.stream = c.stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t launched = cudaLaunchKernelEx(&cfg, secondaryKernel, (const int*)word, seen);
    CK(cudaDeviceSynchronize());
    int got = -1;
    CK(cudaMemcpy(&got, seen, 4, cudaMemcpyDeviceToHost));
    const bool ok = launched == cudaSuccess && got == kWritten;
    failed += ok ? 0 : 1;
    printf("pdl_streams: %-26s launch %s, the secondary read %d: %s\n", c.name, cudaGetErrorString(launched), got,
           ok ? "OK" : "FAILED");
  }
  printf("pdl_streams: %s\n", failed ? "FAILED" : "PASSED");
  return failed ? 1 : 0;
}
