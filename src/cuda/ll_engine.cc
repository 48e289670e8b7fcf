#include "ll_engine.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "../bootstrap.h"
#include "../checks.h"
#include "../data_types.h"
#include "../debug.h"
#include "../ll_layout.h"
#include "../params.h"
#include "../sizes.h"
#include "cuda_check.h"
#include "node_limit.h"

// A launch of the kernels' build this communicator takes (ll_variant.h).
#define EP_LL_LAUNCH(fn, ...) (shrink_build_ ? ll_shrink::fn(__VA_ARGS__) : ll_plain::fn(__VA_ARGS__))

namespace ep {
namespace cuda {

struct LLEngine::HandleState {
  LLHandleDev* dev = nullptr;
  LLDispatchParams dispatch{};
  LLCombineParams combine{};
};

// EP_CUDA_LL_TIMING: the median and mean kernel time of each kernel kind over
// the last kLLTimingSlots pairs, its quantiles and the median per buffer set,
// in the log.
void LLEngine::logTimes() {
  std::unique_ptr<LLTiming> held(new LLTiming);  // 80 KB: not on the stack
  LLTiming& t = *held;
  if (cudaMemcpy(&t, timing_, sizeof(t), cudaMemcpyDeviceToHost) != cudaSuccess) return;
  const char* names[kLLKinds] = {"dispatch (fused or send half)", "dispatch receive half", "combine (fused or send half)",
                                 "combine receive half"};
  // Quantile q (0..1) of sorted values.
  auto at = [](const std::vector<double>& v, double q) { return v[std::min(v.size() - 1, size_t(double(v.size()) * q))]; };
  for (int k = 0; k < kLLKinds; k++) {
    std::vector<double> us, by_set[2];
    for (int i = 0; i < kLLTimingSlots; i++) {
      if (!(t.end[i][k] > t.start[i][k] && t.start[i][k] != ~0ull)) continue;
      us.push_back(double(t.end[i][k] - t.start[i][k]) / 1000);
      by_set[i & 1].push_back(us.back());  // slot = pair % kLLTimingSlots (even): its parity is the buffer set
    }
    if (us.empty()) continue;
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double x : us) sum += x;
    EP_INFO(kSubsysCuda, "rank %d low-latency kernel time, %s: median %.2f us, mean %.2f us, p99 %.2f us over %zu calls",
            comm_.rank(), names[k], at(us, 0.5), sum / us.size(), at(us, 0.99), us.size());
    // The spread, and each buffer set alone: two modes of a kernel's time
    // show here (the median alone hides which calls are slow).
    std::string sets;
    for (int b = 0; b < 2; b++) {
      if (by_set[b].empty()) continue;
      std::sort(by_set[b].begin(), by_set[b].end());
      char buf[48];
      snprintf(buf, sizeof(buf), ", set %d median %.2f", b, at(by_set[b], 0.5));
      sets += buf;
    }
    EP_INFO(kSubsysCuda, "rank %d low-latency kernel time, %s: p10 %.2f p25 %.2f p75 %.2f p90 %.2f us%s", comm_.rank(),
            names[k], at(us, 0.1), at(us, 0.25), at(us, 0.75), at(us, 0.9), sets.c_str());
    // Phase marks: median time from the kernel's start to the latest block passing each mark.
    std::string marks;
    for (int m = 0; m < kLLMarks; m++) {
      std::vector<double> when;
      for (int i = 0; i < kLLTimingSlots; i++)
        if (t.mark[i][k][m] > t.start[i][k] && t.start[i][k] != ~0ull && t.end[i][k] > t.start[i][k])
          when.push_back(double(t.mark[i][k][m] - t.start[i][k]) / 1000);
      if (when.empty()) continue;
      std::sort(when.begin(), when.end());
      char buf[32];
      snprintf(buf, sizeof(buf), " m%d %.2f", m, at(when, 0.5));
      marks += buf;
    }
    if (!marks.empty())
      EP_INFO(kSubsysCuda, "rank %d low-latency phase marks (us after start), %s:%s", comm_.rank(), names[k], marks.c_str());
  }
}

LLEngine::~LLEngine() {
  cudaSetDevice(dev_);
  cudaDeviceSynchronize();
  if (timing_) {
    if (view_.timing) logTimes();  // set once init had zeroed it
    cudaFree(timing_);
  }
  buffers_.reset();  // the peers' buffers unmapped, then this rank's freed
  for (LLHandleDev* s : all_slots_) cudaFree(s);
  if (err_host_) cudaFreeHost(err_host_);
  cudaGetLastError();
}

epResult_t LLEngine::init(const TransportEntry* ipc, const std::vector<epPeerInfo_v1_t>& peers) {
  const Config& c = comm_.config();
  const int R = comm_.nranks(), me = comm_.rank();
  // The kernels index output rows (local expert x R x M + slot, at most
  // num_experts x M) and a call's combine pieces (T x H / 8) in 32-bit ints.
  const long long rows = (long long)c.num_experts * c.max_tokens_per_rank;
  const long long pieces = (long long)c.max_tokens_per_rank * c.hidden / 8;
  if (rows > INT_MAX || pieces > INT_MAX)
    return setError(comm_, epNotSupported,
                    "low-latency mode on GPUs: num_experts x max_tokens_per_rank = %lld and max_tokens_per_rank "
                    "x hidden / 8 = %lld must each be below 2^31 (the kernels' row and piece indices)",
                    rows, pieces);
  // buffer_bytes_cap was checked against both buffers by the caller (CudaBackend::init).
  bytes_ = llBufferBytes(R, c.max_tokens_per_rank, c.hidden, c.max_topk, c.num_experts);
  static_assert(sizeof(LLCtrl) <= kLLCtrlBytes, "LL control area");
  buffers_ = std::make_unique<PeerBuffers>(ipc, me, R);
  LocalMemory own;
  own.bytes = bytes_;
  own.kind = EP_TRANSPORT_MEM_DEVICE;
  epResult_t res = buffers_->registerLocal(own);
  if (res != epSuccess)
    return setError(comm_, res, "cannot allocate the %zu-byte low-latency buffer on device %d", bytes_, dev_);
  // Stale tags must not look like pair tags: zero before anyone writes.
  CUDACHECK(cudaMemset(buffers_->localPtr(), 0, bytes_));
  CUDACHECK(cudaDeviceSynchronize());
  EPCHECK(buffers_->exchange(comm_.bootstrap()));
  view_.bufs[me] = static_cast<char*>(buffers_->localPtr());
  for (int r = 0; r < R; r++) {
    if (r == me) continue;
    res = buffers_->connect(r, peers[r]);
    if (res != epSuccess) return setError(comm_, res, "cannot map rank %d's low-latency buffer", r);
    view_.bufs[r] = static_cast<char*>(buffers_->peerPtr(r));
  }
  view_.rank = me;
  view_.nranks = R;
  view_.max_tokens = c.max_tokens_per_rank;
  view_.hidden = c.hidden;
  view_.max_topk = c.max_topk;
  view_.local_experts = comm_.localExperts();
  view_.first_expert = comm_.firstExpert();
  view_.num_experts = c.num_experts;
  view_.set_bytes = llSetBytes(R, c.max_tokens_per_rank, c.hidden, c.max_topk, c.num_experts);
  view_.rec_bytes = llDispatchRecordBytes(c.hidden, c.max_topk);
  view_.hdr_bytes = llRecordHeaderBytes(c.max_topk);
  view_.crow_bytes = llCombineRowBytes(c.hidden);
  view_.comb_off = llCombineOffset(R, c.max_tokens_per_rank, c.hidden, c.max_topk);
  view_.flag_off = llFlagOffset(R, c.max_tokens_per_rank, c.hidden, c.max_topk, c.num_experts);
  view_.flag_rec_bytes = llFlagRecordBytes(c.hidden, c.max_topk);
  view_.flag_hdr_bytes = llFlagHeaderBytes(c.max_topk);
  view_.cnt_off = llCountsOffset(R, c.max_tokens_per_rank, c.hidden, c.max_topk);
  view_.timeout_ns = (unsigned long long)c.timeout_ms * 1000000ull;
  shrink_build_ = c.enable_shrink != 0;
  slices_ = int(param::CUDA_LL_SLICES());
  int cc_major = 0;
  CUDACHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev_));
  pdl_ = param::CUDA_LL_PDL() != 0 && cc_major >= 9;  // griddepcontrol: sm_90 and later
  flag_tokens_ = int(std::min<int64_t>(std::max<int64_t>(param::CUDA_LL_FLAGGED(), 0), kLLFlagTokens));
  follow_peers_ = param::CUDA_LL_FLAGGED_PEERS() != 0;
  const int flag_fit = llFlagTokensFit(R, c.max_topk);
  if (flag_tokens_ > flag_fit) {
    EP_INFO(kSubsysCuda, "low-latency calls of at most %d tokens send flagged records (EP_CUDA_LL_FLAGGED=%d): "
            "the headers of %d ranks at max_topk %d fill a receiving block's stage", flag_fit, flag_tokens_, R,
            c.max_topk);
    flag_tokens_ = flag_fit;
  }
  if (param::CUDA_LL_TIMING() != 0) {
    void* tp = nullptr;
    CUDACHECK(cudaMalloc(&tp, sizeof(LLTiming)));
    timing_ = static_cast<LLTiming*>(tp);  // owned from here: the destructor frees it if a step below fails
    CUDACHECK(cudaMemset(tp, 0xff, offsetof(LLTiming, end)));
    CUDACHECK(cudaMemset(static_cast<char*>(tp) + offsetof(LLTiming, end), 0, sizeof(LLTiming) - offsetof(LLTiming, end)));
    view_.timing = timing_;
  }

  // One grid size on every rank: a receiver counts the sender's blocks. At most
  // one block per SM of the smallest GPU, so a fused kernel's blocks are all
  // resident. And the most tokens any rank sends as flagged records: a
  // receiver stages that many per source; 0 (none does): the whole-row
  // receive kernels are the ones without their code.
  struct Agreed {
    int sms, flag_tokens;
  };
  std::vector<Agreed> agreed(R, Agreed{0, 0});
  agreed[me] = Agreed{sms_, flag_tokens_};
  EPCHECK(bootstrapAllGather(comm_.bootstrap(), agreed.data(), sizeof(Agreed)));
  flag_cap_ = 0;
  for (const Agreed& a : agreed) {
    sms_ = std::min(sms_, a.sms);
    flag_cap_ = std::max(flag_cap_, a.flag_tokens);
  }

  local_ = peerLocal(me);  // zeroed with the buffer
  view_.local = local_;
  void* hp = nullptr;
  CUDACHECK(cudaHostAlloc(&hp, kErrorSlots * sizeof(ErrorInfo), cudaHostAllocMapped));
  memset(hp, 0, kErrorSlots * sizeof(ErrorInfo));
  err_host_ = static_cast<ErrorInfo*>(hp);
  void* dp = nullptr;
  CUDACHECK(cudaHostGetDevicePointer(&dp, hp, 0));
  view_.err = static_cast<ErrorInfo*>(dp);
  node_limit_.max_nodes = nodeLimitToCheck(comm_);
  nodeRanks(comm_, node_limit_.node_ranks);
  node_limit_.num_experts = c.num_experts;
  node_limit_.experts_per_rank = comm_.localExperts();
  node_limit_.err_claim = &local_->err_claim;
  node_limit_.err = view_.err;
  node_limit_.what = kLLWhatNodeLimit;

  slot_bytes_ = roundUp(offsetof(LLHandleDev, mask) + 2 * size_t(c.max_tokens_per_rank) + 1, 256);
  for (int i = 0; i < 8; i++) EPCHECK(addSlot());  // more when more handles are alive (acquireSlot)
  CUDACHECK(cudaDeviceSynchronize());
  EPCHECK(buffers_->finish(comm_.bootstrap()));
  EP_INFO(kSubsysInit, "low-latency buffers: %zu bytes per rank", bytes_);
  return epSuccess;
}

