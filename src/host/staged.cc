// The staged backend: the host backend's algorithms (shm within a node, the
// network transports between nodes, the hierarchical paths, low latency) for
// callers whose buffers are not host memory. Each call copies its inputs
// into host staging buffers (Stager), runs the host backend on them, and
// copies the outputs back in stream order; it returns once they are in
// place. This is how GPU ranks on different nodes reach each other until
// kernels drive the network themselves (docs/PROXY.md): correct, bit-exact
// with the host backend (it is the host backend), and paying a copy each
// way plus the host's packing and reduction.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../backend.h"
#include "../checks.h"
#include "../data_types.h"
#include "../debug.h"
#include "../params.h"
#include "../sizes.h"
#include "../stager.h"

namespace ep {
namespace {

// What the copies of each call took, for the log at destroy (the staging
// leg beside a plain copy of the same bytes: docs/BENCHMARKS.md).
struct StagingStats {
  struct Leg {
    size_t bytes;
    double us;
  };
  std::mutex mu;
  std::vector<Leg> in, out;  // to the host (with the wait for it), back to the caller
  void add(std::vector<Leg>* legs, size_t bytes, double us) {
    std::lock_guard<std::mutex> lock(mu);
    if (legs->size() < 100000) legs->push_back({bytes, us});
  }
  static std::string describe(std::vector<Leg> legs) {
    if (legs.empty()) return "none";
    std::sort(legs.begin(), legs.end(), [](const Leg& a, const Leg& b) { return a.us < b.us; });
    const Leg& m = legs[legs.size() / 2];
    char text[128];
    snprintf(text, sizeof(text), "median %.1f us for %zu bytes (%.2f GB/s)", m.us, m.bytes,
             m.us > 0 ? double(m.bytes) / m.us / 1e3 : 0.0);
    return text;
  }
};

using StageClock = std::chrono::steady_clock;

// The staging of one call: its input copies, its output buffers and where
// they go back to. Buffers return to the stager when it is dropped; one
// whose copies may still be under way (a failure between an enqueue and
// its wait) is given back only after the stream drained.
class CallStaging {
 public:
  CallStaging(Stager& stager, epStream_t stream, StagingStats* stats = nullptr)
      : stager_(stager), stream_(stream), stats_(stats) {}
  ~CallStaging() {
    if (in_flight_) stager_.drain(stream_);
  }
  CallStaging(const CallStaging&) = delete;
  CallStaging& operator=(const CallStaging&) = delete;

  // `rows` rows of `width` bytes, `pitch` apart in the caller's memory, packed
  // in host memory; nullptr stays nullptr.
  epResult_t in(const void* src, size_t width, size_t rows, size_t pitch, const void** host) {
    *host = src;
    if (src == nullptr) return epSuccess;
    void* buf = nullptr;
    EPCHECK(hold(width * rows, &buf));
    if (width * rows > 0) EPCHECK(copyIn(buf, src, width, rows, pitch ? pitch : width));
    *host = buf;
    return epSuccess;
  }
  epResult_t in(const void* src, size_t bytes, const void** host) { return in(src, bytes, 1, bytes, host); }
  template <typename T>
  epResult_t inTyped(const T* src, size_t bytes, const T** host) {
    const void* p = nullptr;
    EPCHECK(in(src, bytes, &p));
    *host = static_cast<const T*>(p);
    return epSuccess;
  }
  // Host memory of `bytes` (at least 16) held until the call ends.
  epResult_t hold(size_t bytes, void** host) {
    std::unique_ptr<StagingBuffer> buf;
    EPCHECK(stager_.acquire(std::max<size_t>(bytes, 16), &buf));
    *host = buf->data();
    held_.push_back(std::move(buf));
    return epSuccess;
  }
  // A copy into held memory, in stream order.
  epResult_t copyIn(void* host, const void* src, size_t width, size_t rows, size_t pitch) {
    if (in_bytes_ == 0) in_start_ = StageClock::now();
    in_flight_ = true;
    in_bytes_ += width * rows;
    return stager_.toHost(host, src, width, rows, pitch, stream_);
  }

