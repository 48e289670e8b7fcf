// The CUDA backend of a build without CUDA (make CUDA=0): always unavailable.
#include "backend.h"
#include "debug.h"

namespace ep {

bool cudaBackendAvailable() { return false; }

bool cudaDeviceIdentity(int, int*, char*, size_t) { return false; }

epResult_t createCudaBackend(const BackendComm& comm, std::unique_ptr<Backend>*) {
  return setError(comm, epNotSupported, "this libmoeep was built without CUDA (make CUDA=0)");
}

epResult_t createCudaStager(const BackendComm& comm, std::unique_ptr<Stager>*) {
  return setError(comm, epNotSupported, "this libmoeep was built without CUDA (make CUDA=0)");
}

}  // namespace ep
