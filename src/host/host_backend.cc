// The host backend: the operations of docs/SEMANTICS.md on host memory between the ranks of
// one machine, through the shm transport. It is the reference the GPU kernels
// are checked against, so it favours clarity: one record per token, packed and
// unpacked by plain loops, sums in float32 in ascending source-rank order.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "../backend.h"
#include "../checks.h"
#include "../data_types.h"
#include "../params.h"
#include "../plan.h"
#include "../peer_buffers.h"
#include "../sizes.h"
#include "../transport.h"
#include "convert.h"
#include "exchange.h"
#include "hier.h"
#include "host_ll.h"
#include "records.h"

namespace ep {
namespace {

using host::addRowAsFloat;
using host::ChunkKind;
using host::combineRecordBytes;
using host::DispatchRecord;
using host::dispatchRecord;
using host::storeRowFromFloat;
using host::Exchanger;
using host::NetLinks;
using host::RingGeometry;
using host::StreamSpec;

class HostBackend : public Backend {
 public:
  explicit HostBackend(const BackendComm& comm) : comm_(comm) {}
  ~HostBackend() override;
  epResult_t init();

  const char* name() const override { return "host"; }
  bool hostMemory() const override { return true; }
  size_t bufferBytes() const override { return geo_.segmentBytes(); }
  epResult_t layout(const epLayoutArgs_t& args, epStream_t stream) override;
  epResult_t prepare(const char* fn, const epDispatchArgs_t& args, epHandle* h, epStream_t stream) override;
  epResult_t dispatch(const epDispatchArgs_t& args, epHandle* h, bool ids_routed, epStream_t stream) override;
  epResult_t combine(const epCombineArgs_t& args, epHandle* h, epStream_t stream) override;
  epResult_t finishCombine(const epCombineArgs_t& a, int T, int K, epDataType_t type, size_t row_bytes,
                           const char* unweighted_what, int unweighted);
  epResult_t llDispatch(const epLowLatencyDispatchArgs_t& args, epHandle* h, bool send_only,
                        epStream_t) override {
    if (!shrunk_) return host::llDispatch(comm_, *exchanger_, args, h, send_only);
    epLowLatencyDispatchArgs_t a = args;  // the handle keeps the masked ids for its combine
    a.topk_idx = maskIds(args.topk_idx, args.topk_idx_type, args.num_tokens, args.num_topk, &h->masked_ids);
    a.topk_idx_type = epInt64;
    return host::llDispatch(comm_, *exchanger_, a, h, send_only);
  }
  epResult_t llCombine(const epLowLatencyCombineArgs_t& args, epHandle* h, bool send_only,
                       epStream_t) override {
    return host::llCombine(comm_, *exchanger_, args, h, send_only);
  }
  epResult_t llComplete(epHandle* h, epStream_t) override { return host::llComplete(comm_, h); }
  void releaseHandle(epHandle* h) override {
    if (h->low_latency) host::llRelease(h);
  }
  bool canShrink() const override { return !net_ || net_->canDrop(); }
  uint64_t steps() const override { return exchanger_->steps(); }
  epResult_t shrink(const std::vector<bool>& dead, uint64_t steps) override {
    if (net_)  // the network forgets the dead peers (their connections' errors)
      for (int r = 0; r < comm_.nranks(); r++)
        if (dead[size_t(r)] && net_->remote(r)) EPCHECK(net_->dropPeer(r));
    dead_ = dead;
    shrunk_ = std::find(dead.begin(), dead.end(), true) != dead.end();
    exchanger_->shrink(dead, steps);
    // A dead rail peer's sources go to its node's next live rank from now on.
    if (hier_) fw_ = host::buildForwarding(comm_, dead_);
    return epSuccess;
  }
  const char* peerTransport(int peer) const override {
    return net_ && net_->remote(peer) ? net_->transportName() : "shm";
  }
  bool peerConnInfo(int peer, epTransportConnInfo_v2_t* info) const override {
    return net_ && net_->connInfo(peer, info);
  }