  // Host memory for an output of `bytes` that goes back to dst at flush().
  template <typename T>
  epResult_t out(T* dst, size_t bytes, T** host) {
    *host = nullptr;
    if (dst == nullptr) return epSuccess;
    void* buf = nullptr;
    EPCHECK(hold(bytes, &buf));
    *host = static_cast<T*>(buf);
    back(dst, buf, bytes);
    return epSuccess;
  }
  // A region of staged memory that goes back at flush(): `rows` rows of
  // `width` bytes, `pitch` apart on both sides.
  void back(void* dst, const void* host, size_t width, size_t rows = 1, size_t pitch = 0) {
    if (width > 0 && rows > 0) outs_.push_back({dst, host, width, rows, pitch ? pitch : width});
  }
  void keep(std::unique_ptr<StagingBuffer> buf) { held_.push_back(std::move(buf)); }

  epResult_t fence() {
    EPCHECK(stager_.fence(stream_));
    in_flight_ = false;
    if (stats_ != nullptr && in_bytes_ > 0) stats_->add(&stats_->in, in_bytes_, usSince(in_start_));
    in_bytes_ = 0;
    return epSuccess;
  }
  // Every output back to the caller, then waits for the copies.
  epResult_t flush() {
    in_flight_ = true;
    const auto start = StageClock::now();
    size_t bytes = 0;
    for (const CopyBack& b : outs_) bytes += b.width * b.rows;
    epResult_t res = outs_.empty() ? epSuccess : stager_.toCallerAll(outs_, stream_);
    outs_.clear();
    if (res == epSuccess) res = stager_.finish(stream_);
    // Drained here on failure too: some of these buffers belong to a handle
    // (the low-latency outputs) and go back to the stager after this returns.
    if (res != epSuccess) stager_.drain(stream_);
    in_flight_ = false;
    if (res == epSuccess && stats_ != nullptr && bytes > 0) stats_->add(&stats_->out, bytes, usSince(start));
    return res;
  }

 private:
  static double usSince(StageClock::time_point t) {
    return std::chrono::duration<double, std::micro>(StageClock::now() - t).count();
  }
  Stager& stager_;
  epStream_t stream_;
  StagingStats* stats_;
  bool in_flight_ = false;  // copies enqueued and not waited for
  size_t in_bytes_ = 0;     // of the copies to the host since the last fence
  StageClock::time_point in_start_;
  std::vector<std::unique_ptr<StagingBuffer>> held_;
  std::vector<CopyBack> outs_;
};

// The stager's enter()/leave() around a call.
class StagerScope {
 public:
  explicit StagerScope(Stager& s) : s_(s) {}
  epResult_t enter() {
    EPCHECK(s_.enter());
    entered_ = true;
    return epSuccess;
  }
  ~StagerScope() {
    if (entered_) s_.leave();
  }

 private:
  Stager& s_;
  bool entered_ = false;
};

size_t topkBytes(epDataType_t type, int num_tokens, int num_topk) {
  return size_t(num_tokens) * size_t(num_topk) * (type == epInt32 ? 4 : 8);
}

class StagedBackend : public Backend {
 public:
  StagedBackend(const BackendComm& comm, std::unique_ptr<Backend> inner, std::unique_ptr<Stager> stager,
                std::string name)
      : comm_(comm), inner_(std::move(inner)), stager_(std::move(stager)), name_(std::move(name)) {}

  ~StagedBackend() override {
    std::lock_guard<std::mutex> lock(stats_.mu);
    if (!stats_.in.empty() || !stats_.out.empty())
      EP_INFO(kSubsysInit, "%s: staging to %s: %zu calls' copies in, %s; %zu calls' copies back, %s", name_.c_str(),
              stager_->where(), stats_.in.size(), StagingStats::describe(stats_.in).c_str(), stats_.out.size(),
              StagingStats::describe(stats_.out).c_str());
  }
  const char* name() const override { return name_.c_str(); }
  size_t bufferBytes() const override { return inner_->bufferBytes(); }
  const char* peerTransport(int peer) const override { return inner_->peerTransport(peer); }
  bool peerConnInfo(int peer, epTransportConnInfo_v2_t* info) const override {
    return inner_->peerConnInfo(peer, info);
  }
  void abort() override { inner_->abort(); }
  // Shrink: the inner host backend's. It masks the ids it is given (the
  // staged copies of the caller's), and its rings are the only state that
  // crosses ranks; the staging holds nothing across calls but the handles',
  // which a shrink voids (the API refuses handles made before it). A failed
  // call left no copy in flight: every staged call waits for its copies on
  // the host.
  bool canShrink() const override { return inner_->canShrink(); }
  uint64_t steps() const override { return inner_->steps(); }
  epResult_t shrink(const std::vector<bool>& dead, uint64_t steps) override {
    routed_ = Routed();
    return inner_->shrink(dead, steps);
  }
  epResult_t quiesceForShrink() override { return inner_->quiesceForShrink(); }
  epResult_t resetForShrink(const std::vector<bool>& dead) override { return inner_->resetForShrink(dead); }
  void releaseHandle(epHandle* h) override {
    {
      std::lock_guard<std::mutex> lock(ll_mu_);
      ll_.erase(h);
    }
    if (routed_.handle == h) routed_ = Routed();
    inner_->releaseHandle(h);
  }

