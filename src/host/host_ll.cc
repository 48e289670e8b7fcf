#include "host_ll.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "../checks.h"
#include "../data_types.h"
#include "../sizes.h"
#include "convert.h"
#include "fp8.h"

namespace ep {
namespace host {

namespace {

// Wire record of one token to one rank: its row on the wire (an FP8 row is
// followed by its scales), its index on the source, the wire type, and
// config.max_topk expert ids and weights (the source's K of them, then -1):
// one layout for every rank and wire type, so ranks may pass different
// num_topk, and a rank that asked for another wire type can tell.
struct LLDispatchRecord {
  size_t row_bytes, scale_bytes;
  int max_topk;
  size_t tokenOffset() const { return row_bytes + scale_bytes; }
  size_t wireOffset() const { return tokenOffset() + 4; }
  size_t idsOffset() const { return tokenOffset() + 8; }
  size_t weightsOffset() const { return idsOffset() + size_t(max_topk) * 4; }
  size_t total() const { return roundUp(weightsOffset() + size_t(max_topk) * 4, 16); }
};

LLDispatchRecord llRecord(const Config& c) {
  LLDispatchRecord r;
  r.row_bytes = size_t(c.hidden) * 2;                       // BF16, the larger row
  r.scale_bytes = size_t(fp8ScaleBlocks(c.hidden)) * 4;     // room for FP8 scales past an FP8 row
  r.max_topk = c.max_topk;
  return r;
}

// What a low-latency handle remembers between dispatch, combine and complete.
struct LLState {
  // Home side: this rank's tokens and where they went.
  int num_tokens = 0, num_topk = 0;
  Routing routing;
  // Expert side: every (source, token) received, with its local experts.
  struct Arrival {
    int src, token;
    // Per (k) entry on a local expert, k ascending; a repeated expert's
    // entries share one slot.
    std::vector<int> local_expert, slot;
    std::vector<float> weight;
  };
  std::vector<Arrival> arrivals;  // by source rank, then source token
  // Receive halves still owed.
  epLowLatencyDispatchArgs_t dispatch_args;
  std::vector<uint8_t> dispatch_records;  // all arrived records, in order
  epLowLatencyCombineArgs_t combine_args;
  std::vector<float> partial_sum;  // [T, H]: sum over ranks in ascending order
};

LLState* stateOf(epHandle* h) { return static_cast<LLState*>(h->backend_state); }

// Quantises or copies token t of x into a wire row.
void packRow(const Config& c, const epLowLatencyDispatchArgs_t& a, bool fp8, int t, uint8_t* out) {
  const int H = c.hidden;
  const uint16_t* row = static_cast<const uint16_t*>(a.x) + size_t(t) * H;
  if (!fp8) {
    memcpy(out, row, size_t(H) * 2);
    return;
  }
  float* scales = reinterpret_cast<float*>(out + H);
  const bool pow2 = (a.flags & EP_LL_ROUND_SCALE_POW2) != 0;
  for (int b = 0; b < fp8ScaleBlocks(H); b++) {
    const int begin = b * kFp8BlockElems, end = std::min(H, begin + kFp8BlockElems);
    float amax = 0.0f;
    for (int j = begin; j < end; j++) amax = std::fmax(amax, std::fabs(bf16ToFloat(row[j])));
    const float scale = fp8BlockScale(amax, pow2);
    const float inverse = 1.0f / scale;
    for (int j = begin; j < end; j++) out[j] = floatToE4M3(bf16ToFloat(row[j]) * inverse);
    scales[b] = scale;
  }
}

// Expands the arrived records into the expert-major outputs.
void expandDispatch(const BackendComm& comm, LLState* st) {
  const Config& c = comm.config();
  const epLowLatencyDispatchArgs_t& a = st->dispatch_args;
  const int L = comm.localExperts(), R = comm.nranks(), M = c.max_tokens_per_rank, H = c.hidden;
  const int nblocks = fp8ScaleBlocks(H);
  const size_t cap = size_t(R) * M;
  const bool fp8 = a.wire_type == epFloat8E4M3;
  const size_t row_bytes = fp8 ? size_t(H) : size_t(H) * 2;
  std::vector<int> count(L, 0);
  const size_t record_bytes = llRecord(c).total();  // one layout for every rank and wire
  const uint8_t* rec = st->dispatch_records.data();
  for (LLState::Arrival& arr : st->arrivals) {
    for (size_t i = 0; i < arr.local_expert.size(); i++) {
      const int e = arr.local_expert[i];
      // An expert repeated in the token's top-k gets the token once (its
      // first entry's slot): an expert holds at most R * M rows, one per
      // (source, token), and the combine applies each entry's weight to it.
      const size_t first = size_t(std::find(arr.local_expert.begin(), arr.local_expert.end(), e) -
                                  arr.local_expert.begin());
      if (first < i) {
        arr.slot[i] = arr.slot[first];
        continue;
      }
      const int slot = count[e]++;
      arr.slot[i] = slot;
      memcpy(static_cast<uint8_t*>(a.recv_x) + (size_t(e) * cap + slot) * row_bytes, rec, row_bytes);
      if (fp8) {
        const float* scales = reinterpret_cast<const float*>(rec + H);
        for (int b = 0; b < nblocks; b++) a.recv_scales[(size_t(e) * nblocks + b) * cap + slot] = scales[b];
      }
      if (a.recv_src) a.recv_src[size_t(e) * cap + slot] = arr.src * M + arr.token;
    }
    rec += record_bytes;
  }
  for (int e = 0; e < L; e++) a.recv_count[e] = count[e];
  st->dispatch_records.clear();
  st->dispatch_records.shrink_to_fit();
}

void finishCombine(const BackendComm& comm, LLState* st) {
  const int H = comm.config().hidden;
  uint16_t* out = static_cast<uint16_t*>(st->combine_args.out);
  for (size_t i = 0; i < size_t(st->num_tokens) * H; i++) out[i] = floatToBf16(st->partial_sum[i]);
  st->partial_sum.clear();
}

}  // namespace

size_t llRecordBytes(const Config& cfg) {
  if (!cfg.low_latency) return 0;
  const size_t dispatch = llRecord(cfg).total();
  const size_t combine = roundUp(size_t(cfg.hidden) * 4, 16);
  return std::max(dispatch, combine);
}

epResult_t llDispatch(const BackendComm& comm, Exchanger& ex, const epLowLatencyDispatchArgs_t& a, epHandle* h,
                      bool send_only) {
  const Config& c = comm.config();
  const int R = comm.nranks(), K = a.num_topk, L = comm.localExperts();
  const bool fp8 = a.wire_type == epFloat8E4M3;
  const LLDispatchRecord rec = llRecord(c);
  const int KM = c.max_topk;
  const Placement& pl = comm.placement();

  auto st = std::make_unique<LLState>();
  st->num_tokens = a.num_tokens;
  st->num_topk = K;
  st->dispatch_args = a;
  buildSendSide(pl, a.topk_idx, a.topk_idx_type, a.num_tokens, K, &st->routing);

  // Counts first (each rank learns how many tokens each source sends), then
  // the tokens, each once per destination rank.
  EPCHECK(ex.exchangeCounts(kChunkLLCounts, &st->routing, "low-latency dispatch counts"));

  // Each token is quantised once, whatever the number of destinations.
  std::vector<uint8_t> wire(size_t(a.num_tokens) * rec.tokenOffset());
  for (int t = 0; t < a.num_tokens; t++) packRow(c, a, fp8, t, &wire[size_t(t) * rec.tokenOffset()]);

  std::vector<StreamSpec> sends(R), recvs(R);
  const Routing& rt = st->routing;
  for (int d = 0; d < R; d++) {
    sends[d].records = rt.sendCount(d);
    sends[d].pack = [&, d](int first, int n, uint8_t* out) {
      for (int i = 0; i < n; i++, out += rec.total()) {
        const int t = rt.send_tokens[rt.send_offset[d] + first + i];
        memcpy(out, &wire[size_t(t) * rec.tokenOffset()], rec.tokenOffset());
        const int32_t token = t, wire = int32_t(a.wire_type);
        memcpy(out + rec.tokenOffset(), &token, 4);
        memcpy(out + rec.wireOffset(), &wire, 4);
        int32_t* ids = reinterpret_cast<int32_t*>(out + rec.idsOffset());
        float* weights = reinterpret_cast<float*>(out + rec.weightsOffset());
        for (int k = 0; k < KM; k++) {
          ids[k] = k < K ? int32_t(topkAt(a.topk_idx, a.topk_idx_type, size_t(t) * K + k)) : -1;
          weights[k] = k >= K ? 0.0f : a.topk_weights ? a.topk_weights[size_t(t) * K + k] : 1.0f;
        }
      }
    };
  }
  st->dispatch_records.resize(size_t(rt.num_recv) * rec.total());
  st->arrivals.reserve(size_t(rt.num_recv));
  const int first_expert = comm.firstExpert();
  int other_wire_from = -1;  // a source that sent another wire type than this rank asked for
  int other_wire = 0;
  for (int s = 0; s < R; s++) {
    recvs[s].records = rt.recv_count[s];
    recvs[s].unpack = [&, s](int first, int n, const uint8_t* in) {
      memcpy(&st->dispatch_records[size_t(rt.recv_offset[s] + first) * rec.total()], in, size_t(n) * rec.total());
      for (int i = 0; i < n; i++, in += rec.total()) {
        LLState::Arrival arr;
        arr.src = s;
        memcpy(&arr.token, in + rec.tokenOffset(), 4);
        int32_t wire = 0;
        memcpy(&wire, in + rec.wireOffset(), 4);
        if (wire != int32_t(a.wire_type) && other_wire_from < 0) {
          other_wire_from = s;
          other_wire = wire;
        }
        const int32_t* ids = reinterpret_cast<const int32_t*>(in + rec.idsOffset());
        const float* weights = reinterpret_cast<const float*>(in + rec.weightsOffset());
        for (int k = 0; k < KM; k++) {
          if (ids[k] < first_expert || ids[k] >= first_expert + L) continue;
          arr.local_expert.push_back(ids[k] - first_expert);
          arr.weight.push_back(weights[k]);
          arr.slot.push_back(-1);
        }
        st->arrivals.push_back(std::move(arr));
      }
    };
  }
  EPCHECK(ex.run(kChunkLLDispatch, sends, recvs, "low-latency dispatch"));
  if (other_wire_from >= 0)
    return setError(comm, epInvalidUsage,
                    "epLowLatencyDispatch: rank %d sent %s rows and this rank asked for %s: wire_type must be "
                    "the same on every rank of a call",
                    other_wire_from, dataTypeName(epDataType_t(other_wire)), dataTypeName(a.wire_type));
  h->backend_state = st.release();
  h->low_latency = true;
  if (send_only) {
    h->pending = epHandle::Pending::kDispatch;
    return epSuccess;
  }
  expandDispatch(comm, stateOf(h));
  return epSuccess;
}

epResult_t llCombine(const BackendComm& comm, Exchanger& ex, const epLowLatencyCombineArgs_t& a, epHandle* h,
                     bool send_only) {
  LLState* st = stateOf(h);
  const Config& c = comm.config();
  const int R = comm.nranks(), H = c.hidden, M = c.max_tokens_per_rank;
  const size_t cap = size_t(R) * M;
  const size_t rec_bytes = roundUp(size_t(H) * 4, 16);
  const Routing& rt = st->routing;
  const uint16_t* y = static_cast<const uint16_t*>(a.y);

  std::vector<StreamSpec> sends(R), recvs(R);
  for (int s = 0; s < R; s++) {  // partial sums of the tokens s sent here, in arrival order
    sends[s].records = rt.recv_count[s];
    sends[s].pack = [&, s](int first, int n, uint8_t* out) {
      for (int i = 0; i < n; i++, out += rec_bytes) {
        const LLState::Arrival& arr = st->arrivals[size_t(rt.recv_offset[s] + first + i)];
        float* partial = reinterpret_cast<float*>(out);
        std::fill(partial, partial + H, 0.0f);
        for (size_t j = 0; j < arr.local_expert.size(); j++) {
          const uint16_t* row = y + (size_t(arr.local_expert[j]) * cap + arr.slot[j]) * H;
          for (int x = 0; x < H; x++) partial[x] = std::fma(arr.weight[j], bf16ToFloat(row[x]), partial[x]);
        }
      }
    };
  }
  st->partial_sum.assign(size_t(st->num_tokens) * H, 0.0f);
  for (int d = 0; d < R; d++) {  // this rank's tokens come back from d in the order sent
    recvs[d].records = rt.sendCount(d);
    recvs[d].unpack = [&, d](int first, int n, const uint8_t* in) {
      for (int i = 0; i < n; i++, in += rec_bytes) {
        const int t = rt.send_tokens[rt.send_offset[d] + first + i];
        const float* partial = reinterpret_cast<const float*>(in);
        float* acc = &st->partial_sum[size_t(t) * H];
        for (int x = 0; x < H; x++) acc[x] += partial[x];
      }
    };
  }
  EPCHECK(ex.run(kChunkLLCombine, sends, recvs, "low-latency combine"));
  st->combine_args = a;
  if (send_only) {
    h->pending = epHandle::Pending::kCombine;
    return epSuccess;
  }
  finishCombine(comm, st);
  return epSuccess;
}

epResult_t llComplete(const BackendComm& comm, epHandle* h) {
  LLState* st = stateOf(h);
  switch (h->pending) {
    case epHandle::Pending::kDispatch: expandDispatch(comm, st); break;
    case epHandle::Pending::kCombine: finishCombine(comm, st); break;
    case epHandle::Pending::kNone:
      return setError(comm, epInvalidUsage, "epLowLatencyComplete: the handle has no send-only call to finish");
  }
  h->pending = epHandle::Pending::kNone;
  return epSuccess;
}

void llRelease(epHandle* h) {
  delete stateOf(h);
  h->backend_state = nullptr;
}

}  // namespace host
}  // namespace ep
