// The CUDA backend's calls: each reports what the kernels and the host's
// watcher found since the last call (checkKernelErrors), then launches its
// kernels on the caller's stream. Its life (init, destroy): cuda_backend.cc.
//
// Host-visible points (where a kernel's error is reported): the start of every
// call, and the count wait of a dispatch without EP_DISPATCH_NO_HOST_SYNC.
#include <cuda_runtime.h>

#include <algorithm>

#include <string>
#include <vector>

#include "../call_log.h"
#include "../checks.h"
#include "../data_types.h"
#include "../sizes.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "node_limit.h"

namespace ep {
namespace cuda {

// epCommAbort: this rank's waits leave, and the peers' waits for it too
// (its call log says it aborted: their watchers mark it gone).
void CudaBackend::abort() {
  if (!notices_) return;
  notices_->abort();
  notices_->announceClosed(kClosedAborted);
}

// epCommShrink begins: every wait of this rank's kernels leaves (the call
// that failed, or one a peer's shrink interrupted), and the shrink waits
// until they have ended, so that nothing of this rank writes into a peer's
// buffer or reads its own once the survivors reset them.
epResult_t CudaBackend::quiesceForShrink() {
  DeviceGuard g(dev_);
  if (notices_) notices_->abort();
  const cudaError_t e = own_work_.wait();
  if (e != cudaSuccess)
    return setError(comm_, epUnhandledCudaError, "epCommShrink: waiting for this rank's kernels: %s", cudaGetErrorString(e));
  return epSuccess;
}

epResult_t CudaBackend::resetForShrink(const std::vector<bool>& dead) {
  DeviceGuard g(dev_);
  // A stream of its own: the legacy default stream would wait for other
  // work of the process (another communicator's kernel stuck on the dead
  // rank) while the watcher is held off, and conflict with a capture.
  RelaxedCaptureScope relaxed;
  cudaStream_t s = nullptr;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const epResult_t r = notices_->forgetAfterShrink(dead, [&] {
    if (ll_) EPCHECK(ll_->resetForShrink(dead, s));
    return resetHighThroughput(dead, s);
  });
  cudaStreamDestroy(s);
  return r;
}

// The high-throughput state as at init, with the removed ranks in DevLocal's
// mask: every epoch-tagged word (this rank's Ctrl, which peers write; the
// routing scratch) and the epoch itself start again from 0 on every
// survivor, the handle slots are zeroed (a failed call may have left expert
// counts half added; a handle routed before is stale from here on:
// htStaleHandle), the failure slots cleared. The survivors' kernels have
// ended (quiesceForShrink) and none starts before every survivor's reset
// (the agreement's final barrier).
epResult_t CudaBackend::resetHighThroughput(const std::vector<bool>& dead, cudaStream_t s) {
  DevLocal fresh{};
  CUDACHECK(cudaMemcpyAsync(&fresh.watch, &state_->local->watch, sizeof(fresh.watch), cudaMemcpyDeviceToHost, s));
  CUDACHECK(cudaStreamSynchronize(s));
  for (int r = 0; r < comm_.nranks() && r < kMaxRanks; r++)
    if (dead[size_t(r)]) fresh.dead |= 1u << r;
  fresh.shrinks = ++shrinks_;
  CUDACHECK(cudaMemcpyAsync(state_->local, &fresh, sizeof(fresh), cudaMemcpyHostToDevice, s));
  CUDACHECK(cudaMemsetAsync(reinterpret_cast<char*>(state_->local) + 256, 0, state_->local_bytes - 256, s));
  CUDACHECK(cudaMemsetAsync(bufs_[size_t(comm_.rank())], 0, sizeof(Ctrl), s));
  CUDACHECK(slots_->zeroAll(s));
  CUDACHECK(cudaStreamSynchronize(s));  // fresh is on this stack
  memset(static_cast<void*>(state_->err_host), 0, kErrorSlots * sizeof(ErrorInfo));
  return epSuccess;
}

CommView CudaBackend::view() const {
  CommView v{};
  v.rank = comm_.rank();
  v.nranks = comm_.nranks();
  v.channels = channels_;
  v.num_experts = comm_.config().num_experts;
  v.experts_per_rank = comm_.localExperts();
  for (int r = 0; r < comm_.nranks(); r++) v.bufs[r] = bufs_[r];
  v.rows_off = rows_off_;
  v.meta_off = meta_off_;
  v.row_stride = row_stride_;
  v.meta_stride = meta_stride_;
  v.local = state_->local;
  v.err = state_->err_dev;
  v.timeout_ns = (unsigned long long)comm_.config().timeout_ms * 1000000ull;
  return v;
}

void CudaBackend::releaseHandle(epHandle* h) {
  if (h->low_latency) {
    if (ll_) ll_->release(h);
    return;
  }
  auto* s = static_cast<HandleSlot*>(h->backend_state);
  if (s == nullptr) return;
  slots_->release(s);
  h->backend_state = nullptr;
}

// A low-latency call of the engine: the kernels' reports first, as for
// every call; the call's end marked on its stream whatever it returned (a
// kernel of the call may have been launched before a failure).
template <typename Call>
epResult_t CudaBackend::llCall(const char* fn, epStream_t stream, Call call) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  EPCHECK(checkKernelErrors(fn, s));
  const epResult_t res = call(s);
  own_work_.mark(s);
  return res;
}

epResult_t CudaBackend::llDispatch(const epLowLatencyDispatchArgs_t& args, epHandle* h, bool send_only,
                                   epStream_t stream) {
  return llCall("epLowLatencyDispatch", stream, [&](cudaStream_t s) { return ll_->dispatch(args, h, send_only, s); });
}

epResult_t CudaBackend::llCombine(const epLowLatencyCombineArgs_t& args, epHandle* h, bool send_only,
                                  epStream_t stream) {
  return llCall("epLowLatencyCombine", stream, [&](cudaStream_t s) { return ll_->combine(args, h, send_only, s); });
}

epResult_t CudaBackend::llComplete(epHandle* h, epStream_t stream) {
  return llCall("epLowLatencyComplete", stream, [&](cudaStream_t s) { return ll_->complete(h, s); });
}

epResult_t CudaBackend::checkExpertCounters(const char* fn) const {
  if (counters_too_small_.empty()) return epSuccess;
  return setError(comm_, epNotSupported, "%s: %s", fn, counters_too_small_.c_str());
}

namespace {

const char* whatName(int what) {
  switch (what) {
    case kWhatPrevious: return "the end of its previous call";
    case kWhatCounts: return "dispatch counts";
    case kWhatDispatchInfo: return "dispatch channel info";
    case kWhatDispatchData: return "dispatch rows";
    case kWhatCombineData: return "combine rows";
    default: return "?";
  }
}

}  // namespace

// The kernels' kinds are the call log's, so a report names them as it does.
static_assert(int(kHtRouting) == kCallRouting && int(kHtDispatch) == kCallDispatch &&
                  int(kHtCombine) == kCallCombine,
              "a high-throughput kernel's kind is its call's (callKindName)");

// Ranks found out of step by the host (HostNotices: the call logs differ)
// first, then the failure slots (the communicator is broken; a rank whose
// low-latency call failed, because a peer found it out of step say, learns it
// at its next call of either family, not only at its next low-latency one),
// then a peer that left its communicator while no kernel waited for it, then
// the argument errors of the low-latency kernels and of this family.
epResult_t CudaBackend::checkKernelErrors(const char* fn, cudaStream_t stream, bool argument_errors) {
  if (!claims_to_clear_.empty()) {  // a clearing that failed before (clearErrorClaim)
    std::vector<int*> pending;
    pending.swap(claims_to_clear_);
    for (int* claim : pending) clearErrorClaim(claim, stream);
  }
  if (const char* out_of_step = notices_->outOfStep()) {
    comm_.markFailed(epInvalidUsage);
    return setError(comm_, epInvalidUsage, "%s: %s", fn, out_of_step);
  }
  if (state_->err_host[kFailSlot].code != 0) return reportFailedWait(fn);
  if (ll_ && ll_->waitFailed()) return ll_->reportFailedWait(fn);
  const int closed = notices_->closedPeer();
  if (closed >= 0) {  // no kernel waited for it: refused before any kernel writes into its buffers
    comm_.markFailed(epRemoteError);
    return setError(comm_, epRemoteError,
                    "%s: %s, so rank %d (GPU %d) cannot make collective calls on it any more; destroy this "
                    "communicator",
                    fn, notices_->goneWhat(closed).c_str(), comm_.rank(), dev_);
  }
  if (!argument_errors) return epSuccess;
  if (ll_ && ll_->argumentErrorPending()) {
    const epResult_t reported = ll_->reportArgumentError(fn);  // read and cleared before the claim is
    clearErrorClaim(&ll_->deviceLocal()->err_claim, stream);
    return reported;
  }
  if (state_->err_host[kArgSlot].code != 0) return reportArgumentError(fn, stream);
  return epSuccess;
}

// The claim is the first-writer-wins word of the argument slot: cleared
// behind the report so that a later kernel can report. On the caller's
// stream, in order after the kernels before it; but a stream that is
// capturing a graph would take the clearing into the graph (the claim would
// stay taken until the graph runs, hiding an eager call's report meanwhile,
// and each replay would clear it again, wiping a report it did not read):
// then it is cleared at once on a stream of its own.
void CudaBackend::clearErrorClaim(int* claim, cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &st);
  if (e == cudaSuccess && st == cudaStreamCaptureStatusNone) {
    e = cudaMemsetAsync(claim, 0, sizeof(int), stream);
  } else if (e == cudaSuccess) {
    RelaxedCaptureScope relaxed;
    e = zeroDeviceMemory(claim, sizeof(int));
  }
  if (e == cudaSuccess) return;
  cudaGetLastError();
  EP_WARN(kSubsysCuda, "cannot clear the kernels' error claim (%s): tried again at the next call; until then a "
          "new argument error found by a kernel is not reported", cudaGetErrorString(e));
  if (std::find(claims_to_clear_.begin(), claims_to_clear_.end(), claim) == claims_to_clear_.end())
    claims_to_clear_.push_back(claim);
}