  epResult_t layout(const epLayoutArgs_t& a, epStream_t stream) override;
  epResult_t prepare(const char* fn, const epDispatchArgs_t& a, epHandle* h, epStream_t stream) override;
  epResult_t dispatch(const epDispatchArgs_t& a, epHandle* h, bool ids_routed, epStream_t stream) override;
  epResult_t combine(const epCombineArgs_t& a, epHandle* h, epStream_t stream) override;
  epResult_t llDispatch(const epLowLatencyDispatchArgs_t& a, epHandle* h, bool send_only,
                        epStream_t stream) override;
  epResult_t llCombine(const epLowLatencyCombineArgs_t& a, epHandle* h, bool send_only,
                       epStream_t stream) override;
  epResult_t llComplete(epHandle* h, epStream_t stream) override;

 private:
  // A low-latency handle's staging between its calls.
  struct LLCall {
    std::vector<int> counts;  // rows per local expert, once the dispatch finished
    // The receive half still owed (EP_LL_SEND_ONLY): where its outputs go.
    epHandle::Pending pending = epHandle::Pending::kNone;
    epLowLatencyDispatchArgs_t dispatch{};
    void* out = nullptr;  // the combine's caller buffer
    std::unique_ptr<StagingBuffer> recv_x, recv_scales, recv_count, recv_src, combined;
  };

  epResult_t begin(const char* fn, StagerScope& scope, epStream_t stream) {
    EPCHECK(scope.enter());
    if (stager_->capturing(stream))
      return setError(comm_, epInvalidUsage,
                      "%s: this communicator's ranks are on several nodes and its calls go through host "
                      "staging buffers (%s), which wait on the host: they cannot be captured in a graph",
                      fn, stager_->where());
    return epSuccess;
  }
  epResult_t stageLLDispatchBack(CallStaging& cs, LLCall& call);
  LLCall& llCall(epHandle* h) {
    std::lock_guard<std::mutex> lock(ll_mu_);
    return ll_[h];
  }

