// Loading kernels at init instead of at their first launch. Included by the
// .cu files only.
#pragma once

#include <cuda_runtime.h>

namespace ep {
namespace cuda {

// Under lazy module loading (CUDA's default on Linux since 12.2) a kernel is
// loaded at its first launch, and that load may wait for every kernel running
// on the device (CUDA Programming Guide, "Lazy Loading", potential hazards).
// Ranks of one process that share a GPU run kernels that wait for each other:
// a rank whose first launch of a kernel waits for the other rank's running
// kernel, which in turn waits for this launch, deadlocks until the timeout.
// Asking for a kernel's attributes loads it. Returns a cudaError_t as int.
template <typename... Kernels>
inline int preloadKernels(Kernels... kernels) {
  cudaFuncAttributes attr;
  cudaError_t e = cudaSuccess;
  ((e = e == cudaSuccess ? cudaFuncGetAttributes(&attr, kernels) : e), ...);
  return int(e);
}

}  // namespace cuda
}  // namespace ep
