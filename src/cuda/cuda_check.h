// CUDACHECK(call): in a member function of a class with `comm_` (its
// BackendComm), returns epUnhandledCudaError with the call, CUDA's message
// and the place when a CUDA runtime call fails, and clears CUDA's sticky
// last error. During the CUDA backend's init a test may make the Nth such
// call fail instead of making it (InitFaults below), to see each step unwind.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#include "../backend_comm.h"
#include "../checks.h"

#define CUDACHECK(call)                                                                        \
  do {                                                                                         \
    const bool cuda_injected_ = ::ep::cuda::injectedInitFailure();                             \
    const cudaError_t cuda_err_ = cuda_injected_ ? cudaErrorMemoryAllocation : (call);         \
    if (cuda_err_ != cudaSuccess) {                                                            \
      cudaGetLastError();                                                                      \
      return ::ep::setError(comm_, epUnhandledCudaError, "%s failed: %s%s (%s:%d)", #call,     \
                            cudaGetErrorString(cuda_err_),                                     \
                            cuda_injected_ ? ::ep::cuda::injectedNote() : "", __FILE__, __LINE__); \
    }                                                                                          \
  } while (0)

namespace ep {
namespace cuda {

// Fault injection for the tests of init's unwinding: EP_TEST_CUDA_FAIL_STEP=N
// makes the Nth checked CUDA step of a CUDA backend's init (each CUDACHECK,
// each allocation and zeroing of a handle slot) fail as if out of memory,
// without making the call. Read at every init (one process can try each
// step in turn) and counted per thread, since the ranks of epCommInitAll
// start on threads of their own. Outside an init the count is 0 and nothing
// fails.
inline long& initFailCountdown() {
  static thread_local long left = 0;
  return left;
}
inline bool injectedInitFailure() {
  long& left = initFailCountdown();
  return left > 0 && --left == 0;
}
// Arms the count for the life of one init (step <= 0: never).
class InitFaults {
 public:
  explicit InitFaults(long step) { initFailCountdown() = step > 0 ? step : 0; }
  ~InitFaults() { initFailCountdown() = 0; }
  InitFaults(const InitFaults&) = delete;
  InitFaults& operator=(const InitFaults&) = delete;
};

// The step of init that runs on this thread (CudaBackend::init names each),
// so that an injected failure says which step it failed.
inline const char*& initStepName() {
  static thread_local const char* name = nullptr;
  return name;
}
// What the message of an injected failure adds: " (injected:
// EP_TEST_CUDA_FAIL_STEP, init step NAME)".
inline const char* injectedNote() {
  static thread_local char note[160];
  const char* step = initStepName();
  snprintf(note, sizeof(note), " (injected: EP_TEST_CUDA_FAIL_STEP%s%s)", step ? ", init step " : "",
           step ? step : "");
  return note;
}

// Errors that a launch cannot cause itself (it fails synchronously only on
// its configuration or resources): a kernel that ran before faulted, and the
// CUDA context stays unusable.
inline bool stickyKernelError(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
      return true;
    default:
      return false;
  }
}

// The result of one of our kernel launches, judged by the launch's own return
// (cudaLaunchKernel / cudaLaunchKernelEx), never by CUDA's last error, which
// may hold an error that an earlier call of this library left on the
// thread. (The library's CUDA runtime is its own, linked in: an error pending
// in the caller's runtime never reaches it.) `pending` is
// cudaPeekAtLastError() taken just before the launch. A fault of an earlier
// kernel, the caller's or ours, reaches this runtime as the failure of its
// next launch: the message says that the error was there before it.
inline epResult_t launchFailure(const BackendComm& comm, const char* fn, const char* kernel, cudaError_t pending, int err) {
  const cudaError_t e = cudaError_t(err);
  cudaGetLastError();
  if (stickyKernelError(e))
    return setError(comm, epUnhandledCudaError,
                    "%s: launching %s failed: %s, an error CUDA already held before libmoeep launched anything "
                    "(a fault of an earlier kernel on this device, the caller's or this library's: the CUDA "
                    "context cannot be used any more)",
                    fn, kernel, cudaGetErrorString(e));
  if (pending != cudaSuccess)
    return setError(comm, epUnhandledCudaError,
                    "%s: launching %s failed: %s (an earlier CUDA call of this library on this thread had left "
                    "%s pending)",
                    fn, kernel, cudaGetErrorString(e), cudaGetErrorString(pending));
  return setError(comm, epUnhandledCudaError, "%s: launching %s failed: %s", fn, kernel, cudaGetErrorString(e));
}

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