  BackendComm comm_;
  std::unique_ptr<Backend> inner_;
  std::unique_ptr<Stager> stager_;
  std::string name_;
  StagingStats stats_;
  // The ids prepare() staged for the dispatch that follows it in one call.
  struct Routed {
    const epHandle* handle = nullptr;
    const void* src = nullptr;
    std::unique_ptr<StagingBuffer> ids;
  };
  Routed routed_;
  std::mutex ll_mu_;  // ll_: a handle may be destroyed from another thread
  std::unordered_map<const epHandle*, LLCall> ll_;
};

epResult_t StagedBackend::layout(const epLayoutArgs_t& a, epStream_t stream) {
  StagerScope scope(*stager_);
  EPCHECK(begin("epLayout", scope, stream));
  const int R = comm_.nranks(), N = comm_.nodes().num_nodes, E = comm_.config().num_experts;
  CallStaging cs(*stager_, stream, &stats_);
  epLayoutArgs_t b = a;
  EPCHECK(cs.in(a.topk_idx, topkBytes(a.topk_idx_type, a.num_tokens, a.num_topk), &b.topk_idx));
  EPCHECK(cs.fence());
  EPCHECK(checkTopkIds(comm_, "epLayout", b.topk_idx, a.topk_idx_type, a.num_tokens, a.num_topk));
  EPCHECK(cs.out(a.tokens_per_rank, size_t(R) * 4, &b.tokens_per_rank));
  EPCHECK(cs.out(a.tokens_per_node, size_t(N) * 4, &b.tokens_per_node));
  EPCHECK(cs.out(a.tokens_per_expert, size_t(E) * 4, &b.tokens_per_expert));
  EPCHECK(cs.out(a.is_token_in_rank, size_t(a.num_tokens) * R, &b.is_token_in_rank));
  EPCHECK(inner_->layout(b, stream));
  return cs.flush();
}

epResult_t StagedBackend::prepare(const char* fn, const epDispatchArgs_t& a, epHandle* h, epStream_t stream) {
  StagerScope scope(*stager_);
  EPCHECK(begin(fn, scope, stream));
  CallStaging cs(*stager_, stream, &stats_);
  epDispatchArgs_t b = a;
  // The ids are kept for the dispatch of the same call (epDispatch of a new
  // routing), which would otherwise copy them from the device again.
  routed_ = Routed();
  const size_t bytes = topkBytes(a.topk_idx_type, a.num_tokens, a.num_topk);
  EPCHECK(stager_->acquire(std::max<size_t>(bytes, 16), &routed_.ids));
  if (bytes > 0) EPCHECK(cs.copyIn(routed_.ids->data(), a.topk_idx, bytes, 1, bytes));
  EPCHECK(cs.fence());
  b.topk_idx = routed_.ids->data();
  EPCHECK(checkTopkIds(comm_, fn, b.topk_idx, a.topk_idx_type, a.num_tokens, a.num_topk));
  routed_.handle = h;
  routed_.src = a.topk_idx;
  return inner_->prepare(fn, b, h, stream);
}

epResult_t StagedBackend::dispatch(const epDispatchArgs_t& a, epHandle* h, bool ids_routed, epStream_t stream) {
  StagerScope scope(*stager_);
  EPCHECK(begin("epDispatch", scope, stream));
  const Config& cfg = comm_.config();
  const int T = a.num_tokens, K = a.num_topk, nb = fp8ScaleBlocks(cfg.hidden);
  const bool fp8 = cfg.dispatch_type == epFloat8E4M3;
  const size_t row = size_t(cfg.hidden) * dataTypeSize(cfg.dispatch_type);
  CallStaging cs(*stager_, stream, &stats_);
  epDispatchArgs_t b = a;
  EPCHECK(cs.in(a.x, row, size_t(T), a.x_stride ? a.x_stride : row, &b.x));
  b.x_stride = 0;
  if (fp8 && T > 0) {  // the scales keep their strides: the span from the first to the last
    const size_t s_tok = a.scales_token_stride ? a.scales_token_stride : size_t(nb);
    const size_t s_blk = a.scales_block_stride ? a.scales_block_stride : 1;
    const size_t span = size_t(T - 1) * s_tok + size_t(nb - 1) * s_blk + 1;
    EPCHECK(cs.inTyped(a.x_scales, span * 4, &b.x_scales));
  }
  if (ids_routed && routed_.handle == h && routed_.src == a.topk_idx && routed_.ids) {
    b.topk_idx = routed_.ids->data();  // staged by prepare() in this call
    cs.keep(std::move(routed_.ids));
    routed_ = Routed();
  } else {
    EPCHECK(cs.in(a.topk_idx, topkBytes(a.topk_idx_type, T, K), &b.topk_idx));
  }
  EPCHECK(cs.inTyped(a.topk_weights, size_t(T) * K * 4, &b.topk_weights));
  EPCHECK(cs.fence());
  // Ids other than the ones prepare() just checked in this call.
  if (!ids_routed && b.topk_idx != nullptr)
    EPCHECK(checkTopkIds(comm_, "epDispatch", b.topk_idx, a.topk_idx_type, T, K));

  // The routing is the host's (prepare), so the rows are known: only they
  // are staged back; capacity rows past them are marked unused here.
  const int64_t nrecv = h->routing.num_recv;
  const bool fits = nrecv <= a.recv_capacity;
  const size_t rows = fits ? size_t(nrecv) : 0;
  b.recv_capacity = fits ? nrecv : a.recv_capacity;  // too small: the host drains and says so
  EPCHECK(cs.out(a.recv_x, rows * row, &b.recv_x));
  b.recv_scales = nullptr;  // read only with an FP8 wire
  if (fp8) EPCHECK(cs.out(a.recv_scales, rows * nb * 4, &b.recv_scales));
  EPCHECK(cs.out(a.recv_topk_idx, rows * K * 8, &b.recv_topk_idx));
  EPCHECK(cs.out(a.recv_topk_weights, rows * K * 4, &b.recv_topk_weights));
  EPCHECK(cs.out(a.recv_tokens_per_expert, size_t(comm_.localExperts()) * 4, &b.recv_tokens_per_expert));
  if (a.flags & EP_DISPATCH_NO_HOST_SYNC) EPCHECK(cs.out(a.num_recv, 8, &b.num_recv));  // device memory
  EPCHECK(inner_->dispatch(b, h, ids_routed, stream));
  if (a.recv_topk_idx != nullptr && a.recv_capacity > nrecv)  // -1 is every byte 0xff
    EPCHECK(stager_->fill(a.recv_topk_idx + size_t(nrecv) * K, 0xff, size_t(a.recv_capacity - nrecv) * K * 8,
                          stream));
  return cs.flush();
}

epResult_t StagedBackend::combine(const epCombineArgs_t& a, epHandle* h, epStream_t stream) {
  StagerScope scope(*stager_);
  EPCHECK(begin("epCombine", scope, stream));
  const Config& cfg = comm_.config();
  const size_t row = size_t(cfg.hidden) * dataTypeSize(cfg.combine_type);
  const size_t nrecv = size_t(h->routing.num_recv), T = size_t(h->routing.num_tokens);
  const size_t K = a.recv_topk_weights ? size_t(a.num_topk) : 0;
  CallStaging cs(*stager_, stream, &stats_);
  epCombineArgs_t b = a;
  EPCHECK(cs.in(a.y, row, nrecv, a.y_stride ? a.y_stride : row, &b.y));
  b.y_stride = 0;
  EPCHECK(cs.inTyped(a.recv_topk_weights, nrecv * K * 4, &b.recv_topk_weights));
  EPCHECK(cs.in(a.bias, T * row, &b.bias));
  EPCHECK(cs.fence());
  EPCHECK(cs.out(a.out, T * row, &b.out));
  void* weights = nullptr;
  if (a.out_topk_weights != nullptr) {
    EPCHECK(cs.hold(T * K * 4, &weights));
    b.out_topk_weights = static_cast<float*>(weights);
  }
  // A peer that sent no weights: out is written all the same, the summed
  // weights are not (epInvalidUsage, docs/SEMANTICS.md "Combine").
  const epResult_t res = inner_->combine(b, h, stream);
  if (res != epSuccess && res != epInvalidUsage) return res;
  if (res == epSuccess && weights != nullptr) cs.back(a.out_topk_weights, weights, T * K * 4);
  const epResult_t flushed = cs.flush();
  return res != epSuccess ? res : flushed;
}

// The low-latency dispatch's outputs back to the caller: per local expert
// only its rows (its scales from the first block's first row to the last
// block's last row).
epResult_t StagedBackend::stageLLDispatchBack(CallStaging& cs, LLCall& call) {
  const Config& cfg = comm_.config();
  const epLowLatencyDispatchArgs_t& a = call.dispatch;
  const int L = comm_.localExperts(), H = cfg.hidden, nb = fp8ScaleBlocks(H);
  const size_t cap = size_t(comm_.nranks()) * cfg.max_tokens_per_rank;
  const bool fp8 = a.wire_type == epFloat8E4M3;
  const size_t row = fp8 ? size_t(H) : size_t(H) * 2;
  const int* count = static_cast<const int*>(call.recv_count->data());
  call.counts.assign(count, count + L);
  cs.back(a.recv_count, count, size_t(L) * 4);
  for (int e = 0; e < L; e++) {
    const size_t n = size_t(count[e]);
    if (n == 0) continue;
    const size_t first = size_t(e) * cap;
    cs.back(static_cast<uint8_t*>(a.recv_x) + first * row,
            static_cast<const uint8_t*>(call.recv_x->data()) + first * row, n * row);
    if (fp8) {  // [expert][block][slot]: n slots of each of the expert's nb blocks
      const size_t from = size_t(e) * nb * cap;
      cs.back(a.recv_scales + from, static_cast<const float*>(call.recv_scales->data()) + from, n * 4, size_t(nb),
              cap * 4);
    }
    if (a.recv_src != nullptr)
      cs.back(a.recv_src + first, static_cast<const int*>(call.recv_src->data()) + first, n * 4);
  }
  return epSuccess;
}

epResult_t StagedBackend::llDispatch(const epLowLatencyDispatchArgs_t& a, epHandle* h, bool send_only,
                                     epStream_t stream) {
  StagerScope scope(*stager_);
  EPCHECK(begin("epLowLatencyDispatch", scope, stream));
  const Config& cfg = comm_.config();
  const int T = a.num_tokens, K = a.num_topk, L = comm_.localExperts(), H = cfg.hidden;
  const size_t cap = size_t(comm_.nranks()) * cfg.max_tokens_per_rank;
  const bool fp8 = a.wire_type == epFloat8E4M3;
  const size_t row = fp8 ? size_t(H) : size_t(H) * 2;
  CallStaging cs(*stager_, stream, &stats_);
  epLowLatencyDispatchArgs_t b = a;
  EPCHECK(cs.in(a.x, size_t(T) * H * 2, &b.x));
  EPCHECK(cs.in(a.topk_idx, topkBytes(a.topk_idx_type, T, K), &b.topk_idx));
  EPCHECK(cs.inTyped(a.topk_weights, size_t(T) * K * 4, &b.topk_weights));
  EPCHECK(cs.fence());
  EPCHECK(checkTopkIds(comm_, "epLowLatencyDispatch", b.topk_idx, a.topk_idx_type, T, K));

  LLCall call;
  call.dispatch = a;
  EPCHECK(stager_->acquire(size_t(L) * cap * row, &call.recv_x));
  if (fp8) EPCHECK(stager_->acquire(size_t(L) * fp8ScaleBlocks(H) * cap * 4, &call.recv_scales));
  EPCHECK(stager_->acquire(size_t(L) * 4, &call.recv_count));
  if (a.recv_src != nullptr) EPCHECK(stager_->acquire(size_t(L) * cap * 4, &call.recv_src));
  b.recv_x = call.recv_x->data();
  b.recv_scales = fp8 ? static_cast<float*>(call.recv_scales->data()) : nullptr;
  b.recv_count = static_cast<int*>(call.recv_count->data());
  b.recv_src = a.recv_src != nullptr ? static_cast<int*>(call.recv_src->data()) : nullptr;
  EPCHECK(inner_->llDispatch(b, h, send_only, stream));
  if (send_only) {
    call.pending = epHandle::Pending::kDispatch;
    llCall(h) = std::move(call);
    return epSuccess;
  }
  EPCHECK(stageLLDispatchBack(cs, call));
  EPCHECK(cs.flush());
  std::vector<int> counts = std::move(call.counts);
  llCall(h) = LLCall();
  llCall(h).counts = std::move(counts);
  return epSuccess;
}

epResult_t StagedBackend::llCombine(const epLowLatencyCombineArgs_t& a, epHandle* h, bool send_only,
                                    epStream_t stream) {
  StagerScope scope(*stager_);
  EPCHECK(begin("epLowLatencyCombine", scope, stream));
  const Config& cfg = comm_.config();
  const int L = comm_.localExperts(), H = cfg.hidden;
  const size_t cap = size_t(comm_.nranks()) * cfg.max_tokens_per_rank, row = size_t(H) * 2;
  const size_t T = size_t(h->routing.num_tokens);
  LLCall& call = llCall(h);
  if (int(call.counts.size()) != L)
    return setError(comm_, epInternalError, "epLowLatencyCombine: the handle's dispatch left no counts here");
  // y is read in place at [expert][slot]: only the rows the dispatch filled.
  CallStaging cs(*stager_, stream, &stats_);
  void* y = nullptr;
  EPCHECK(cs.hold(size_t(L) * cap * row, &y));
  for (int e = 0; e < L; e++) {
    const size_t first = size_t(e) * cap * row, n = size_t(call.counts[size_t(e)]);
    if (n > 0)
      EPCHECK(cs.copyIn(static_cast<uint8_t*>(y) + first, static_cast<const uint8_t*>(a.y) + first, n * row, 1,
                        n * row));
  }
  EPCHECK(cs.fence());
  epLowLatencyCombineArgs_t b = a;
  b.y = y;
  std::unique_ptr<StagingBuffer> out;
  EPCHECK(stager_->acquire(std::max<size_t>(T * row, 16), &out));
  b.out = out->data();
  EPCHECK(inner_->llCombine(b, h, send_only, stream));
  if (send_only) {
    call.pending = epHandle::Pending::kCombine;
    call.out = a.out;
    call.combined = std::move(out);
    return epSuccess;
  }
  if (a.out != nullptr) cs.back(a.out, out->data(), T * row);
  cs.keep(std::move(out));
  return cs.flush();
}

epResult_t StagedBackend::llComplete(epHandle* h, epStream_t stream) {
  StagerScope scope(*stager_);
  EPCHECK(begin("epLowLatencyComplete", scope, stream));
  EPCHECK(inner_->llComplete(h, stream));
  LLCall& call = llCall(h);
  CallStaging cs(*stager_, stream, &stats_);
  if (call.pending == epHandle::Pending::kDispatch) {
    EPCHECK(stageLLDispatchBack(cs, call));
  } else if (call.pending == epHandle::Pending::kCombine && call.out != nullptr) {
    cs.back(call.out, call.combined->data(), size_t(h->routing.num_tokens) * comm_.config().hidden * 2);
  }
  EPCHECK(cs.flush());
  call.pending = epHandle::Pending::kNone;
  call.recv_x.reset();
  call.recv_scales.reset();
  call.recv_count.reset();
  call.recv_src.reset();
  call.combined.reset();
  return epSuccess;
}

// Host memory "staged" into host memory: buffers of the exact size asked
// for, so that a wrong size in the staging shows under ASan; the copies are
// memcpy. A buffer given back is kept for the next request of the same size
// (the low-latency stagings are as large as the receive buffers: fresh ones
// would be page faults at every call).
class HostStager : public Stager {
 public:
  const char* where() const override { return "host memory, EP_TEST_STAGED"; }
  epResult_t acquire(size_t bytes, std::unique_ptr<StagingBuffer>* out) override {
    std::unique_ptr<uint8_t[]> mem;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        mem = std::move(it->second);
        free_.erase(it);
      }
    }
    if (!mem) mem.reset(new uint8_t[bytes]);  // not zeroed: a call touches only the rows it fills
    out->reset(new Buffer(this, std::move(mem), bytes));
    return epSuccess;
  }
  epResult_t enter() override { return epSuccess; }
  void leave() override {}
  bool capturing(epStream_t) override { return false; }
  epResult_t toHost(void* host, const void* src, size_t width, size_t rows, size_t pitch, epStream_t) override {
    for (size_t r = 0; r < rows; r++)
      memcpy(static_cast<char*>(host) + r * width, static_cast<const char*>(src) + r * pitch, width);
    return epSuccess;
  }
  epResult_t fence(epStream_t) override { return epSuccess; }
  epResult_t toCaller(void* dst, const void* host, size_t width, size_t rows, size_t pitch, epStream_t) override {
    for (size_t r = 0; r < rows; r++)
      memcpy(static_cast<char*>(dst) + r * pitch, static_cast<const char*>(host) + r * pitch, width);
    return epSuccess;
  }
  epResult_t fill(void* dst, int value, size_t bytes, epStream_t) override {
    memset(dst, value, bytes);
    return epSuccess;
  }
  epResult_t finish(epStream_t) override { return epSuccess; }
  void drain(epStream_t) override {}

