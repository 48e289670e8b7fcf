// A backend carries out the operations of a communicator on one kind of
// memory: host (src/host) or CUDA (src/cuda). The public entry points in
// api.cc validate every argument before a backend sees it, so backends may
// assume well-formed input. A backend sees its communicator through
// BackendComm (backend_comm.h), never epComm itself.
#pragma once

#include <cstddef>
#include <memory>

#include "backend_comm.h"
#include "handle.h"
#include "moeep.h"
#include "stager.h"

namespace ep {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // True when the caller's buffers are host memory the core may read (to check
  // expert ids before any communication); device memory is checked by kernels.
  virtual bool hostMemory() const { return false; }
  virtual size_t bufferBytes() const = 0;
  // Layout of this rank's tokens (local, no communication).
  virtual epResult_t layout(const epLayoutArgs_t& args, epStream_t stream) = 0;
  // New routing from args.topk_idx: fills h->routing's send side, exchanges
  // counts with every rank and fills the receive side (counts_known = true).
  // fn: the entry point that asked (epDispatch, epDispatchPrepare), named by
  // its errors.
  virtual epResult_t prepare(const char* fn, const epDispatchArgs_t& args, epHandle* h, epStream_t stream) = 0;
  // Moves rows with the routing of h (prepared, or cached from an earlier dispatch).
  // ids_routed: args.topk_idx are the very ids prepare() just routed (and
  // checked) in this call; other ids (a prepared handle's, a cached
  // re-dispatch's) are the backend's to check.
  virtual epResult_t dispatch(const epDispatchArgs_t& args, epHandle* h, bool ids_routed, epStream_t stream) = 0;
  virtual epResult_t combine(const epCombineArgs_t& args, epHandle* h, epStream_t stream) = 0;
  // Low latency (config.low_latency = 1). send_only: return once the data is
  // on its way; complete() then finishes the receive half.
  virtual epResult_t llDispatch(const epLowLatencyDispatchArgs_t& args, epHandle* h, bool send_only,
                                epStream_t stream) {
    (void)args, (void)h, (void)send_only, (void)stream;
    return epNotSupported;
  }
  virtual epResult_t llCombine(const epLowLatencyCombineArgs_t& args, epHandle* h, bool send_only,
                               epStream_t stream) {
    (void)args, (void)h, (void)send_only, (void)stream;
    return epNotSupported;
  }
  virtual epResult_t llComplete(epHandle* h, epStream_t stream) {
    (void)h, (void)stream;
    return epNotSupported;
  }
  // Frees h->backend_state.
  virtual void releaseHandle(epHandle* h) { (void)h; }
  // Unblocks waits after epCommAbort (the abort flag is already set).
  virtual void abort() {}
  // Shrink (docs/SHRINK.md): whether this backend can go on without dead
  // ranks; the number of its collective steps so far (the survivors agree on
  // the largest); and, once they agreed, the mask and the step number every
  // survivor continues from (the data of the call that failed is dropped).
  virtual bool canShrink() const { return false; }
  virtual uint64_t steps() const { return 0; }
  virtual epResult_t shrink(const std::vector<bool>& dead, uint64_t steps) {
    (void)dead;
    (void)steps;
    return epNotSupported;
  }
  // For a backend whose peers write into its memory (the CUDA backend):
  // quiesceForShrink, as epCommShrink begins, ends this rank's work that
  // may still wait for or write to peers and waits for it; resetForShrink
  // runs once this rank decided, before it tells the others so: every
  // survivor has quiesced by then (each did before its first agreement
  // message) and none goes on before every survivor's reset (the
  // agreement's final barrier waits for every survivor's decision).
  virtual epResult_t quiesceForShrink() { return epSuccess; }
  virtual epResult_t resetForShrink(const std::vector<bool>& dead) {
    (void)dead;
    return epSuccess;
  }
  // The transport that carries this rank's bytes to peer (another rank):
  // "shm", "cuda_ipc", a network transport's name.
  virtual const char* peerTransport(int peer) const = 0;
  // A network peer's connection as its transport describes it (false: peer
  // is not reached over the network).
  virtual bool peerConnInfo(int peer, epTransportConnInfo_v2_t* info) const {
    (void)peer, (void)info;
    return false;
  }
};

// Creates the host backend of comm: registers its buffer with the shm
// transport and maps every peer's (collective: needs the bootstrap).
epResult_t createHostBackend(const BackendComm& comm, std::unique_ptr<Backend>* out);
// Creates the staged backend: the host backend's algorithms on host copies of
// the caller's buffers, which stager moves (src/host/staged.cc). `name` is
// the backend's name in messages.
epResult_t createStagedBackend(const BackendComm& comm, std::unique_ptr<Stager> stager, const char* name,
                               std::unique_ptr<Backend>* out);
// A stager of host memory into host memory (EP_TEST_STAGED: the staged path
// tested without a GPU).
std::unique_ptr<Stager> makeHostStager();
// A stager of this rank's GPU memory through pinned host buffers
// (src/cuda/cuda_stager.cc), or epNotSupported without CUDA.
epResult_t createCudaStager(const BackendComm& comm, std::unique_ptr<Stager>* out);
// Creates the CUDA backend, or epNotSupported when the build or machine has none.
epResult_t createCudaBackend(const BackendComm& comm, std::unique_ptr<Backend>* out);
// True when this build has CUDA support and a device is visible.
bool cudaBackendAvailable();
// The CUDA device a rank with config.device = requested drives (-1: the
// current one) and its PCI bus id; false without CUDA or a GPU.
bool cudaDeviceIdentity(int requested, int* device, char* bus_id, size_t len);

}  // namespace ep