// One more zeroed slot of handle state in the pool. Also during a call that is
// being captured (a graph of many layers keeps a handle per layer), hence the
// relaxed capture mode and the zeroing on a stream of its own.
epResult_t LLEngine::addSlot() {
  cuda::RelaxedCaptureScope relaxed;
  LLHandleDev* s = nullptr;
  CUDACHECK(cudaMalloc(&s, slot_bytes_));
  all_slots_.push_back(s);  // owned from here: freed at destroy, also if its zeroing fails (then never used)
  CUDACHECK(cuda::zeroDeviceMemory(s, slot_bytes_));
  free_slots_.push_back(s);
  return epSuccess;
}

epResult_t LLEngine::acquireSlot(LLHandleDev** out) {
  std::lock_guard<std::mutex> lock(slots_mu_);
  if (free_slots_.empty()) EPCHECK(addSlot());
  *out = free_slots_.back();
  free_slots_.pop_back();
  return epSuccess;
}

void LLEngine::release(epHandle* h) {
  auto* st = static_cast<HandleState*>(h->backend_state);
  if (st == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    free_slots_.push_back(st->dev);
  }
  delete st;
  h->backend_state = nullptr;
}

const char* llWhatName(int what) {
  switch (what) {
    case kLLWhatFree: return "waiting for a peer to release a low-latency buffer set";
    case kLLWhatDispatch: return "low-latency dispatch: waiting for a source's tokens";
    case kLLWhatCombine: return "low-latency combine: waiting for a rank's partial sums";
    case kLLWhatBadTopk: return "low-latency dispatch: an expert id is not -1 or in [0, num_experts)";
    case kLLWhatWire: return "low-latency dispatch: a source sent another wire type";
    case kLLWhatNodeLimit: return "low-latency dispatch: a token on more nodes than config.max_nodes_per_token";
    default: return "low-latency kernel";
  }
}

