// The CUDA backend: the operations of docs/SEMANTICS.md on device memory between the GPUs of
// one node, through peer-mapped buffers set up by the cuda_ipc transport.
// Host code only: it sizes and maps the communication buffers, keeps the
// per-handle device state, launches the kernels of layout.cu / dispatch.cu /
// combine.cu on the caller's stream and turns the kernels' error slot into
// result codes. Outputs match the host backend bit for bit.
//
// Its life (cuda_backend.cc): init is a sequence of named steps, each of
// which owns what it allocates (an owner object below, kept only once the
// step succeeded), so that a step that fails frees its own part and the
// backend's destructor unwinds the steps before it. Its calls and their
// error reports: cuda_calls.cc.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "../backend.h"
#include "../peer_buffers.h"
#include "../transport.h"
#include "cuda_common.h"
#include "handle_slots.h"
#include "host_notices.h"
#include "ll_engine.h"
#include "own_work.h"

namespace ep {
namespace cuda {

// Makes dev current for the life of the guard and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != dev) cudaSetDevice(dev);
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// What a rank's high-throughput kernels keep for themselves, allocated in
// one step of init and freed with its owner: device memory (DevLocal, then
// the layout's and the routing kernel's scratch), the host-mapped error
// slots, and the pinned state an exact-sized dispatch waits for.
struct RankState {
  DevLocal* local = nullptr;
  size_t local_bytes = 0;             // DevLocal and both scratch areas
  int* layout_scratch = nullptr;
  uint64_t* route_scratch = nullptr;  // the routing kernel's per-tile counts
  ErrorInfo* err_host = nullptr;      // [kErrorSlots], host-mapped
  ErrorInfo* err_dev = nullptr;       // the device's view of err_host
  HState* hs_host = nullptr;          // pinned, for the exact-sizing count wait
  RankState() = default;
  ~RankState();
  RankState(const RankState&) = delete;
  RankState& operator=(const RankState&) = delete;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const BackendComm& comm) : comm_(comm) {}
  ~CudaBackend() override;
  epResult_t init();

  const char* name() const override { return "cuda"; }
  size_t bufferBytes() const override { return buffer_bytes_ + (ll_ ? ll_->bytes() : 0); }
  epResult_t layout(const epLayoutArgs_t& args, epStream_t stream) override;
  epResult_t prepare(const char* fn, const epDispatchArgs_t& args, epHandle* h, epStream_t stream) override;
  epResult_t dispatch(const epDispatchArgs_t& args, epHandle* h, bool ids_routed, epStream_t stream) override;
  epResult_t combine(const epCombineArgs_t& args, epHandle* h, epStream_t stream) override;
  // The low-latency calls report both families' kernel errors first
  // (checkKernelErrors: this family's slots, then the engine's), as every
  // call does.
  epResult_t llDispatch(const epLowLatencyDispatchArgs_t& args, epHandle* h, bool send_only,
                        epStream_t stream) override;
  epResult_t llCombine(const epLowLatencyCombineArgs_t& args, epHandle* h, bool send_only,
                       epStream_t stream) override;
  epResult_t llComplete(epHandle* h, epStream_t stream) override;
  void releaseHandle(epHandle* h) override;
  // epCommAbort: this rank's waits leave, and the peers' waits for it too
  // (its call log says it aborted: their watchers mark it gone).
  void abort() override;
  // Shrink (docs/SHRINK.md, "GPUs"): both kinds of calls, one node. The
  // agreement needs no step count here: the survivors' buffers start again
  // as at init.
  bool canShrink() const override { return true; }
  epResult_t quiesceForShrink() override;
  epResult_t resetForShrink(const std::vector<bool>& dead) override;
  epResult_t shrink(const std::vector<bool>& dead, uint64_t steps) override {
    (void)dead;
    (void)steps;
    return epSuccess;  // done in resetForShrink, before the final barrier
  }
  // One node: every peer's memory is mapped through cuda_ipc.
  const char* peerTransport(int) const override { return "cuda_ipc"; }