// A wait of a high-throughput kernel failed (err[kFailSlot], never cleared).
epResult_t CudaBackend::reportFailedWait(const char* fn) {
  const ErrorInfo& e = state_->err_host[kFailSlot];
  const int code = e.code, what = e.what, peer = e.peer, channel = e.channel;
  const long long a = e.a, b = e.b;
  if (code == epRemoteError) {
    comm_.markFailed(epRemoteError);
    return setError(comm_, epRemoteError,
                    "%s: %s while rank %d (GPU %d) waited for it in %s (channel %d); the communicator cannot be "
                    "used any more",
                    fn, notices_->describeGone(peer).c_str(), comm_.rank(), dev_, whatName(what), channel);
  }
  if (code == epTimeout) {
    comm_.markFailed(epTimeout);
    const std::string progress = notices_->progressNote(peer);
    return setError(comm_, epTimeout,
                    "%s: rank %d (GPU %d) waited more than %d ms for rank %d in %s (channel %d): that rank "
                    "stopped, or is in another call (calls out of order, or a low-latency call against a "
                    "high-throughput one)%s; the communicator cannot be used any more",
                    fn, comm_.rank(), dev_, comm_.config().timeout_ms, peer, whatName(what), channel, progress.c_str());
  }
  comm_.markFailed(epInvalidUsage);  // a wait found the peer in another call (device.cuh: peerOutOfStep)
  if (b == kOutOfStepLowLatency)
    return setError(comm_, epInvalidUsage,
                    "%s: rank %d is in a low-latency call while rank %d (GPU %d) waited for it in %s of a "
                    "high-throughput call: ranks must issue the same collective calls in the same order; the "
                    "communicator cannot be used any more",
                    fn, peer, comm_.rank(), dev_, whatName(what));
  return setError(comm_, epInvalidUsage,
                  "%s: rank %d is in %s while rank %d (GPU %d) waited for it in %s of %s (collective kernel %lld "
                  "of each): ranks must issue the same collective calls in the same order; the communicator "
                  "cannot be used any more",
                  fn, peer, callKindName(int(b >> 8)), comm_.rank(), dev_, whatName(what), callKindName(int(b & 0xff)),
                  a);
}