// An argument error the kernels left in err[kArgSlot] (reported at the next
// call). The caller clears the claim after this (CudaBackend::clearErrorClaim:
// on the call's stream, ahead of its kernels, or beside a capturing stream).
epResult_t LLEngine::reportArgumentError(const char* fn) {
  ErrorInfo& e = err_host_[kArgSlot];
  const int code = e.code;
  if (code == 0) return epSuccess;
  const int what = e.what, peer = e.peer;
  const long long a = e.a, b = e.b;
  e.code = 0;
  if (what == kLLWhatWire)
    return setError(comm_, epInvalidUsage,
                    "%s: an earlier low-latency dispatch: rank %d sent %s rows and this rank asked for %s: wire_type "
                    "must be the same on every rank",
                    fn, peer, dataTypeName(a ? epFloat8E4M3 : epBfloat16),
                    dataTypeName(b ? epFloat8E4M3 : epBfloat16));
  if (what == kLLWhatNodeLimit)
    return setError(comm_, epInvalidArgument,
                    "%s: token %lld of an earlier low-latency dispatch selects experts on %lld nodes, more than "
                    "config.max_nodes_per_token = %d (its rows were sent as if no bound were declared)",
                    fn, a, b, comm_.config().max_nodes_per_token);
  if (what == kLLWhatBadTopk)
    return setError(comm_, epInvalidArgument, "%s: an earlier low-latency dispatch had topk_idx of token %lld = %lld: %s",
                    fn, a, b, llWhatName(what));
  return setError(comm_, epResult_t(code), "%s: an earlier low-latency call: %s (%lld, %lld)", fn, llWhatName(what),
                  a, b);
}

