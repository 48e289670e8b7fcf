// The plan: rail peers, the path to every peer, this rank's NIC, the masks the
// kernels need, and the InfiniBand traffic settings (resolved here so that the
// RDMA transport receives them checked).
#include "plan.h"

#include <array>
#include <cstring>

#include "checks.h"
#include "node_map.h"
#include "params.h"

namespace ep {

const char* trafficClassName(int c) {
  switch (c) {
    case kTrafficThroughput:
      return "throughput";
    case kTrafficLowLatency:
      return "low-latency";
    case kTrafficControl:
      return "control";
    default:
      return "?";
  }
}

const char* pathKindName(PathKind k) {
  switch (k) {
    case PathKind::kSelf:
      return "self";
    case PathKind::kNvlink:
      return "nvlink";
    case PathKind::kHostStaged:
      return "host-staged";
    case PathKind::kRail:
      return "rail";
    case PathKind::kRailForward:
      return "rail+fwd";
  }
  return "?";
}

// ---- IB traffic settings ----------------------------------------------------

namespace {

struct IbField {
  const char* field;  // epConfig_t member, for messages
  const char* param;  // EP_* name without the prefix
  int config_value;
  int64_t (*env)();
  int lo, hi;
  bool auto_ok;  // -1 ("auto") is a valid resolved value
  int* out;
  bool agreed;   // every rank must resolve the same value (ibTrafficAgree)
};

// The settings of r, with their config values (c null: -1, unset). The GID
// index is not agreed: it names an entry of the local port's GID table,
// which may differ between hosts. Both ends of a connection open the same
// queue pairs; a service level, traffic class or routing choice set on some
// ranks only is a setup mistake that would otherwise show as uneven traffic.
std::array<IbField, 15> ibFields(const epConfig_t* c, IbTraffic& r) {
  auto cv = [c](int epConfig_t::*m) { return c ? c->*m : -1; };
  return {{
      {"ib_sl_throughput", "IB_SL_THROUGHPUT", cv(&epConfig_t::ib_sl_throughput), param::IB_SL_THROUGHPUT, 0, 15,
       false, &r.sl[kTrafficThroughput], true},
      {"ib_sl_low_latency", "IB_SL_LOW_LATENCY", cv(&epConfig_t::ib_sl_low_latency), param::IB_SL_LOW_LATENCY, 0,
       15, false, &r.sl[kTrafficLowLatency], true},
      {"ib_sl_control", "IB_SL_CONTROL", cv(&epConfig_t::ib_sl_control), param::IB_SL_CONTROL, 0, 15, false,
       &r.sl[kTrafficControl], true},
      {"ib_traffic_class", "IB_TC", cv(&epConfig_t::ib_traffic_class), param::IB_TC, 0, 255, false,
       &r.traffic_class, true},
      {"ib_gid_index", "IB_GID_INDEX", cv(&epConfig_t::ib_gid_index), param::IB_GID_INDEX, 0, 255, true,
       &r.gid_index, false},
      {"ib_qps_per_peer", "IB_QPS_PER_PEER", cv(&epConfig_t::ib_qps_per_peer), param::IB_QPS_PER_PEER, 1, 16,
       false, &r.qps_per_peer, true},
      {"ib_ar_throughput", "IB_AR_THROUGHPUT", cv(&epConfig_t::ib_ar_throughput), param::IB_AR_THROUGHPUT, 0, 1,
       true, &r.adaptive_routing[kTrafficThroughput], true},
      {"ib_ar_low_latency", "IB_AR_LOW_LATENCY", cv(&epConfig_t::ib_ar_low_latency), param::IB_AR_LOW_LATENCY, 0,
       1, true, &r.adaptive_routing[kTrafficLowLatency], true},
      {"ib_ar_control", "IB_AR_CONTROL", cv(&epConfig_t::ib_ar_control), param::IB_AR_CONTROL, 0, 1, true,
       &r.adaptive_routing[kTrafficControl], true},
      // Version 2. A class's traffic class at -1 takes ib_traffic_class (ibTrafficResolve).
      {"ib_tc_throughput", "IB_TC_THROUGHPUT", cv(&epConfig_t::ib_tc_throughput), param::IB_TC_THROUGHPUT, 0, 255,
       true, &r.tclass[kTrafficThroughput], true},
      {"ib_tc_low_latency", "IB_TC_LOW_LATENCY", cv(&epConfig_t::ib_tc_low_latency), param::IB_TC_LOW_LATENCY, 0,
       255, true, &r.tclass[kTrafficLowLatency], true},
      {"ib_tc_control", "IB_TC_CONTROL", cv(&epConfig_t::ib_tc_control), param::IB_TC_CONTROL, 0, 255, true,
       &r.tclass[kTrafficControl], true},
      {"ib_timeout", "IB_TIMEOUT", cv(&epConfig_t::ib_timeout), param::IB_TIMEOUT, 1, 31, false, &r.timeout, true},
      {"ib_retry_cnt", "IB_RETRY_CNT", cv(&epConfig_t::ib_retry_cnt), param::IB_RETRY_CNT, 0, 7, false,
       &r.retry_cnt, true},
      {"ib_qp_budget", "IB_QP_BUDGET", cv(&epConfig_t::ib_qp_budget), param::IB_QP_BUDGET, 0, 1 << 20, false,
       &r.qp_budget, false},
  }};
}

epResult_t resolveField(const IbField& f, epComm* comm) {
  if (f.config_value < -1 || (f.config_value >= 0 && (f.config_value < f.lo || f.config_value > f.hi)))
    return setError(comm, epInvalidArgument, "config.%s = %d is outside %d..%d (-1: EP_%s or the default)",
                    f.field, f.config_value, f.lo, f.hi, f.param);
  int64_t v = f.config_value;
  if (v == -1) {
    v = f.env();
    bool from_env = paramEnv(f.param) != nullptr;
    if ((v < f.lo || v > f.hi) && !(f.auto_ok && v == -1))
      return setError(comm, epInvalidArgument, "%s%s = %lld is outside %d..%d%s",
                      from_env ? "EP_" : "default of EP_", f.param, (long long)v, f.lo, f.hi,
                      f.auto_ok ? " (-1: auto)" : "");
  }
  *f.out = int(v);
  return epSuccess;
}

}  // namespace

epResult_t ibTrafficResolve(const epConfig_t& c, IbTraffic* out, epComm* comm) {
  IbTraffic r;
  for (const IbField& f : ibFields(&c, r)) EPCHECK(resolveField(f, comm));
  for (int k = 0; k < kNumTrafficClasses; k++)
    if (r.tclass[k] == -1) r.tclass[k] = r.traffic_class;
  *out = r;
  return epSuccess;
}

epResult_t ibTrafficAgree(int r, const IbTraffic& theirs, int me, const IbTraffic& mine, epComm* comm) {
  IbTraffic a = theirs, b = mine;
  const std::array<IbField, 15> fa = ibFields(nullptr, a), fb = ibFields(nullptr, b);
  for (size_t i = 0; i < fa.size(); i++)
    if (fa[i].agreed && *fa[i].out != *fb[i].out)
      return setError(comm, epInvalidArgument,
                      "config differs across ranks: rank %d has %s = %d, rank %d has %d (config.%s or EP_%s)", r,
                      fa[i].field, *fa[i].out, me, *fb[i].out, fa[i].field, fa[i].param);
  return epSuccess;
}

// ---- Building the plan ----------------------------------------------------------

int railPeer(const NodeMap& m, int rank, int node) {
  // Same local index; on a smaller node the index wraps, which spreads the
  // extra ranks of a larger node evenly over the smaller node's ranks.
  return m.node_ranks[node][m.local_rank[rank] % m.node_size[node]];
}

int railPeerAlive(const NodeMap& m, int rank, int node, const std::vector<bool>& dead) {
  const int size = m.node_size[size_t(node)];
  const int first = m.local_rank[size_t(rank)] % size;
  for (int i = 0; i < size; i++) {
    const int r = m.node_ranks[size_t(node)][size_t((first + i) % size)];
    if (dead.empty() || !dead[size_t(r)]) return r;
  }
  return -1;
}

bool railPair(const NodeMap& m, int a, int b) {
  const int na = m.node_of_rank[size_t(a)], nb = m.node_of_rank[size_t(b)];
  return na != nb && (railPeer(m, a, nb) == b || railPeer(m, b, na) == a);
}

epResult_t buildPlan(const PlanInput& in, Plan* out) {
  const NodeMap& m = *in.nodes;
  const int R = int(m.node_of_rank.size());
  if (in.rank < 0 || in.rank >= R || int(in.bus_id.size()) != R)
    return setError(nullptr, epInternalError, "buildPlan: rank %d or %zu bus ids do not fit %d ranks",
                    in.rank, in.bus_id.size(), R);
  Plan p;
  p.rank = in.rank;
  p.nranks = R;
  p.node = m.node_of_rank[in.rank];
  p.local_rank = m.local_rank[in.rank];
  p.num_nodes = m.num_nodes;
  p.ib = in.ib;
  p.low_latency = in.low_latency;
  for (int n = 0; n < m.num_nodes; n++) p.masks_valid = p.masks_valid && m.node_size[n] <= kMaxMaskRanks;

  // GPU and NIC of this rank.
  const Topology* t = in.topo;
  p.topo_source = t == nullptr ? "no topology" : t->available ? t->source : t->why_unavailable;
  p.gpu_bus_id = in.bus_id[in.rank];
  if (t != nullptr && t->available && !p.gpu_bus_id.empty()) p.gpu = topoFindGpu(*t, p.gpu_bus_id.c_str());
  if (p.gpu >= 0) {
    p.nic = t->nic_of_gpu[p.gpu];
    p.nic_why = t->nic_why[p.gpu];
  } else if (t != nullptr && !t->nics.empty()) {
    // No GPU to be near (host ranks): take the usable NICs (as a GPU would
    // choose from) in turn by local rank.
    std::string note;
    const std::vector<char> usable = topoUsableNics(t->nics, &note);
    std::vector<int> in_turn;
    for (size_t n = 0; n < usable.size(); n++)
      if (usable[n]) in_turn.push_back(int(n));
    p.nic = in_turn[size_t(p.local_rank) % in_turn.size()];
    p.nic_why = (p.gpu_bus_id.empty()
                     ? "no GPU: NICs taken in turn by local rank"
                     : "GPU " + p.gpu_bus_id + " not in the topology: NICs taken in turn by local rank") +
                note;
  } else {
    p.nic_why = t == nullptr || !t->available ? p.topo_source : "no RDMA NIC on this machine";
  }
  if (p.nic >= 0) p.nic_name = t->nics[p.nic].name;

  p.rail_peer.resize(m.num_nodes);
  p.rail_sources.assign(m.num_nodes, 0);
  for (int n = 0; n < m.num_nodes; n++) {
    p.rail_peer[n] = railPeer(m, in.rank, n);
    if (!p.masks_valid) continue;
    for (int r : m.node_ranks[n])
      if (railPeer(m, r, p.node) == in.rank) p.rail_sources[n] |= uint64_t(1) << m.local_rank[r];
  }

  p.peers.resize(R);
  for (int q = 0; q < R; q++) {
    PeerPath& path = p.peers[q];
    path.node = m.node_of_rank[q];
    if (q == in.rank) {
      path.kind = PathKind::kSelf;
    } else if (path.node == p.node) {
      const std::string& other = in.bus_id[q];
      if (p.gpu_bus_id.empty() || other.empty())
        path.access = PeerAccess::kUnknown;  // a side has no GPU
      else if (in.access)
        path.access = in.access(p.gpu_bus_id.c_str(), other.c_str());
      else
        path.access = topoPeerAccess(p.gpu_bus_id.c_str(), other.c_str());
      bool direct = path.access == PeerAccess::kP2P || path.access == PeerAccess::kNvlink;
      path.kind = direct ? PathKind::kNvlink : PathKind::kHostStaged;
      if (direct && p.masks_valid) p.nvlink_mask |= uint64_t(1) << m.local_rank[q];
    } else {
      path.via = p.rail_peer[path.node];
      path.kind = path.via == q ? PathKind::kRail : PathKind::kRailForward;
      p.rail_pairs += railPair(m, in.rank, q);
    }
  }
  *out = std::move(p);
  return epSuccess;
}

epResult_t planDryRun(const Topology& topo, const std::vector<int>& node_sizes, const IbTraffic& ib,
                      PeerAccessFn access, NodeMap* nodes, std::vector<Plan>* plans) {
  std::vector<epPeerInfo_v1_t> peers;
  std::vector<std::string> bus_ids;
  for (size_t n = 0; n < node_sizes.size(); n++)
    for (int i = 0; i < node_sizes[n]; i++) {
      epPeerInfo_v1_t peer;
      memset(&peer, 0, sizeof(peer));
      peer.rank = int(peers.size());
      peer.host_hash = n + 1;
      peer.cuda_device = i < int(topo.gpus.size()) ? i : -1;
      peers.push_back(peer);
      bus_ids.push_back(i < int(topo.gpus.size()) ? topo.gpus[i].bus_id : "");
    }
  if (peers.empty()) return setError(nullptr, epInvalidArgument, "dry run: no ranks");
  EPCHECK(buildNodeMap(peers, 0, nodes));
  plans->assign(peers.size(), Plan());
  for (size_t r = 0; r < peers.size(); r++) {
    PlanInput in;
    in.nodes = nodes;
    in.rank = int(r);
    in.topo = &topo;
    in.bus_id = bus_ids;
    in.access = access;
    in.ib = ib;
    EPCHECK(buildPlan(in, &(*plans)[r]));
  }
  return epSuccess;
}

int64_t networkQpCount(int throughput_peers, int low_latency_peers, int control_peers, int qps_per_peer) {
  return int64_t(throughput_peers) * qps_per_peer + int64_t(low_latency_peers) * qps_per_peer +
         int64_t(control_peers);
}

PlanQpTerms planQpTerms(const Plan& p) {
  int remote = 0;
  for (const PeerPath& q : p.peers) remote += q.kind == PathKind::kRail || q.kind == PathKind::kRailForward;
  PlanQpTerms t;
  t.throughput = p.masks_valid ? p.rail_pairs : remote;  // nodes too large for masks: no forwarding
  t.low_latency = p.low_latency ? remote : 0;
  t.control = remote;
  return t;
}

int64_t planNetworkQps(const Plan& p) {
  const PlanQpTerms t = planQpTerms(p);
  return networkQpCount(t.throughput, t.low_latency, t.control, p.ib.qps_per_peer);
}

// ---- Printing -------------------------------------------------------------------

std::string planSummary(const Plan& p) {
  std::string s = "rank " + std::to_string(p.rank) + " node " + std::to_string(p.node) + " local " +
                  std::to_string(p.local_rank) + " nic " + (p.nic_name.empty() ? "none" : p.nic_name) +
                  " paths";
  if (p.nranks > 32) {  // a log line holds about 1 KB: count the kinds instead
    int count[5] = {0, 0, 0, 0, 0};
    for (const PeerPath& q : p.peers) count[int(q.kind)]++;
    for (int k = 0; k < 5; k++)
      if (count[k]) s += std::string(" ") + pathKindName(PathKind(k)) + "=" + std::to_string(count[k]);
    return s;
  }
  for (int q = 0; q < p.nranks; q++) {
    s += " " + std::to_string(q) + ":" + pathKindName(p.peers[q].kind);
    if (p.peers[q].kind == PathKind::kRailForward) s += "@" + std::to_string(p.peers[q].via);
  }
  return s;
}

namespace {
std::string autoOr(int v) { return v < 0 ? "auto" : v ? "on" : "off"; }
}  // namespace

void planPrint(FILE* out, const Plan& p) {
  fprintf(out, "plan of rank %d: node %d of %d, local rank %d, %d ranks\n", p.rank, p.node, p.num_nodes,
          p.local_rank, p.nranks);
  fprintf(out, "  GPU %s, NIC %s: %s\n", p.gpu_bus_id.empty() ? "none" : p.gpu_bus_id.c_str(),
          p.nic_name.empty() ? "none" : p.nic_name.c_str(), p.nic_why.c_str());
  fprintf(out, "  rail peer on each node:");
  for (int n = 0; n < p.num_nodes; n++) fprintf(out, " %d:%d", n, p.rail_peer[n]);
  fprintf(out, "\n");
  if (p.masks_valid) {
    fprintf(out, "  rail sources (local ranks of each node whose RDMA arrives here):");
    for (int n = 0; n < p.num_nodes; n++)
      fprintf(out, " %d:0x%llx", n, (unsigned long long)p.rail_sources[n]);
    fprintf(out, "\n  peer-access mask of this node: 0x%llx\n", (unsigned long long)p.nvlink_mask);
  } else {
    fprintf(out, "  no node masks: a node has more than %d ranks\n", kMaxMaskRanks);
  }
  const IbTraffic& ib = p.ib;
  fprintf(out, "  IB: SL %d/%d/%d, adaptive routing %s/%s/%s (throughput/low-latency/control), ", ib.sl[0],
          ib.sl[1], ib.sl[2], autoOr(ib.adaptive_routing[0]).c_str(), autoOr(ib.adaptive_routing[1]).c_str(),
          autoOr(ib.adaptive_routing[2]).c_str());
  fprintf(out, "TC %d, GID index %s, QPs per peer %d\n", ib.traffic_class,
          ib.gid_index < 0 ? "auto" : std::to_string(ib.gid_index).c_str(), ib.qps_per_peer);
  const PlanQpTerms qp = planQpTerms(p);
  fprintf(out, "  network QPs of this rank: %lld", (long long)planNetworkQps(p));
  if (qp.control > 0)
    fprintf(out, " (throughput %d x %d, low latency %d x %d, control %d x 1)", qp.throughput, ib.qps_per_peer,
            qp.low_latency, ib.qps_per_peer, qp.control);
  if (ib.qp_budget > 0) fprintf(out, " (budget %d)", ib.qp_budget);
  fprintf(out, "\n");
  fprintf(out, "  peer node path\n");
  for (int q = 0; q < p.nranks; q++) {
    const PeerPath& path = p.peers[q];
    fprintf(out, "  %4d %4d %s", q, path.node, pathKindName(path.kind));
    if (path.kind == PathKind::kRailForward) fprintf(out, " via rank %d", path.via);
    if (path.kind == PathKind::kNvlink || path.kind == PathKind::kHostStaged)
      fprintf(out, " (peer access %s)", peerAccessName(path.access));
    fprintf(out, "\n");
  }
}

epResult_t topoReport(FILE* out, const char* xml_path, int ranks_per_node, int num_nodes) {
  std::shared_ptr<const Topology> topo;
  if (xml_path != nullptr && *xml_path != '\0') {
    auto t = std::make_shared<Topology>();
    EPCHECK(topoLoad(xml_path, t.get()));
    topo = t;
  } else {
    EPCHECK(topoLocal(&topo));
  }
  topoPrint(out, *topo);
  if (ranks_per_node <= 0 || num_nodes <= 0) return epSuccess;
  NodeMap nodes;
  std::vector<Plan> plans;
  EPCHECK(
      planDryRun(*topo, std::vector<int>(num_nodes, ranks_per_node), IbTraffic(), nullptr, &nodes, &plans));
  fprintf(out, "plan of %d nodes x %d ranks (local rank i drives GPU i):\n", num_nodes, ranks_per_node);
  for (const Plan& p : plans) fprintf(out, "  %s\n", planSummary(p).c_str());
  planPrint(out, plans[0]);
  return epSuccess;
}

}  // namespace ep