// An argument error found by a kernel (err[kArgSlot]): reported once, then
// the communicator goes on.
epResult_t CudaBackend::reportArgumentError(const char* fn, cudaStream_t stream) {
  ErrorInfo& e = state_->err_host[kArgSlot];
  const int code = e.code, what = e.what, peer = e.peer;
  const long long a = e.a, b = e.b;
  e.code = 0;
  clearErrorClaim(&state_->local->err_claim, stream);
  if (what == kWhatBadTopk) {
    return setError(comm_, epInvalidArgument,
                    "%s: an earlier call on this stream had topk_idx entry %lld (flat index) = %lld, not -1 "
                    "or an expert id in [0, %d); it was treated as -1",
                    fn, a, b, comm_.config().num_experts);
  }
  if (what == kWhatCapacity)
    return setError(comm_, epInvalidArgument,
                    "%s: an earlier dispatch received %lld rows but recv_capacity was %lld; no row was "
                    "written",
                    fn, a, b);
  if (what == kWhatNodeLimit)
    return setError(comm_, epInvalidArgument,
                    "%s: token %lld of a layout or dispatch on this stream (an earlier call, or this exact-sized "
                    "dispatch after its rows moved) selects experts on %lld nodes, more than "
                    "config.max_nodes_per_token = %d",
                    fn, a, b, comm_.config().max_nodes_per_token);
  if (what == kWhatStaleHandle)
    return setError(comm_, epInvalidUsage,
                    "%s: a CUDA graph replayed the dispatch or combine of a handle routed before epCommShrink "
                    "(shrink %lld; now %lld): it ran nothing; capture that layer again with its dispatch's "
                    "routing (a dispatch with topk_idx)",
                    fn, a, b);
  if (what == kWhatWiderTopk)
    return setError(comm_, epInvalidUsage,
                    "%s: in an earlier dispatch rank %d passed num_topk = %lld, more than this rank's %lld (the "
                    "columns of recv_topk_idx): a rank may pass fewer top-k columns than its peers, not more; "
                    "that dispatch's recv_topk_idx / weights and recv_tokens_per_expert are not valid",
                    fn, peer, a, b);
  return setError(comm_, epResult_t(code), "%s: an earlier kernel failed (what %d)", fn, what);
}