 private:
  // ---- init's steps, in order (cuda_backend.cc) ----
  struct InitContext;
  struct InitStep;
  static const InitStep kInitSteps[];
  epResult_t chooseDevice(InitContext& ctx);
  epResult_t readTuning(InitContext& ctx);
  epResult_t findTransport(InitContext& ctx);
  epResult_t shareGpus(InitContext& ctx);
  epResult_t checkPeerAccess(InitContext& ctx);
  epResult_t sizeBuffer(InitContext& ctx);
  epResult_t mapBuffer(InitContext& ctx);
  epResult_t allocateRankState(InitContext& ctx);
  epResult_t allocateHandleSlots(InitContext& ctx);
  epResult_t loadKernels(InitContext& ctx);
  epResult_t startLowLatency(InitContext& ctx);
  epResult_t startWatcher(InitContext& ctx);
  epResult_t finishSetup(InitContext& ctx);
  // Parts of the steps.
  epResult_t checkArch(const cudaDeviceProp& prop);
  void limitExpertCounters(const cudaDeviceProp& prop);
  epResult_t watchOtherFamily();

  // ---- the calls (cuda_calls.cc) ----
  epResult_t checkExpertCounters(const char* fn) const;
  epResult_t resetHighThroughput(const std::vector<bool>& dead, cudaStream_t s);
  uint32_t shrinks_ = 0;  // resets so far (DevLocal::shrinks)
  // What the kernels and the watcher reported, in order (cuda_calls.cc);
  // with argument_errors false only what ends the communicator (failed
  // waits, ranks out of step, a peer that left), for a call that must go
  // ahead whatever argument error is pending (a handle's first dispatch).
  epResult_t checkKernelErrors(const char* fn, cudaStream_t stream, bool argument_errors = true);
  // A low-latency call of the engine between the reports and the end mark.
  template <typename Call>
  epResult_t llCall(const char* fn, epStream_t stream, Call call);
  // An argument error's claim word cleared for the next report: on the
  // caller's stream, or beside it while that stream captures a graph. A
  // clearing that fails is logged and tried again at the next call (until
  // then the kernels cannot report a new argument error).
  void clearErrorClaim(int* claim, cudaStream_t stream);
  epResult_t refuseHostCount() const {
    return setError(comm_, epInvalidUsage,
                    "epDispatch: num_recv is a host pointer but the handle's counts are on the device only (it "
                    "came from a dispatch with EP_DISPATCH_NO_HOST_SYNC): pass the flag again");
  }
  // A kernel's wait failed (timeout, exited peer, ranks out of step): the
  // communicator cannot go on (the argument errors it reports can).
  bool kernelFailedForGood() const { return notices_->kernelsReportedFailure() || notices_->outOfStep(); }
  epResult_t reportFailedWait(const char* fn);
  epResult_t reportArgumentError(const char* fn, cudaStream_t stream);
  CommView view() const;

  BackendComm comm_;
  int dev_ = 0;
  // Tuning (readTuning). Measured on 2 x H200, EP2, 4096 and 8192 tokens, 32
  // SMs (docs/BENCHMARKS.md); the dispatch split depends on the row size.
  int channels_ = 32;
  int send_warps_ = 6, recv_warps_ = 10, push_warps_ = 4, reduce_warps_ = 12;
  int chunk_tokens_ = 16;
  std::string counters_too_small_;  // why epLayout / epDispatch cannot run here (limitExpertCounters)
  // The high-throughput buffer's geometry (sizeBuffer).
  size_t row_stride_ = 0, meta_stride_ = 0, rows_off_ = 0, meta_off_ = 0, buffer_bytes_ = 0;
  // What the steps own, each set once its step succeeded.
  const TransportEntry* ipc_ = nullptr;
  std::unique_ptr<PeerBuffers> buffer_;  // this rank's buffer, registered with cuda_ipc, and the peers' mapped
  std::vector<char*> bufs_;              // [R] every rank's buffer as mapped here (buffer_)
  std::unique_ptr<RankState> state_;
  std::unique_ptr<HandleSlots> slots_;
  std::unique_ptr<LLEngine> ll_;                // config.low_latency = 1
  std::unique_ptr<HostNotices> notices_;  // exited peers, calls out of step, abort
  OwnWork own_work_;                      // what the destroy waits for (own_work.h)
  std::vector<int*> claims_to_clear_;     // error claims whose clearing failed (clearErrorClaim)
};

}  // namespace cuda
}  // namespace ep
