// Host side of the CUDA backend's low-latency mode: registers and maps the LL
// buffers, keeps per-handle device state and launches ll_dispatch.cu /
// ll_combine.cu on the caller's stream. Owned by the CUDA backend when
// config.low_latency = 1.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "../backend_comm.h"
#include "../handle.h"
#include "../peer_buffers.h"
#include "../transport.h"
#include "host_notices.h"
#include "ll_common.h"

namespace ep {
namespace cuda {

class LLEngine {
 public:
  LLEngine(const BackendComm& comm, int device, int sms) : comm_(comm), dev_(device), sms_(sms) {}
  ~LLEngine();
  // Collective: registers this rank's LL buffer and maps every peer's.
  // peers carry each rank's cuda_device and bus_id.
  epResult_t init(const TransportEntry* ipc, const std::vector<epPeerInfo_v1_t>& peers);
  size_t bytes() const { return bytes_; }
  LLLocal* deviceLocal() const { return local_; }  // the words HostNotices writes
  const ErrorInfo* errorSlots() const { return err_host_; }  // host-mapped, [kErrorSlots]
  // Where the low-latency calls are logged (HostNotices::recordCall); set
  // before the first call.
  void setNotices(HostNotices* notices) { notices_ = notices; }
  // Rank r's LLLocal as mapped here (in the control area of its LL buffer).
  LLLocal* peerLocal(int r) const { return reinterpret_cast<LLLocal*>(view_.bufs[r] + kLLLocalOffset); }
  // This rank's signal counters (LLCtrl, at the start of its LL buffer): what
  // a high-throughput wait reads to find a peer in a low-latency call.
  const uint64_t* signalCounters() const { return reinterpret_cast<const uint64_t*>(view_.bufs[view_.rank]); }

  // The calls; their caller reports the kernels' errors first (both
  // families' slots: CudaBackend::checkKernelErrors, then checkErrors).
  epResult_t dispatch(const epLowLatencyDispatchArgs_t& args, epHandle* h, bool send_only, cudaStream_t stream);
  epResult_t combine(const epLowLatencyCombineArgs_t& args, epHandle* h, bool send_only, cudaStream_t stream);
  epResult_t complete(epHandle* h, cudaStream_t stream);
  void release(epHandle* h);
  // Errors the LL kernels left in their slots, reported by the next call of
  // either family (CudaBackend::checkKernelErrors, in its order): a failed
  // wait (kFailSlot, never cleared: the communicator is broken), then an
  // argument error (kArgSlot, reported once and cleared; epSuccess if none).
  bool waitFailed() const { return err_host_[kFailSlot].code != 0; }
  epResult_t reportFailedWait(const char* fn);
  bool argumentErrorPending() const { return err_host_[kArgSlot].code != 0; }
  // Reads and clears the argument slot; the caller then clears the claim
  // word (LLLocal::err_claim), in order behind the report.
  epResult_t reportArgumentError(const char* fn);
  // epCommShrink: this rank's buffer as at init, the removed ranks masked
  // (ll_engine.cc says when it may run), through stream s (the caller's
  // own, waited for here). Not thread-safe with calls.
  epResult_t resetForShrink(const std::vector<bool>& dead, cudaStream_t s);

 private:
  struct HandleState;
  void logTimes();
  epResult_t addSlot();  // callers hold slots_mu_ (or are init)
  epResult_t acquireSlot(LLHandleDev** out);

  BackendComm comm_;
  int dev_;
  int sms_;
  bool shrink_build_ = false;  // config.enable_shrink: the kernels' build that reads the mask (ll_variant.h)
  int slices_ = -1;  // EP_CUDA_LL_SLICES, read once at init
  bool pdl_ = false;  // programmatic dependent launch (EP_CUDA_LL_PDL, Hopper and later)
  int flag_tokens_ = 0;  // calls of at most this many tokens send flagged records (EP_CUDA_LL_FLAGGED)
  bool follow_peers_ = true;  // small calls send plain records beside a large peer (EP_CUDA_LL_FLAGGED_PEERS)
  int flag_cap_ = 0;  // the largest flag_tokens_ of any rank (agreed at init)
  // config.max_nodes_per_token, checked by a kernel before each dispatch's
  // where a token could exceed it (max_nodes > 0; node_limit.h).
  NodeLimitParams node_limit_{};
  size_t bytes_ = 0;
  LLView view_{};
  std::unique_ptr<PeerBuffers> buffers_;  // this rank's LL buffer, registered with cuda_ipc, and the peers' mapped
  LLLocal* local_ = nullptr;
  ErrorInfo* err_host_ = nullptr;  // [kErrorSlots], host-mapped
  HostNotices* notices_ = nullptr;
  std::mutex slots_mu_;
  std::vector<LLHandleDev*> free_slots_, all_slots_;
  size_t slot_bytes_ = 0;
  LLTiming* timing_ = nullptr;  // EP_CUDA_LL_TIMING
};

}  // namespace cuda
}  // namespace ep
