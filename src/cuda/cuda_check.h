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