// A wait of a low-latency kernel failed (epTimeout, epRemoteError).
epResult_t LLEngine::reportFailedWait(const char* fn) {
  const ErrorInfo& e = err_host_[kFailSlot];
  const int code = e.code, what = e.what, peer = e.peer;
  const long long a = e.a, b = e.b;
  // A wait for a peer marked gone that the watcher did not mark (its process
  // lives, its communicator too): the peer, in a high-throughput call, found
  // this rank in a low-latency one (device.cuh: tellLowLatencyPeers).
  const bool out_of_step = code == epRemoteError && peer >= 0 && peer < comm_.nranks() &&
                           notices_->goneWhat(peer).empty() && !comm_.peerExited(peer);
  comm_.markFailed(out_of_step ? epInvalidUsage : epResult_t(code));
  if (out_of_step)
    return setError(comm_, epInvalidUsage,
                    "%s: rank %d is in a high-throughput call while an earlier low-latency call of rank %d waited "
                    "for it (%s; that rank found it so): ranks must issue the same collective calls in the same "
                    "order; the communicator cannot be used any more",
                    fn, peer, comm_.rank(), llWhatName(what));
  if (code == epRemoteError)
    return setError(comm_, epRemoteError,
                    "%s: %s while an earlier low-latency call of rank %d waited for it (%s); the communicator cannot "
                    "be used any more",
                    fn, notices_->describeGone(peer).c_str(), comm_.rank(), llWhatName(what));
  const std::string progress = code == epTimeout ? notices_->progressNote(peer) : std::string();
  return setError(comm_, epResult_t(code),
                  "%s: an earlier low-latency call failed: %s (rank %d, tag %lld, saw %lld) within %d ms: that rank "
                  "stopped, or is in another call (calls out of order, or a high-throughput call against this "
                  "low-latency one)%s; the communicator cannot be used any more",
                  fn, llWhatName(what), peer, a, b, comm_.config().timeout_ms, progress.c_str());
}

