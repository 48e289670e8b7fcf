// CUDACHECK(call): in a member function of a class with `comm_` (the
// communicator), returns epUnhandledCudaError with the call, CUDA's message
// and the place when a CUDA runtime call fails, and clears CUDA's sticky
// last error.
#pragma once

#include <cuda_runtime.h>

#include "../checks.h"

#define CUDACHECK(call)                                                                        \
  do {                                                                                         \
    cudaError_t cuda_err_ = (call);                                                            \
    if (cuda_err_ != cudaSuccess) {                                                            \
      cudaGetLastError();                                                                      \
      return ::ep::setError(comm_, epUnhandledCudaError, "%s failed: %s (%s:%d)", #call,       \
                            cudaGetErrorString(cuda_err_), __FILE__, __LINE__);                \
    }                                                                                          \
  } while (0)

namespace ep {
namespace cuda {

// This thread's stream-capture mode set to relaxed for the scope's life. A
// communicator's pools (handle state) may grow during a call that is being
// captured into a CUDA graph; in the default capture modes CUDA refuses
// cudaMalloc then (it is not a stream operation, so the graph would not
// replay it, and the capture is invalidated). The memory belongs to the
// communicator, not to the graph, so the relaxed mode is the right one here.
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope() { cudaThreadExchangeStreamCaptureMode(&prev_); }
  ~RelaxedCaptureScope() { cudaThreadExchangeStreamCaptureMode(&prev_); }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  cudaStreamCaptureMode prev_ = cudaStreamCaptureModeRelaxed;
};

// Zeroes n bytes at p through a stream of its own and waits for it: neither
// the legacy default stream (which would wait for, and under capture
// conflict with, the caller's blocking streams) nor the caller's stream
// (which may be capturing).
inline cudaError_t zeroDeviceMemory(void* p, size_t n) {
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(p, 0, n, s);
  const cudaError_t e2 = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  return e != cudaSuccess ? e : e2;
}

}  // namespace cuda
}  // namespace ep
