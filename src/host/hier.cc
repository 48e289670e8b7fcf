#include "hier.h"

#include <algorithm>
#include <cstring>

#include "../checks.h"
#include "../plan.h"

namespace ep {
namespace host {

Forwarding buildForwarding(const BackendComm& comm, const std::vector<bool>& dead) {
  const NodeMap& m = comm.nodes();
  const int R = comm.nranks(), me = comm.rank(), node = m.node_of_rank[size_t(me)];
  auto isDead = [&dead](int r) { return !dead.empty() && dead[size_t(r)]; };
  Forwarding fw;
  fw.carried.assign(size_t(R), {});
  fw.forwarder.assign(size_t(R), -1);
  for (int s = 0; s < R; s++) {
    if (isDead(s)) continue;  // sends nothing
    const int p = m.node_of_rank[size_t(s)] == node ? s : railPeerAlive(m, s, node, dead);
    if (p < 0) continue;
    fw.forwarder[size_t(s)] = p;
    fw.carried[size_t(p)].push_back(s);  // s ascending, so p (own) comes at its place
  }
  // p itself first, then the other nodes' sources ascending.
  for (int p : m.node_ranks[size_t(node)]) {
    if (isDead(p)) continue;
    auto& c = fw.carried[size_t(p)];
    c.erase(std::remove(c.begin(), c.end(), p), c.end());
    c.insert(c.begin(), p);
  }
  fw.rail.assign(size_t(m.num_nodes), -1);
  for (int n = 0; n < m.num_nodes; n++)
    if (n != node) fw.rail[size_t(n)] = railPeerAlive(m, me, n, dead);
  return fw;
}

namespace {

// For each other node, this rank's tokens with an expert there (ascending)
// and the mask of that node's ranks (local indices) that take each.
struct NodeTokens {
  std::vector<int> tokens;
  std::vector<uint64_t> masks;
};
std::vector<NodeTokens> tokensPerNode(const BackendComm& comm, const Routing& rt) {
  const NodeMap& m = comm.nodes();
  const int R = comm.nranks(), T = rt.num_tokens;
  std::vector<std::vector<uint64_t>> mask(size_t(m.num_nodes), std::vector<uint64_t>(size_t(T), 0));
  for (int d = 0; d < R; d++)
    for (int i = rt.send_offset[size_t(d)]; i < rt.send_offset[size_t(d) + 1]; i++)
      mask[size_t(m.node_of_rank[size_t(d)])][size_t(rt.send_tokens[size_t(i)])] |=
          uint64_t(1) << m.local_rank[size_t(d)];
  std::vector<NodeTokens> out(size_t(m.num_nodes));
  for (int n = 0; n < m.num_nodes; n++)
    for (int t = 0; t < T; t++)
      if (mask[size_t(n)][size_t(t)]) {
        out[size_t(n)].tokens.push_back(t);
        out[size_t(n)].masks.push_back(mask[size_t(n)][size_t(t)]);
      }
  return out;
}

}  // namespace

epResult_t exchangeForwardCounts(const BackendComm& comm, Exchanger& ex, const Forwarding& fw, const Routing& rt,
                                 epHandle* h) {
  const int R = comm.nranks(), me = comm.rank();
  const NodeMap& m = comm.nodes();
  const std::vector<NodeTokens> per_node = tokensPerNode(comm, rt);
  std::vector<StreamSpec> sends(static_cast<size_t>(R)), recvs(static_cast<size_t>(R));
  h->fwd_count.assign(size_t(R), 0);
  for (int n = 0; n < m.num_nodes; n++) {
    const int f = fw.rail[size_t(n)];
    if (f < 0) continue;
    const int64_t count = int64_t(per_node[size_t(n)].tokens.size());
    sends[size_t(f)].records = 1;
    sends[size_t(f)].pack = [count](int, int, uint8_t* out) { memcpy(out, &count, 8); };
  }
  for (int s : fw.carried[size_t(me)]) {
    if (s == me) continue;
    recvs[size_t(s)].records = 1;
    recvs[size_t(s)].unpack = [h, s](int, int, const uint8_t* in) {
      int64_t n;
      memcpy(&n, in, 8);
      h->fwd_count[size_t(s)] = int(n);
    };
  }
  return ex.run(kChunkForwardCounts, sends, recvs, "dispatch forward counts");
}

epResult_t hierDispatch(const BackendComm& comm, Exchanger& ex, const Forwarding& fw, epHandle* h,
                        HierDispatchIo& io) {
  const int R = comm.nranks(), me = comm.rank();
  const NodeMap& m = comm.nodes();
  const Routing& rt = h->routing;
  const DispatchRecord& rec = io.rec;
  const size_t fwd_bytes = rec.forwardTotal();

  // Step 1: this rank's tokens to the rail peer of each other node.
  const std::vector<NodeTokens> per_node = tokensPerNode(comm, rt);
  std::vector<StreamSpec> sends(static_cast<size_t>(R)), recvs(static_cast<size_t>(R));
  for (int n = 0; n < m.num_nodes; n++) {
    const int f = fw.rail[size_t(n)];
    if (f < 0) continue;
    const NodeTokens& nt = per_node[size_t(n)];
    sends[size_t(f)].records = int(nt.tokens.size());
    sends[size_t(f)].pack = [&io, &nt, &rec](int first, int count, uint8_t* out) {
      for (int i = 0; i < count; i++, out += rec.forwardTotal()) {
        io.packForward(nt.tokens[size_t(first + i)], out);
        memcpy(out + rec.maskOffset(), &nt.masks[size_t(first + i)], 8);
      }
    };
  }
  // The tokens this rank forwards, held for step 2, and their masks kept in
  // the handle for combine.
  std::vector<std::vector<uint8_t>> held(static_cast<size_t>(R));
  h->fwd_masks.assign(size_t(R), {});
  for (int s : fw.carried[size_t(me)]) {
    if (s == me) continue;
    const int n = h->fwd_count.empty() ? 0 : h->fwd_count[size_t(s)];
    recvs[size_t(s)].records = n;
    held[size_t(s)].resize(size_t(n) * fwd_bytes);
    h->fwd_masks[size_t(s)].resize(size_t(n));
    recvs[size_t(s)].unpack = [&held, h, s, fwd_bytes, &rec](int first, int count, const uint8_t* in) {
      memcpy(&held[size_t(s)][size_t(first) * fwd_bytes], in, size_t(count) * fwd_bytes);
      for (int i = 0; i < count; i++)
        memcpy(&h->fwd_masks[size_t(s)][size_t(first + i)], in + size_t(i) * fwd_bytes + rec.maskOffset(), 8);
    };
  }
  EPCHECK(ex.run(kChunkForward, sends, recvs, "dispatch to other nodes"));

  // Step 2: inside the node. To rank q: for each source this rank carries,
  // ascending (itself first), that source's tokens for q.
  const std::vector<int>& mine = fw.carried[size_t(me)];
  std::vector<StreamSpec> sends2(static_cast<size_t>(R)), recvs2(static_cast<size_t>(R));
  const int node = m.node_of_rank[size_t(me)];
  // Per destination q: the records in order, as (source, index): index is the
  // token for this rank's own, the held record's position for a forwarded one.
  std::vector<std::vector<std::pair<int, int>>> plan(static_cast<size_t>(R));
  for (int q : m.node_ranks[size_t(node)]) {
    auto& list = plan[size_t(q)];
    for (int s : mine) {
      if (s == me) {
        for (int i = rt.send_offset[size_t(q)]; i < rt.send_offset[size_t(q) + 1]; i++)
          list.emplace_back(me, rt.send_tokens[size_t(i)]);
        continue;
      }
      const uint64_t bit = uint64_t(1) << m.local_rank[size_t(q)];
      const auto& masks = h->fwd_masks[size_t(s)];
      for (size_t j = 0; j < masks.size(); j++)
        if (masks[j] & bit) list.emplace_back(s, int(j));
    }
    sends2[size_t(q)].records = int(list.size());
    sends2[size_t(q)].pack = [&, q](int first, int count, uint8_t* out) {
      for (int i = 0; i < count; i++, out += rec.total()) {
        const auto [s, idx] = plan[size_t(q)][size_t(first + i)];
        if (s == me) {
          io.pack(q, idx, out);
          continue;
        }
        // A forwarded record: row and scales as they came, ids made q's own.
        const uint8_t* in = &held[size_t(s)][size_t(idx) * fwd_bytes];
        memcpy(out, in, rec.row_bytes + rec.scale_bytes);
        uint32_t sender_k = 0;
        memcpy(&sender_k, in + rec.flagOffset(), 4);
        int64_t ids[32];
        float weights[32];
        const int k = int(std::min<uint32_t>(sender_k, 32));
        memcpy(ids, in + rec.row_bytes + rec.scale_bytes, size_t(k) * 8);
        memcpy(weights, in + rec.row_bytes + rec.scale_bytes + rec.idx_bytes, size_t(k) * 4);
        int64_t local_ids[32];
        float local_w[32];
        if (k > 0) localizeTopk(comm.placement(), q, ids, epInt64, weights, 0, k, local_ids, local_w);
        memcpy(out + rec.row_bytes + rec.scale_bytes, local_ids, size_t(k) * 8);
        memcpy(out + rec.row_bytes + rec.scale_bytes + rec.idx_bytes, local_w, size_t(k) * 4);
        memcpy(out + rec.flagOffset(), &sender_k, 4);
      }
    };
  }
  // From rank p of this node: its carried sources' rows for this rank, each
  // source's rows in order (recv_count from the flat count step).
  for (int p : m.node_ranks[size_t(node)]) {
    std::vector<std::pair<int, int64_t>> starts;  // (source, first record of it in p's stream)
    int64_t total = 0;
    for (int s : fw.carried[size_t(p)]) {
      starts.emplace_back(s, total);
      total += rt.recv_count[size_t(s)];
    }
    recvs2[size_t(p)].records = int(total);
    recvs2[size_t(p)].unpack = [&io, &rec, starts](int first, int count, const uint8_t* in) {
      for (int i = 0; i < count; i++, in += rec.total()) {
        const int64_t at = first + i;
        size_t k = 0;
        while (k + 1 < starts.size() && starts[k + 1].second <= at) k++;
        io.place(starts[k].first, at - starts[k].second, in);
      }
    };
  }
  return ex.run(kChunkDispatch, sends2, recvs2, "dispatch inside the node");
}

epResult_t hierCombine(const BackendComm& comm, Exchanger& ex, const Forwarding& fw, const epHandle* h,
                       HierCombineIo& io) {
  const int R = comm.nranks(), me = comm.rank(), H = comm.config().hidden;
  const int maxK = comm.config().max_topk;
  const NodeMap& m = comm.nodes();
  const Routing& rt = h->routing;
  const int node = m.node_of_rank[size_t(me)];
  const size_t crec = combineRecordBytes(comm.config());
  const size_t k_offset = io.row_bytes + size_t(maxK) * 4;  // the sender's weight count
  const int T = rt.num_tokens;
  *io.unweighted_node = -1;

  // Step 1: rows back to their forwarder on this node, sources ascending as
  // dispatch's step 2 sent them.
  std::vector<StreamSpec> sends(static_cast<size_t>(R)), recvs(static_cast<size_t>(R));
  for (int p : m.node_ranks[size_t(node)]) {
    std::vector<int> sources = fw.carried[size_t(p)];
    int64_t total = 0;
    for (int s : sources) total += rt.recv_count[size_t(s)];
    sends[size_t(p)].records = int(total);
    sends[size_t(p)].pack = [&io, &rt, sources, crec, k_offset](int first, int count, uint8_t* out) {
      for (int i = 0; i < count; i++, out += crec) {
        int64_t at = first + i;
        size_t k = 0;
        while (at >= rt.recv_count[size_t(sources[k])]) at -= rt.recv_count[size_t(sources[k++])];
        const int64_t row = rt.recv_offset[size_t(sources[k])] + at;
        memcpy(out, io.y + size_t(row) * io.y_stride, io.row_bytes);
        if (io.K > 0) memcpy(out + io.row_bytes, io.recv_weights + size_t(row) * io.K, size_t(io.K) * 4);
        const int32_t sent_k = io.K;
        memcpy(out + k_offset, &sent_k, 4);
      }
    };
  }
  // Sums of this node: this rank's own tokens (own_acc), and each forwarded
  // source's tokens (partial[s], by held position).
  std::vector<float> own_acc(size_t(T) * H, 0.0f), own_w(size_t(T) * std::max(io.K, 0), 0.0f);
  std::vector<std::vector<float>> partial(static_cast<size_t>(R)), partial_w(static_cast<size_t>(R));
  std::vector<std::vector<int32_t>> partial_k(static_cast<size_t>(R));
  for (int s : fw.carried[size_t(me)]) {
    if (s == me) continue;
    const size_t n = h->fwd_masks[size_t(s)].size();
    partial[size_t(s)].assign(n * size_t(H), 0.0f);
    partial_w[size_t(s)].assign(n * size_t(maxK), 0.0f);
    partial_k[size_t(s)].assign(n, maxK);
  }
  for (int q : m.node_ranks[size_t(node)]) {
    // What q sends this rank, in order: (source, index) as dispatch step 2 planned it.
    std::vector<std::pair<int, int>> list;
    const uint64_t bit = uint64_t(1) << m.local_rank[size_t(q)];
    for (int s : fw.carried[size_t(me)]) {
      if (s == me) {
        for (int i = rt.send_offset[size_t(q)]; i < rt.send_offset[size_t(q) + 1]; i++)
          list.emplace_back(me, rt.send_tokens[size_t(i)]);
        continue;
      }
      const auto& masks = h->fwd_masks[size_t(s)];
      for (size_t j = 0; j < masks.size(); j++)
        if (masks[j] & bit) list.emplace_back(s, int(j));
    }
    recvs[size_t(q)].records = int(list.size());
    recvs[size_t(q)].unpack = [&, list, q](int first, int count, const uint8_t* in) {
      for (int i = 0; i < count; i++, in += crec) {
        const auto [s, idx] = list[size_t(first + i)];
        int32_t sent_k = 0;
        memcpy(&sent_k, in + k_offset, 4);
        const float* w = reinterpret_cast<const float*>(in + io.row_bytes);
        if (s == me) {
          addRowAsFloat(in, io.type, H, &own_acc[size_t(idx) * H]);
          if (io.K > 0) {
            if (sent_k == 0 && *io.unweighted_node < 0) *io.unweighted_node = m.node_of_rank[size_t(q)];
            for (int k = 0; k < std::min(io.K, int(sent_k)); k++) own_w[size_t(idx) * io.K + k] += w[k];
          }
          continue;
        }
        addRowAsFloat(in, io.type, H, &partial[size_t(s)][size_t(idx) * H]);
        partial_k[size_t(s)][size_t(idx)] = std::min(partial_k[size_t(s)][size_t(idx)], sent_k);
        for (int k = 0; k < std::min(maxK, int(sent_k)); k++) partial_w[size_t(s)][size_t(idx) * maxK + k] += w[k];
      }
    };
  }
  EPCHECK(ex.run(kChunkCombine, sends, recvs, "combine inside the node"));

  // Step 2: each forwarded source's partials back to it; this rank sums the
  // nodes' partials in ascending node order (its own node's from own_acc).
  const size_t prec = partialRecordBytes(comm.config());
  const size_t pk_offset = size_t(H) * 4 + size_t(maxK) * 4;
  std::vector<StreamSpec> sends2(static_cast<size_t>(R)), recvs2(static_cast<size_t>(R));
  for (int s : fw.carried[size_t(me)]) {
    if (s == me) continue;
    sends2[size_t(s)].records = int(h->fwd_masks[size_t(s)].size());
    sends2[size_t(s)].pack = [&, s](int first, int count, uint8_t* out) {
      for (int i = 0; i < count; i++, out += prec) {
        const size_t j = size_t(first + i);
        memcpy(out, &partial[size_t(s)][j * H], size_t(H) * 4);
        memcpy(out + size_t(H) * 4, &partial_w[size_t(s)][j * maxK], size_t(maxK) * 4);
        memcpy(out + pk_offset, &partial_k[size_t(s)][j], 4);
      }
    };
  }
  const std::vector<NodeTokens> per_node = tokensPerNode(comm, rt);
  std::vector<int> order;  // sources of step 2 by node ascending, this rank at its node's place
  for (int n = 0; n < m.num_nodes; n++)
    if (n == node || fw.rail[size_t(n)] >= 0) order.push_back(n == node ? me : fw.rail[size_t(n)]);
  for (int r = 0; r < R; r++)
    if (std::find(order.begin(), order.end(), r) == order.end()) order.push_back(r);
  // This rank's own node: its own sums, added at the node's place.
  sends2[size_t(me)].records = T;
  sends2[size_t(me)].pack = [](int, int, uint8_t*) {};
  recvs2[size_t(me)].records = T;
  recvs2[size_t(me)].unpack = [&](int first, int count, const uint8_t*) {
    for (int t = first; t < first + count; t++) {
      float* acc = &io.acc[size_t(t) * H];
      const float* own = &own_acc[size_t(t) * H];
      for (int j = 0; j < H; j++) acc[j] += own[j];
      for (int k = 0; k < io.K; k++) io.acc_w[size_t(t) * io.K + k] += own_w[size_t(t) * io.K + k];
    }
  };
  for (int n = 0; n < m.num_nodes; n++) {
    const int f = fw.rail[size_t(n)];
    if (f < 0) continue;
    const NodeTokens* nt = &per_node[size_t(n)];
    recvs2[size_t(f)].records = int(nt->tokens.size());
    recvs2[size_t(f)].unpack = [&, nt, n](int first, int count, const uint8_t* in) {
      for (int i = 0; i < count; i++, in += prec) {
        const int t = nt->tokens[size_t(first + i)];
        const float* row = reinterpret_cast<const float*>(in);
        float* acc = &io.acc[size_t(t) * H];
        for (int j = 0; j < H; j++) acc[j] += row[j];
        int32_t k_sent = 0;
        memcpy(&k_sent, in + pk_offset, 4);
        if (io.K > 0) {
          if (k_sent == 0 && *io.unweighted_node < 0) *io.unweighted_node = n;
          const float* w = reinterpret_cast<const float*>(in + size_t(H) * 4);
          for (int k = 0; k < std::min(io.K, int(k_sent)); k++) io.acc_w[size_t(t) * io.K + k] += w[k];
        }
      }
    };
  }
  return ex.run(kChunkPartials, sends2, recvs2, "combine across nodes", &order);
}

}  // namespace host
}  // namespace ep