epResult_t LLEngine::dispatch(const epLowLatencyDispatchArgs_t& a, epHandle* h, bool send_only, cudaStream_t stream) {
  auto st = std::make_unique<HandleState>();
  EPCHECK(acquireSlot(&st->dev));
  LLDispatchParams& p = st->dispatch;
  p.v = view_;
  p.hd = st->dev;
  p.x = static_cast<const uint16_t*>(a.x);
  p.topk = a.topk_idx;
  p.idx64 = a.topk_idx_type == epInt64;
  p.weights = a.topk_weights;
  p.num_tokens = a.num_tokens;
  p.num_topk = a.num_topk;
  p.fp8 = a.wire_type == epFloat8E4M3;
  p.pow2 = (a.flags & EP_LL_ROUND_SCALE_POW2) != 0;
  // 0: never, not even a call of 0 tokens. Plain records, too, where the
  // peers' call logs say this dispatch would meet plain sources (a mixed
  // receive, slower): CallLog::chooseLLRecords.
  const bool small = flag_tokens_ > 0 && a.num_tokens <= flag_tokens_;
  p.flagged = notices_->llSendsFlagged(small, follow_peers_, a.num_tokens);
  p.flag_cap = flag_cap_;
  p.recv_x = static_cast<uint8_t*>(a.recv_x);
  p.recv_scales = a.recv_scales;
  p.recv_count = a.recv_count;
  p.recv_src = a.recv_src;
  h->backend_state = st.get();
  HandleState* raw = st.release();
  const LLLaunch l{sms_, slices_, pdl_, stream};
  const cudaError_t pending = cudaPeekAtLastError();  // left by an earlier call of ours, if any (launchFailure)
  int err = 0;
  if (node_limit_.max_nodes > 0 && a.num_tokens > 0) {
    NodeLimitParams nl = node_limit_;
    nl.topk = a.topk_idx;
    nl.idx64 = a.topk_idx_type == epInt64;
    nl.num_tokens = a.num_tokens;
    nl.num_topk = a.num_topk;
    err = launchNodeLimit(nl, stream);
  }
  if (err == 0) err = send_only ? EP_LL_LAUNCH(launchLLDispatchSend, raw->dispatch, l) : EP_LL_LAUNCH(launchLLDispatch, raw->dispatch, l);
  if (err != 0) {
    release(h);
    return launchFailure(comm_, "epLowLatencyDispatch", "a low-latency dispatch kernel", pending, err);
  }
  notices_->recordCall(kCallLLDispatch, stream, llDispatchNote(small, p.flagged));
  if (send_only) h->pending = epHandle::Pending::kDispatch;
  return epSuccess;
}