epResult_t CudaBackend::layout(const epLayoutArgs_t& a, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  EPCHECK(checkKernelErrors("epLayout", s));
  EPCHECK(checkExpertCounters("epLayout"));
  LayoutParams p{};
  p.topk = a.topk_idx;
  p.idx64 = a.topk_idx_type == epInt64;
  p.num_tokens = a.num_tokens;
  p.num_topk = a.num_topk;
  p.num_experts = comm_.config().num_experts;
  p.experts_per_rank = comm_.localExperts();
  p.nranks = comm_.nranks();
  p.num_nodes = comm_.nodes().num_nodes;
  for (int r = 0; r < comm_.nranks(); r++) p.node_of_rank[r] = comm_.nodes().node_of_rank[r];
  p.max_nodes = nodeLimitToCheck(comm_);
  p.tokens_per_rank = a.tokens_per_rank;
  p.tokens_per_node = a.tokens_per_node;
  p.tokens_per_expert = a.tokens_per_expert;
  p.is_token_in_rank = a.is_token_in_rank;
  p.scratch = state_->layout_scratch;
  p.local = state_->local;
  p.err = state_->err_dev;
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = launchLayout(p, s))
    return launchFailure(comm_, "epLayout", "the layout kernel", pending, err);
  own_work_.mark(s);
  return epSuccess;
}