 private:
  BackendComm comm_;
  RingGeometry geo_;
  std::unique_ptr<PeerBuffers> segments_;  // this rank's segment, registered with shm, and the peers' mapped
  std::unique_ptr<NetLinks> net_;          // ranks on other nodes, when a network transport joins them
  std::unique_ptr<Exchanger> exchanger_;
  // Across nodes: high throughput forwards through rail peers (hier.h).
  bool hier_ = false;
  host::Forwarding fw_;
  std::vector<float> acc_, acc_w_;  // combine's sums, reused between calls
  // After a shrink: the dead ranks, whose experts every call masks.
  std::vector<bool> dead_;
  bool shrunk_ = false;

  // ids (T x K of type) with the dead ranks' experts -1, in *store (int64).
  const int64_t* maskIds(const void* ids, epDataType_t type, int T, int K, std::vector<int64_t>* store) const {
    store->resize(size_t(T) * size_t(K));
    const Placement& pl = comm_.placement();
    for (size_t i = 0; i < store->size(); i++) {
      const int64_t e = topkAt(ids, type, i);
      (*store)[i] = e >= 0 && dead_[size_t(pl.owner(e))] ? -1 : e;
    }
    return store->data();
  }
};

HostBackend::~HostBackend() {
  if (exchanger_) exchanger_->announceClose();
  exchanger_.reset();  // it writes into the segments: gone before they are
  net_.reset();        // the network's registration of the segment, before shm unmaps it
  segments_.reset();
}

epResult_t HostBackend::init() {
  const Config& cfg = comm_.config();
  const int R = comm_.nranks(), me = comm_.rank();
  std::string why;
  const TransportEntry* shm = transportFind("shm", &why);
  if (shm == nullptr)
    return setError(comm_, epNotSupported, "host backend needs the shm transport: %s", why.c_str());
  segments_ = std::make_unique<PeerBuffers>(shm, me, R);
  // Ranks on other nodes go over a network transport, when the ranks agree
  // on one (NetLinks::choose); else shm must reach them (nodes faked on one
  // machine by EP_NODE_SIZE / EP_HOST_ID, with no network module).
  const TransportEntry* net = nullptr;
  EPCHECK(NetLinks::choose(comm_, &net));
  std::vector<bool> remote(size_t(R), false);
  std::vector<int> staging(size_t(R), -1);
  int staged = 0;
  for (int r = 0; r < R; r++) {
    if (net != nullptr && comm_.nodes().node_of_rank[size_t(r)] != comm_.nodes().node_of_rank[size_t(me)]) {
      remote[size_t(r)] = true;
      staging[size_t(r)] = staged++;
      continue;
    }
    int ok = 0;
    segments_->canConnect(comm_.peers()[me], comm_.peers()[r], &ok);
    if (!ok)
      return setError(comm_, epNotSupported,
                      "host backend: rank %d is on another machine and no network transport is available "
                      "(moeep_info lists the transports and why each is unavailable; EP_TRANSPORTS)",
                      r);
  }

  // Size the rings: as large as the defaults ask, shrunk to the cap if one is set.
  if (param::HOST_RING_SLOTS() < 2 || param::HOST_RING_SLOTS() > 1024)
    return setError(comm_, epInvalidArgument, "EP_HOST_RING_SLOTS = %lld is outside 2..1024",
                    (long long)param::HOST_RING_SLOTS());
  if (param::HOST_CHUNK_TOKENS() < 1 || param::HOST_CHUNK_TOKENS() > (1 << 20))
    return setError(comm_, epInvalidArgument, "EP_HOST_CHUNK_TOKENS = %lld is outside 1..%d",
                    (long long)param::HOST_CHUNK_TOKENS(), 1 << 20);
  geo_.nranks = R;
  geo_.staged = staged;
  geo_.slots = int(param::HOST_RING_SLOTS());
  // Several nodes: high throughput goes through rail peers, a token once per
  // node (hier.h), when each node's ranks fit a forward record's 64-bit mask.
  hier_ = comm_.nodes().num_nodes > 1 &&
          *std::max_element(comm_.nodes().node_size.begin(), comm_.nodes().node_size.end()) <= 64;
  if (hier_) fw_ = host::buildForwarding(comm_);
  geo_.record_bytes = std::max({dispatchRecord(cfg).total(), combineRecordBytes(cfg),
                                host::llRecordBytes(cfg), size_t(16)});
  if (hier_)
    geo_.record_bytes = std::max({geo_.record_bytes, dispatchRecord(cfg).forwardTotal(),
                                  host::partialRecordBytes(cfg)});
  // A call sends a peer at most max_tokens_per_rank records: larger chunks
  // would only cost memory (ranks x slots x chunk records per segment). Nor
  // need a chunk exceed kMaxChunkBytes, which already moves at memory speed:
  // with rows of the largest hidden size the segment grew to hundreds of MB
  // per peer, which init reserves and zeroes (posix_fallocate) before any
  // call, seconds of it on a loaded machine.
  constexpr int64_t kMaxChunkBytes = int64_t(16) << 20;
  geo_.chunk_records = int(std::min<int64_t>({param::HOST_CHUNK_TOKENS(), std::max(1, cfg.max_tokens_per_rank),
                                              std::max<int64_t>(1, kMaxChunkBytes / int64_t(geo_.record_bytes))}));
  if (cfg.buffer_bytes_cap > 0) {
    while (geo_.chunk_records > 1 && geo_.segmentBytes() > cfg.buffer_bytes_cap)
      geo_.chunk_records /= 2;
    if (geo_.segmentBytes() > cfg.buffer_bytes_cap) {
      geo_.slots = 2;
      if (geo_.segmentBytes() > cfg.buffer_bytes_cap)
        return setError(comm_, epInvalidArgument,
                        "buffer_bytes_cap = %zu (config, else EP_BUFFER_BYTES_CAP) is too small: the host backend needs at "
                        "least %zu bytes for %d ranks with rows of %zu bytes",
                        cfg.buffer_bytes_cap, geo_.segmentBytes(), R, geo_.record_bytes);
    }
  }
  EP_INFO(kSubsysInit, "host backend: %d rings of %d slots x %d records x %zu bytes = %zu bytes", R,
          geo_.slots, geo_.chunk_records, geo_.record_bytes, geo_.segmentBytes());

  // Register this rank's segment, exchange handles, map every peer's.
  LocalMemory segment;
  segment.bytes = geo_.segmentBytes();
  segment.kind = EP_TRANSPORT_MEM_HOST;
  transportClearWarning();
  epResult_t res = segments_->registerLocal(segment);
  if (res != epSuccess)
    return setError(comm_, res, "host backend: cannot allocate a %zu-byte shared segment (EP_SHM_DIR=%s): %s",
                    geo_.segmentBytes(), param::SHM_DIR(),
                    transportLastWarning().empty() ? "no reason given" : transportLastWarning().c_str());
  EPCHECK(segments_->exchange(comm_.bootstrap()));
  for (int r = 0; r < R; r++) {
    if (r == me || remote[size_t(r)]) continue;
    res = segments_->connect(r, comm_.peers()[r]);
    if (res != epSuccess) return setError(comm_, res, "host backend: cannot map rank %d's segment", r);
  }
  // Every peer mapped every segment: the names can go.
  EPCHECK(segments_->finish(comm_.bootstrap()));
  if (net != nullptr) {
    // High-throughput traffic crosses the network between rail pairs only
    // (hier.h); without forwarding (nodes of more than 64 ranks) it goes to
    // every rank on another node.
    std::vector<bool> throughput(size_t(R), false);
    for (int r = 0; r < R; r++)
      throughput[size_t(r)] = remote[size_t(r)] && (!hier_ || railPair(comm_.nodes(), me, r));
    net_ = std::make_unique<NetLinks>(net, comm_);
    EPCHECK(net_->open(remote, throughput, segments_->localPtr(), geo_.segmentBytes()));
  }
  std::vector<void*> mapped(R, nullptr);
  for (int r = 0; r < R; r++) mapped[size_t(r)] = remote[size_t(r)] ? nullptr : segments_->peerPtr(r);
  exchanger_ = std::make_unique<Exchanger>(comm_, std::move(mapped), geo_, net_.get(), staging);
  return epSuccess;
}

epResult_t HostBackend::layout(const epLayoutArgs_t& args, epStream_t) {
  epLayoutArgs_t a = args;
  std::vector<int64_t> masked;
  if (shrunk_ && a.topk_idx != nullptr) {
    a.topk_idx = maskIds(args.topk_idx, args.topk_idx_type, args.num_tokens, args.num_topk, &masked);
    a.topk_idx_type = epInt64;
  }
  computeLayout(comm_.placement(), a.topk_idx, a.topk_idx_type, a.num_tokens, a.num_topk,
                comm_.nodes().node_of_rank.data(), comm_.nodes().num_nodes, a.tokens_per_rank,
                a.tokens_per_node, a.tokens_per_expert, a.is_token_in_rank);
  return epSuccess;
}

epResult_t HostBackend::prepare(const char*, const epDispatchArgs_t& args, epHandle* h, epStream_t) {
  epDispatchArgs_t a = args;
  if (shrunk_ && a.topk_idx != nullptr) {
    a.topk_idx = maskIds(args.topk_idx, args.topk_idx_type, args.num_tokens, args.num_topk, &h->masked_ids);
    a.topk_idx_type = epInt64;
  }
  Routing routing;
  buildSendSide(comm_.placement(), a.topk_idx, a.topk_idx_type, a.num_tokens, a.num_topk, &routing);

  EPCHECK(exchanger_->exchangeCounts(host::kChunkCounts, &routing, "dispatch counts"));
  if (hier_) EPCHECK(host::exchangeForwardCounts(comm_, *exchanger_, fw_, routing, h));
  h->routing = std::move(routing);
  h->counts_known = true;
  return epSuccess;
}

epResult_t HostBackend::dispatch(const epDispatchArgs_t& args, epHandle* h, bool, epStream_t) {
  epDispatchArgs_t a = args;
  if (shrunk_ && a.topk_idx != nullptr) {  // the ids prepare masked (a cached re-dispatch's own ones again)
    a.topk_idx = maskIds(args.topk_idx, args.topk_idx_type, args.num_tokens, args.num_topk, &h->masked_ids);
    a.topk_idx_type = epInt64;
  }
  const Config& cfg = comm_.config();
  const int R = comm_.nranks(), K = a.num_topk;
  const Routing& rt = h->routing;
  const DispatchRecord rec = dispatchRecord(cfg);
  const size_t elem = dataTypeSize(cfg.dispatch_type);
  const size_t row_bytes = size_t(cfg.hidden) * elem;
  const size_t x_stride = a.x_stride ? a.x_stride : row_bytes;
  const int nblocks = fp8ScaleBlocks(cfg.hidden);
  const bool fp8 = cfg.dispatch_type == epFloat8E4M3;
  const size_t s_tok = a.scales_token_stride ? a.scales_token_stride : size_t(nblocks);
  const size_t s_blk = a.scales_block_stride ? a.scales_block_stride : 1;
  const bool with_topk = a.topk_idx != nullptr;
  const Placement& pl = comm_.placement();
  const bool fits = rt.num_recv <= a.recv_capacity;

  // Token t's record for rank d, with d's local ids.
  auto packFor = [&](int d, int t, uint8_t* out) {
    uint8_t* p = out;
    memcpy(p, static_cast<const char*>(a.x) + size_t(t) * x_stride, row_bytes);
    p += rec.row_bytes;
    if (fp8) {
      float* sc = reinterpret_cast<float*>(p);
      for (int b = 0; b < nblocks; b++) sc[b] = a.x_scales[size_t(t) * s_tok + size_t(b) * s_blk];
    }
    p += rec.scale_bytes;
    if (with_topk) {  // through aligned locals: the record's fields are not 8-byte aligned
      int64_t ids[32];
      float weights[32];
      localizeTopk(pl, d, a.topk_idx, a.topk_idx_type, a.topk_weights, t, K, ids, weights);
      memcpy(p, ids, size_t(K) * 8);
      memcpy(p + rec.idx_bytes, weights, size_t(K) * 4);
    }
    // The sender's top-k (0: no ids): ranks may pass different num_topk.
    uint32_t sender_k = with_topk ? uint32_t(K) : 0;
    memcpy(out + rec.flagOffset(), &sender_k, 4);
  };
  std::vector<int> per_expert(comm_.localExperts(), 0);
  bool all_had_topk = true;
  int wider_from = -1, wider_k = 0;  // a source that passed more top-k columns than this rank
  // Row i of source s's rows, from a record with this rank's local ids.
  auto place = [&](int s, int64_t i, const uint8_t* in) {
    if (!fits) return;  // drain only: the caller's buffers are too small
    int64_t row = rt.recv_offset[s] + i;
    const uint8_t* p = in;
    memcpy(static_cast<char*>(a.recv_x) + size_t(row) * row_bytes, p, row_bytes);
    p += rec.row_bytes;
    if (fp8 && a.recv_scales) memcpy(a.recv_scales + size_t(row) * nblocks, p, size_t(nblocks) * 4);
    p += rec.scale_bytes;
    uint32_t sender_k;
    memcpy(&sender_k, in + rec.flagOffset(), 4);
    if (sender_k == 0) all_had_topk = false;  // a cached re-dispatch without ids
    if (int(sender_k) > K && wider_from < 0) {
      wider_from = s;
      wider_k = int(sender_k);
    }
    // Columns past the sender's top-k (or all, without ids) read -1 / 0.
    const int kk = std::min(K, int(sender_k));
    for (int k = 0; k < K; k++) {
      int64_t id = -1;
      float w = 0.0f;
      if (k < kk) {  // the record's ids are not 8-byte aligned: copy them out
        memcpy(&id, p + size_t(k) * 8, 8);
        memcpy(&w, p + rec.idx_bytes + size_t(k) * 4, 4);
      }
      if (a.recv_topk_idx) a.recv_topk_idx[size_t(row) * K + k] = id;
      if (a.recv_topk_weights) a.recv_topk_weights[size_t(row) * K + k] = w;
      if (id >= 0) per_expert[id]++;
    }
  };
  if (hier_) {
    host::HierDispatchIo io;
    io.rec = rec;
    io.pack = packFor;
    io.place = place;
    io.packForward = [&](int t, uint8_t* out) {  // global ids: the forwarder makes them its ranks' own
      uint8_t* p = out;
      memcpy(p, static_cast<const char*>(a.x) + size_t(t) * x_stride, row_bytes);
      p += rec.row_bytes;
      if (fp8) {
        float* sc = reinterpret_cast<float*>(p);
        for (int b = 0; b < nblocks; b++) sc[b] = a.x_scales[size_t(t) * s_tok + size_t(b) * s_blk];
      }
      p += rec.scale_bytes;
      if (with_topk) {
        int64_t ids[32];
        float weights[32];
        for (int k = 0; k < K; k++) {
          ids[k] = topkAt(a.topk_idx, a.topk_idx_type, size_t(t) * K + k);
          weights[k] = a.topk_weights ? a.topk_weights[size_t(t) * K + k] : 0.0f;
        }
        memcpy(p, ids, size_t(K) * 8);
        memcpy(p + rec.idx_bytes, weights, size_t(K) * 4);
      }
      uint32_t sender_k = with_topk ? uint32_t(K) : 0;
      memcpy(out + rec.flagOffset(), &sender_k, 4);
    };
    EPCHECK(host::hierDispatch(comm_, *exchanger_, fw_, h, io));
  } else {
    std::vector<StreamSpec> sends(R), recvs(R);
    for (int d = 0; d < R; d++) {
      sends[d].records = rt.sendCount(d);
      sends[d].pack = [&, d](int first, int n, uint8_t* out) {
        for (int i = 0; i < n; i++, out += rec.total()) packFor(d, rt.send_tokens[rt.send_offset[d] + first + i], out);
      };
    }
    for (int s = 0; s < R; s++) {
      recvs[s].records = rt.recv_count[s];
      recvs[s].unpack = [&, s](int first, int n, const uint8_t* in) {
        for (int i = 0; i < n; i++, in += rec.total()) place(s, first + i, in);
      };
    }
    EPCHECK(exchanger_->run(host::kChunkDispatch, sends, recvs, "dispatch"));
  }
  if (wider_from >= 0)
    return setError(comm_, epInvalidUsage,
                    "epDispatch: rank %d passed num_topk = %d, more than this rank's %d (the columns of "
                    "recv_topk_idx): a rank may pass fewer top-k columns than its peers, not more",
                    wider_from, wider_k, K);
  if (!fits)
    return setError(comm_, epInvalidArgument,
                    "recv_capacity = %lld is less than the %lld rows this rank receives (the rows "
                    "were drained so the other ranks completed; nothing was written)",
                    (long long)a.recv_capacity, (long long)rt.num_recv);
  // Capacity sizing: rows past num_recv are marked unused with a row of -1.
  if (a.recv_topk_idx && a.recv_capacity > rt.num_recv)
    std::fill(a.recv_topk_idx + size_t(rt.num_recv) * K, a.recv_topk_idx + size_t(a.recv_capacity) * K,
              int64_t(-1));
  // A cached re-dispatch without expert ids reports the counts of the first dispatch.
  if (all_had_topk) h->routing.recv_per_expert = per_expert;
  if (a.recv_tokens_per_expert) {
    const std::vector<int>& counts = h->routing.recv_per_expert;
    for (int e = 0; e < comm_.localExperts(); e++)
      a.recv_tokens_per_expert[e] = e < int(counts.size()) ? alignUp(counts[e], a.expert_alignment) : 0;
  }
  if (a.num_recv) *a.num_recv = rt.num_recv;
  return epSuccess;
}

epResult_t HostBackend::combine(const epCombineArgs_t& a, epHandle* h, epStream_t) {
  const Config& cfg = comm_.config();
  const int R = comm_.nranks(), H = cfg.hidden;
  const Routing& rt = h->routing;
  const epDataType_t type = cfg.combine_type;
  const size_t row_bytes = size_t(H) * dataTypeSize(type);
  const size_t y_stride = a.y_stride ? a.y_stride : row_bytes;
  const int K = a.recv_topk_weights ? a.num_topk : 0;
  const size_t rec_bytes = combineRecordBytes(cfg);
  const size_t k_offset = row_bytes + size_t(cfg.max_topk) * 4;  // the sender's weight count
  const int T = rt.num_tokens;
  int unweighted_from = -1;  // a rank that sent rows without the weights this rank sums back

  // The float32 sums live in buffers kept across calls: a fresh allocation of
  // T x H floats every call costs more in page faults than the sums themselves.
  std::vector<float>& acc = acc_;
  std::vector<float>& acc_w = acc_w_;
  acc.assign(size_t(T) * H, 0.0f);
  acc_w.assign(size_t(T) * (K > 0 ? K : 0), 0.0f);
  if (hier_) {
    host::HierCombineIo io;
    io.row_bytes = row_bytes;
    io.type = type;
    io.K = K;
    io.y = static_cast<const char*>(a.y);
    io.y_stride = y_stride;
    io.recv_weights = a.recv_topk_weights;
    io.acc = acc.data();
    io.acc_w = acc_w.data();
    int unweighted_node = -1;
    io.unweighted_node = &unweighted_node;
    EPCHECK(host::hierCombine(comm_, *exchanger_, fw_, h, io));
    return finishCombine(a, T, K, type, row_bytes, unweighted_node >= 0 ? "a rank of node " : nullptr,
                         unweighted_node);
  }
  std::vector<StreamSpec> sends(R), recvs(R);
  for (int s = 0; s < R; s++) {  // rows received from s go back to s, in order
    sends[s].records = rt.recv_count[s];
    sends[s].pack = [&, s](int first, int n, uint8_t* out) {
      for (int i = 0; i < n; i++, out += rec_bytes) {
        int64_t row = rt.recv_offset[s] + first + i;
        memcpy(out, static_cast<const char*>(a.y) + size_t(row) * y_stride, row_bytes);
        if (K > 0) memcpy(out + row_bytes, a.recv_topk_weights + size_t(row) * K, size_t(K) * 4);
        const int32_t sent_k = K;
        memcpy(out + k_offset, &sent_k, 4);
      }
    };
  }
  for (int d = 0; d < R; d++) {  // my tokens come back from d in the order they were sent
    recvs[d].records = rt.sendCount(d);
    recvs[d].unpack = [&, d](int first, int n, const uint8_t* in) {
      for (int i = 0; i < n; i++, in += rec_bytes) {
        int t = rt.send_tokens[rt.send_offset[d] + first + i];
        addRowAsFloat(in, type, H, &acc[size_t(t) * H]);
        if (K > 0) {
          int32_t sent_k = 0;
          memcpy(&sent_k, in + k_offset, 4);
          if (sent_k == 0 && unweighted_from < 0) unweighted_from = d;
          const float* w = reinterpret_cast<const float*>(in + row_bytes);
          for (int k = 0; k < std::min(K, int(sent_k)); k++) acc_w[size_t(t) * K + k] += w[k];
        }
      }
    };
  }
  EPCHECK(exchanger_->run(host::kChunkCombine, sends, recvs, "combine"));
  return finishCombine(a, T, K, type, row_bytes, unweighted_from >= 0 ? "rank " : nullptr, unweighted_from);
}

// The bias, the rounding to the combine type, and the weights' sums.
epResult_t HostBackend::finishCombine(const epCombineArgs_t& a, int T, int K, epDataType_t type, size_t row_bytes,
                                      const char* unweighted_what, int unweighted) {
  const int H = comm_.config().hidden;
  std::vector<float>& acc = acc_;
  std::vector<float>& acc_w = acc_w_;
  for (int t = 0; t < T; t++) {
    float* sum = &acc[size_t(t) * H];
    if (a.bias) addRowAsFloat(static_cast<const char*>(a.bias) + size_t(t) * row_bytes, type, H, sum);
    storeRowFromFloat(sum, type, H, static_cast<char*>(a.out) + size_t(t) * row_bytes);
  }
  if (unweighted_what != nullptr && a.out_topk_weights)
    return setError(comm_, epInvalidUsage,
                    "epCombine: %s%d passed no recv_topk_weights and this rank did: the weights are "
                    "summed back only when every rank passes them (out is written, out_topk_weights "
                    "is not)",
                    unweighted_what, unweighted);
  if (K > 0 && a.out_topk_weights && !acc_w.empty())
    memcpy(a.out_topk_weights, acc_w.data(), acc_w.size() * 4);
  return epSuccess;
}

}  // namespace

epResult_t createHostBackend(const BackendComm& comm, std::unique_ptr<Backend>* out) {
  auto backend = std::make_unique<HostBackend>(comm);
  EPCHECK(backend->init());
  *out = std::move(backend);
  return epSuccess;
}

}  // namespace ep