epResult_t LLEngine::combine(const epLowLatencyCombineArgs_t& a, epHandle* h, bool send_only, cudaStream_t stream) {
  auto* st = static_cast<HandleState*>(h->backend_state);
  LLCombineParams& p = st->combine;
  p.v = view_;
  p.hd = st->dev;
  p.y = static_cast<const uint16_t*>(a.y);
  p.out = static_cast<uint16_t*>(a.out);
  const LLLaunch l{sms_, slices_, pdl_, stream};
  const cudaError_t pending = cudaPeekAtLastError();
  const int err = send_only ? EP_LL_LAUNCH(launchLLCombineSend, p, l)
                            : EP_LL_LAUNCH(launchLLCombine, p, l, st->dispatch.num_tokens);
  if (err != 0) return launchFailure(comm_, "epLowLatencyCombine", "a low-latency combine kernel", pending, err);
  notices_->recordCall(kCallLLCombine, stream);
  if (send_only) h->pending = epHandle::Pending::kCombine;
  return epSuccess;
}

epResult_t LLEngine::complete(epHandle* h, cudaStream_t stream) {
  auto* st = static_cast<HandleState*>(h->backend_state);
  int err = 0;
  const LLLaunch l{sms_, slices_, pdl_, stream};
  const cudaError_t pending = cudaPeekAtLastError();
  if (h->pending == epHandle::Pending::kDispatch) err = EP_LL_LAUNCH(launchLLDispatchRecv, st->dispatch, l);
  else err = EP_LL_LAUNCH(launchLLCombineRecv, st->combine, l, st->dispatch.num_tokens);
  if (err != 0) return launchFailure(comm_, "epLowLatencyComplete", "a low-latency receive kernel", pending, err);
  h->pending = epHandle::Pending::kNone;
  return epSuccess;
}

// epCommShrink, once the survivors agreed and before any of them may start
// a call (docs/SHRINK.md, "GPUs"): every survivor's kernels have ended (the
// shrink made them leave their waits and waited for them before the
// agreement), so nothing writes into this buffer now. The buffer starts
// again as at init: the failed call left counters, tags and counts in any
// state, and the pairs start again from 0 on every survivor; then the
// removed sources' signal counters are put beyond every target (the waits
// for them pass at once) and the mask is written where the kernels read it
// at every call. The error slots and claims are cleared: the failed wait's
// report was the call that failed.
epResult_t LLEngine::resetForShrink(const std::vector<bool>& dead, cudaStream_t s) {
  uint32_t bits = 0;
  LLCtrl ctrl{};
  constexpr uint64_t kBeyondEveryTarget = uint64_t(1) << 62;
  for (int r = 0; r < view_.nranks && r < kMaxRanks; r++) {
    if (!dead[size_t(r)]) continue;
    bits |= 1u << r;
    for (int set = 0; set < 2; set++)
      ctrl.dsig[set][r] = ctrl.cdone[set][r] = ctrl.cfree[set][r] = kBeyondEveryTarget;
  }
  char* own = static_cast<char*>(buffers_->localPtr());
  CUDACHECK(cudaMemsetAsync(own, 0, bytes_, s));
  // A removed rank's combine landing rows in this buffer: NaN, which no
  // survivor's combine reads (its experts are masked where tokens are
  // routed); one that did would show NaN instead of adding the +0.0 of
  // zeroed memory, so the masking is seen to hold (gpu_mp_test --shrink).
  const size_t rows = size_t(view_.max_tokens) * view_.crow_bytes;
  for (int r = 0; r < view_.nranks && r < kMaxRanks; r++) {
    if (!dead[size_t(r)]) continue;
    for (int set = 0; set < 2; set++)
      CUDACHECK(cudaMemsetAsync(own + kLLCtrlBytes + set * view_.set_bytes + view_.comb_off + size_t(r) * rows,
                                0xff, rows, s));
  }
  CUDACHECK(cudaMemcpyAsync(own, &ctrl, sizeof(ctrl), cudaMemcpyHostToDevice, s));
  CUDACHECK(cudaMemcpyAsync(&local_->dead, &bits, sizeof(bits), cudaMemcpyHostToDevice, s));
  CUDACHECK(cudaStreamSynchronize(s));  // ctrl and bits are on this stack
  memset(static_cast<void*>(err_host_), 0, kErrorSlots * sizeof(ErrorInfo));
  return epSuccess;
}

}  // namespace cuda
}  // namespace ep