epResult_t CudaBackend::prepare(const char* fn, const epDispatchArgs_t& a, epHandle* h, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  EPCHECK(checkKernelErrors(fn, s));
  EPCHECK(checkExpertCounters(fn));
  const bool sync = !(a.flags & EP_DISPATCH_NO_HOST_SYNC);
  if (sync) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDACHECK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusNone)
      return setError(comm_, epInvalidUsage,
                      "%s: the stream is being captured: exact output sizing needs a host wait; "
                      "pass EP_DISPATCH_NO_HOST_SYNC with a recv_capacity",
                      fn);
  }
  HandleSlot* slot = nullptr;
  EPCHECK(slots_->acquire(&slot));
  if (h->backend_state) releaseHandle(h);
  h->backend_state = slot;
  RoutingParams p{};
  p.cv = view();
  p.hv = slot->hv;
  p.scratch = state_->route_scratch;
  p.topk = a.topk_idx;
  p.idx64 = a.topk_idx_type == epInt64;
  p.num_tokens = a.num_tokens;
  p.num_topk = a.num_topk;
  p.max_nodes = nodeLimitToCheck(comm_);
  nodeRanks(comm_, p.node_ranks);
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = launchRouting(p, s))
    return launchFailure(comm_, fn, "the routing kernel", pending, err);
  notices_->recordCall(kCallRouting, s);
  own_work_.mark(s);
  h->routing = Routing();
  h->routing.nranks = comm_.nranks();
  h->routing.num_tokens = a.num_tokens;
  h->routing.num_topk = a.num_topk;
  h->counts_known = false;
  if (!sync) return epSuccess;
  // Exact sizing: the documented device-to-host wait for the counts.
  CUDACHECK(cudaMemcpyAsync(state_->hs_host, slot->hv.hs, sizeof(HState), cudaMemcpyDeviceToHost, s));
  CUDACHECK(cudaStreamSynchronize(s));
  if (kernelFailedForGood()) return checkKernelErrors(fn, s);
  // epCommAbort from another thread ended the routing kernel's waits (they
  // leave without a report): the counts are those of an unfinished routing.
  if (comm_.aborted())
    return setError(comm_, epAborted, "%s: the communicator was aborted while this rank waited for the dispatch "
                    "counts", fn);
  std::vector<int> recv_count(state_->hs_host->recv_count, state_->hs_host->recv_count + comm_.nranks());
  buildRecvSide(recv_count, &h->routing);
  h->counts_known = true;
  return epSuccess;
}