 private:
  class Buffer : public StagingBuffer {
   public:
    Buffer(HostStager* owner, std::unique_ptr<uint8_t[]> mem, size_t bytes)
        : owner_(owner), mem_(std::move(mem)), size_(bytes) {}
    ~Buffer() override { owner_->giveBack(std::move(mem_), size_); }
    void* data() override { return mem_.get(); }

   private:
    HostStager* owner_;
    std::unique_ptr<uint8_t[]> mem_;
    size_t size_;
  };
  void giveBack(std::unique_ptr<uint8_t[]> mem, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    // A call holds about a dozen; sizes of calls long past are let go.
    if (free_.size() >= kKeep) free_.erase(free_.begin());
    free_.emplace(bytes, std::move(mem));
  }
  static constexpr size_t kKeep = 32;
  std::mutex mu_;
  std::unordered_multimap<size_t, std::unique_ptr<uint8_t[]>> free_;
};

}  // namespace

std::unique_ptr<Stager> makeHostStager() { return std::make_unique<HostStager>(); }

epResult_t createStagedBackend(const BackendComm& comm, std::unique_ptr<Stager> stager, const char* name,
                               std::unique_ptr<Backend>* out) {
  std::unique_ptr<Backend> inner;
  EPCHECK(createHostBackend(comm, &inner));
  out->reset(new StagedBackend(comm, std::move(inner), std::move(stager), name));
  return epSuccess;
}

}  // namespace ep