epResult_t CudaBackend::dispatch(const epDispatchArgs_t& a, epHandle* h, bool ids_routed, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  // A handle's first dispatch is launched whatever argument error the kernels
  // reported meanwhile (its own routing kernel may have found a bad id just
  // now): the peers' dispatches wait for its rows. What ends the
  // communicator stops it as it stops any call: a failed wait, ranks out of
  // step, and a peer that destroyed or aborted its communicator (whose
  // buffers the kernel would write into after they were freed). With exact
  // sizing the dispatch reports an argument error already there after the
  // rows moved (its own kernel's reports come at the next call, as always);
  // in capacity mode the next call does.
  const bool first = !h->dispatched;
  const bool report_after = first && h->counts_known && state_->err_host[kArgSlot].code != 0;
  EPCHECK(checkKernelErrors("epDispatch", s, !first));
  if (comm_.aborted())  // an abort since prepare's wait: its kernels would leave at once
    return setError(comm_, epAborted, "epDispatch: the communicator was aborted during the call");
  auto* slot = static_cast<HandleSlot*>(h->backend_state);
  if (slot == nullptr) return setError(comm_, epInternalError, "epDispatch: handle without routing state");
  const Config& cfg = comm_.config();
  const bool capacity_mode = (a.flags & EP_DISPATCH_NO_HOST_SYNC) != 0;
  // A host num_recv for counts that are on the device only: a cached
  // re-dispatch is refused before anything is launched, so that it can be
  // made again; a handle's first dispatch is launched all the same (the
  // peers wait for its rows) and refused after.
  const bool host_count_unknown = !capacity_mode && a.num_recv && !h->counts_known;
  if (host_count_unknown && !first) return refuseHostCount();
  DispatchParams p{};
  p.cv = view();
  p.hv = slot->hv;
  p.row_bytes = size_t(cfg.hidden) * dataTypeSize(cfg.dispatch_type);
  p.x = static_cast<const char*>(a.x);
  p.x_stride = a.x_stride ? a.x_stride : p.row_bytes;
  p.nb = cfg.dispatch_type == epFloat8E4M3 ? fp8ScaleBlocks(cfg.hidden) : 0;
  p.x_scales = a.x_scales;
  p.s_tok = a.scales_token_stride ? a.scales_token_stride : size_t(p.nb);
  p.s_blk = a.scales_block_stride ? a.scales_block_stride : 1;
  p.topk = a.topk_idx;
  p.idx64 = a.topk_idx_type == epInt64;
  p.check_ids = ids_routed ? 0 : 1;
  p.topk_w = a.topk_weights;
  p.num_tokens = h->routing.num_tokens;
  p.num_topk = a.topk_idx ? a.num_topk : h->routing.num_topk;
  p.max_topk = cfg.max_topk;
  p.recv_x = static_cast<char*>(a.recv_x);
  p.recv_scales = a.recv_scales;
  p.recv_idx = reinterpret_cast<long long*>(a.recv_topk_idx);
  p.recv_w = a.recv_topk_weights;
  p.capacity = a.recv_capacity;
  p.recv_tpe = a.recv_tokens_per_expert;
  p.num_recv_dev = capacity_mode ? reinterpret_cast<long long*>(a.num_recv) : nullptr;
  p.alignment = a.expert_alignment;
  const bool too_small = h->counts_known && h->routing.num_recv > a.recv_capacity;
  p.drop = too_small ? 1 : 0;
  p.capacity_mode = capacity_mode ? 1 : 0;
  p.send_warps = send_warps_;
  p.recv_warps = recv_warps_;
  p.chunk_tokens = chunk_tokens_;
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = launchDispatch(p, channels_, s))
    return launchFailure(comm_, "epDispatch", "the dispatch kernel", pending, err);
  notices_->recordCall(kCallDispatch, s);
  own_work_.mark(s);
  h->dispatched = true;  // launched: a call made again is a re-dispatch, not a second first one
  if (too_small)
    return setError(comm_, epInvalidArgument,
                    "epDispatch: recv_capacity = %lld is less than the %lld rows this rank receives (the "
                    "rows were sent so the other ranks complete; nothing was written)",
                    (long long)a.recv_capacity, (long long)h->routing.num_recv);
  if (report_after) EPCHECK(checkKernelErrors("epDispatch", s));
  if (host_count_unknown) return refuseHostCount();
  if (!capacity_mode && a.num_recv) *a.num_recv = h->routing.num_recv;
  return epSuccess;
}

epResult_t CudaBackend::combine(const epCombineArgs_t& a, epHandle* h, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  EPCHECK(checkKernelErrors("epCombine", s));
  auto* slot = static_cast<HandleSlot*>(h->backend_state);
  if (slot == nullptr) return setError(comm_, epInternalError, "epCombine: handle without routing state");
  const Config& cfg = comm_.config();
  CombineParams p{};
  p.cv = view();
  p.hv = slot->hv;
  p.row_bytes = size_t(cfg.hidden) * dataTypeSize(cfg.combine_type);
  p.y = static_cast<const char*>(a.y);
  p.y_stride = a.y_stride ? a.y_stride : p.row_bytes;
  p.recv_w = a.recv_topk_weights;
  p.num_topk = a.num_topk;
  p.bias = static_cast<const char*>(a.bias);
  p.out = static_cast<char*>(a.out);
  p.out_w = a.out_topk_weights;
  p.type = cfg.combine_type == epBfloat16 ? 0 : cfg.combine_type == epFloat16 ? 1 : 2;
  p.push_warps = push_warps_;
  p.reduce_warps = reduce_warps_;
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = launchCombine(p, channels_, s))
    return launchFailure(comm_, "epCombine", "the combine kernel", pending, err);
  notices_->recordCall(kCallCombine, s);
  own_work_.mark(s);
  return epSuccess;
}

}  // namespace cuda
}  // namespace ep
