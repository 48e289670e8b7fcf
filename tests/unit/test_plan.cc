// The plan on the XML fixtures (tests/data/) for 2-node and 4-node layouts:
// path per peer, rail peers (with the wrap-around of uneven nodes), node masks,
// the NIC of each rank; the InfiniBand traffic settings (config > EP_IB_* >
// default, validation naming the field or variable); per-node token counts.
//
// Cases that need EP_* variables run in a fresh process (this program re-run
// with "--child NAME"): parameters are read once per process.
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "comm.h"
#include "child_cases.h"
#include "common.h"
#include "fixtures.h"
#include "plan.h"
#include "routing.h"

namespace {

using ep::PathKind;
using ep::Plan;
using ep::Topology;

using eptest::fixturePath;
using eptest::loadFixture;
using eptest::printed;

ep::PeerAccess allNvlink(const char*, const char*) { return ep::PeerAccess::kNvlink; }
ep::PeerAccess noAccess(const char*, const char*) { return ep::PeerAccess::kNone; }

// The rules every plan obeys, checked for every rank against the node map.
void checkInvariants(const ep::NodeMap& m, const std::vector<Plan>& plans, PathKind same_node) {
  const int R = int(plans.size());
  for (int r = 0; r < R; r++) {
    const Plan& p = plans[r];
    assert_int_equal(p.rank, r);
    assert_int_equal(p.node, m.node_of_rank[r]);
    assert_int_equal(p.local_rank, m.local_rank[r]);
    assert_int_equal(p.rail_peer[p.node], r);
    for (int n = 0; n < m.num_nodes; n++) {
      int rp = p.rail_peer[n];
      assert_int_equal(m.node_of_rank[rp], n);
      assert_int_equal(m.local_rank[rp], m.local_rank[r] % m.node_size[n]);
      uint64_t sources = 0;  // who on node n sends its rail traffic here
      for (int q : m.node_ranks[n])
        if (plans[q].rail_peer[p.node] == r) sources |= uint64_t(1) << m.local_rank[q];
      assert_int_equal(p.rail_sources[n], sources);
    }
    for (int q = 0; q < R; q++) {
      const ep::PeerPath& path = p.peers[q];
      assert_int_equal(path.node, m.node_of_rank[q]);
      if (q == r) {
        assert_int_equal(int(path.kind), int(PathKind::kSelf));
      } else if (path.node == p.node) {
        assert_int_equal(int(path.kind), int(same_node));
      } else {
        assert_int_equal(path.via, p.rail_peer[path.node]);
        assert_int_equal(int(path.kind), int(path.via == q ? PathKind::kRail : PathKind::kRailForward));
      }
    }
  }
}

std::vector<Plan> dryRun(const Topology& t, const std::vector<int>& sizes, ep::PeerAccessFn access,
                         ep::NodeMap* m) {
  std::vector<Plan> plans;
  assert_ok(ep::planDryRun(t, sizes, ep::IbTraffic(), access, m, &plans));
  assert_int_equal(m->num_nodes, int(sizes.size()));
  return plans;
}

// ---- DGX-H100-like: NVLink inside, rail-aligned RDMA across ----------------------------

void dgx_two_and_four_nodes(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  for (int nodes : {2, 4}) {
    ep::NodeMap m;
    std::vector<Plan> plans = dryRun(t, std::vector<int>(nodes, 8), allNvlink, &m);
    assert_int_equal(plans.size(), 8 * nodes);
    checkInvariants(m, plans, PathKind::kNvlink);
    // Rank 11 = node 1, local 3: GPU 3 (0000:61:00.0) with its switch NIC mlx5_3.
    const Plan& p = plans[11];
    assert_int_equal(p.node, 1);
    assert_int_equal(p.local_rank, 3);
    assert_string_equal(p.gpu_bus_id.c_str(), "0000:61:00.0");
    assert_string_equal(p.nic_name.c_str(), "mlx5_3");
    assert_contains(p.nic_why.c_str(), "PIX");
    assert_int_equal(p.nvlink_mask, 0xffu & ~(1u << 3));
    assert_int_equal(p.rail_peer[0], 3);
    assert_int_equal(p.rail_sources[0], 1u << 3);  // equal nodes: only the same index
    assert_int_equal(int(p.peers[3].kind), int(PathKind::kRail));
    assert_int_equal(int(p.peers[4].kind), int(PathKind::kRailForward));
    assert_int_equal(p.peers[4].via, 3);
    assert_int_equal(int(p.peers[8].kind), int(PathKind::kNvlink));
    assert_int_equal(int(p.peers[8].access), int(ep::PeerAccess::kNvlink));
    if (nodes == 4) {
      assert_int_equal(p.rail_peer[3], 27);
      assert_int_equal(int(p.peers[30].kind), int(PathKind::kRailForward));
      assert_int_equal(p.peers[30].via, 27);
    }
    for (int r = 0; r < 8 * nodes; r++)
      assert_string_equal(plans[r].nic_name.c_str(), ("mlx5_" + std::to_string(r % 8)).c_str());
  }
}

void dgx_uneven_nodes_wrap_the_rail(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  ep::NodeMap m;
  std::vector<Plan> plans = dryRun(t, {8, 3}, allNvlink, &m);
  checkInvariants(m, plans, PathKind::kNvlink);
  // Local 7 of the big node talks to local 7 % 3 = 1 of the small one (rank 9).
  assert_int_equal(plans[7].rail_peer[1], 9);
  assert_int_equal(int(plans[7].peers[9].kind), int(PathKind::kRail));
  assert_int_equal(plans[7].peers[10].via, 9);
  // So rank 9 receives the rail traffic of locals 1, 4 and 7 of node 0 ...
  assert_int_equal(plans[9].rail_sources[0], (1u << 1) | (1u << 4) | (1u << 7));
  // ... but sends its own to local 1 only; rank 7 gets rank 9's through rank 1.
  assert_int_equal(plans[9].rail_peer[0], 1);
  assert_int_equal(int(plans[9].peers[7].kind), int(PathKind::kRailForward));
  assert_int_equal(plans[9].peers[7].via, 1);
  assert_int_equal(plans[9].nvlink_mask, 0x5u);  // locals 0 and 2 of its 3-rank node
}

// ---- PCIe-only box: host-staged inside, one shared NIC ---------------------------------

void pcie_box_two_and_four_nodes(void**) {
  Topology t;
  loadFixture("pcie_box.xml", &t);
  for (int nodes : {2, 4}) {
    ep::NodeMap m;
    std::vector<Plan> plans = dryRun(t, std::vector<int>(nodes, 4), noAccess, &m);
    checkInvariants(m, plans, PathKind::kHostStaged);
    for (const Plan& p : plans) {
      assert_string_equal(p.nic_name.c_str(), "mlx5_0");
      assert_int_equal(p.nvlink_mask, 0);
    }
    assert_contains(plans[2].nic_why.c_str(), "SYS");
    assert_contains(plans[5].nic_why.c_str(), "NODE");
    assert_int_equal(int(plans[5].peers[4].access), int(ep::PeerAccess::kNone));
    assert_int_equal(plans[5].rail_peer[0], 1);
    assert_int_equal(plans[0].peers[nodes * 4 - 1].via, 4 * (nodes - 1));
  }
}

// ---- VM with a flat PCI tree: access unknown (no CUDA hook), NICs spread ----------------

void vm_flat_two_and_four_nodes(void**) {
  Topology t;
  loadFixture("vm_flat.xml", &t);
  for (int nodes : {2, 4}) {
    ep::NodeMap m;
    std::vector<Plan> plans = dryRun(t, std::vector<int>(nodes, 4), nullptr, &m);
    checkInvariants(m, plans, PathKind::kHostStaged);
    for (const Plan& p : plans) {
      assert_string_equal(p.nic_name.c_str(), p.local_rank % 2 ? "mlx5_1" : "mlx5_0");
      assert_int_equal(int(p.peers[m.node_ranks[p.node][(p.local_rank + 1) % 4]].access),
                       int(ep::PeerAccess::kUnknown));
    }
  }
  // More ranks per node than GPUs: the extra ranks have no GPU and take NICs in turn.
  ep::NodeMap m;
  std::vector<Plan> plans = dryRun(t, {5, 5}, nullptr, &m);
  assert_string_equal(plans[4].gpu_bus_id.c_str(), "");
  assert_string_equal(plans[4].nic_name.c_str(), "mlx5_0");
  assert_contains(plans[4].nic_why.c_str(), "no GPU");
  // Ranks without a GPU take in turn only the NICs a GPU would choose from:
  // not mlx5_1 once its port is down.
  Topology down;
  loadFixture("vm_flat_port_down.xml", &down);
  plans = dryRun(down, {6}, nullptr, &m);
  assert_string_equal(plans[5].gpu_bus_id.c_str(), "");
  assert_string_equal(plans[5].nic_name.c_str(), "mlx5_0");
  assert_contains(plans[5].nic_why.c_str(), "mlx5_1 left out (no port ACTIVE)");
  // A rank without a GPU has no peer access, whatever the hook says.
  plans = dryRun(t, {5}, allNvlink, &m);
  assert_int_equal(int(plans[4].peers[0].kind), int(PathKind::kHostStaged));
  assert_int_equal(int(plans[0].peers[4].access), int(ep::PeerAccess::kUnknown));
  assert_int_equal(int(plans[0].peers[1].kind), int(PathKind::kNvlink));
  assert_int_equal(plans[0].nvlink_mask, 0xeu);
}

// ---- Plan without a topology, large nodes, printing ------------------------------------

void plan_without_topology_or_masks(void**) {
  std::vector<epPeerInfo_v1_t> peers(130);
  for (size_t r = 0; r < peers.size(); r++) {
    memset(&peers[r], 0, sizeof(peers[r]));
    peers[r].host_hash = 1 + r / 65;  // two nodes of 65 ranks: no 64-bit masks
  }
  ep::NodeMap m;
  assert_ok(ep::buildNodeMap(peers, 0, &m));
  ep::PlanInput in;
  in.nodes = &m;
  in.rank = 70;
  in.bus_id.assign(peers.size(), "");
  Topology none;
  none.why_unavailable = "hwloc not available";
  in.topo = &none;
  Plan p;
  assert_ok(ep::buildPlan(in, &p));
  assert_false(p.masks_valid);
  assert_int_equal(p.nic, -1);
  assert_contains(p.nic_why.c_str(), "hwloc not available");
  assert_int_equal(p.rail_peer[0], 5);
  assert_int_equal(int(p.peers[5].kind), int(PathKind::kRail));
  assert_int_equal(int(p.peers[71].kind), int(PathKind::kHostStaged));
  assert_contains(ep::planSummary(p).c_str(), "rank 70 node 1 local 5 nic none paths self=1 host-staged=64");
  in.rank = 130;
  assert_result(ep::buildPlan(in, &p), epInternalError);
}

void summary_and_report(void**) {
  Topology t;
  loadFixture("vm_flat.xml", &t);
  ep::NodeMap m;
  std::vector<Plan> plans;
  ep::IbTraffic ib;
  ib.sl[ep::kTrafficLowLatency] = 3;
  ib.adaptive_routing[ep::kTrafficThroughput] = 1;
  ib.gid_index = 3;
  ib.qps_per_peer = 4;
  assert_ok(ep::planDryRun(t, {2, 2}, ib, nullptr, &m, &plans));
  assert_int_equal(plans[1].ib.qps_per_peer, 4);  // carried for the RDMA transport
  assert_string_equal(ep::planSummary(plans[1]).c_str(),
                      "rank 1 node 0 local 1 nic mlx5_1 paths 0:host-staged 1:self 2:rail+fwd@3 3:rail");
  std::string text = printed([&](FILE* f) { ep::planPrint(f, plans[1]); });
  assert_contains(text.c_str(), "plan of rank 1: node 0 of 2, local rank 1, 4 ranks");
  assert_contains(text.c_str(), "GPU 0000:06:00.0, NIC mlx5_1: PHB");
  assert_contains(text.c_str(), "rail peer on each node: 0:1 1:3");
  assert_contains(text.c_str(), "IB: SL 0/3/0, adaptive routing on/auto/auto");
  assert_contains(text.c_str(), "GID index 3, QPs per peer 4");
  assert_contains(text.c_str(), "     2    1 rail+fwd via rank 3");
  // throughput to 1 rail peer x 4, low latency to 2 ranks on the other node x 4, control 2 x 1
  assert_contains(text.c_str(), "network QPs of this rank: 14 (throughput 1 x 4, low latency 2 x 4, control 2 x 1)");
}

// The QP count of docs/TOPOLOGY.md ("Queue pairs") for a 32-node plan of 8
// GPUs each: every rank connects to the 248 ranks on other nodes, with
// qps_per_peer QPs each, and no rank more than that.
void qp_count_of_a_32_node_plan(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  for (int q : {1, 2, 4}) {
    ep::NodeMap m;
    std::vector<Plan> plans;
    ep::IbTraffic ib;
    ib.qps_per_peer = q;
    assert_ok(ep::planDryRun(t, std::vector<int>(32, 8), ib, allNvlink, &m, &plans));
    assert_int_equal(plans.size(), 256);
    // Throughput: q to each of the 31 rail peers; low latency: q to each of
    // the 248 ranks on other nodes; control: 1 to each of them.
    for (const Plan& p : plans) {
      assert_int_equal(p.rail_pairs, 31);
      assert_int_equal(ep::planNetworkQps(p), int64_t(31) * q + int64_t(248) * q + 248);
    }
  }
  assert_int_equal(ep::networkQpCount(31, 248, 248, 16), 31 * 16 + 248 * 16 + 248);
  assert_int_equal(ep::networkQpCount(31, 0, 248, 1), 31 + 248);  // without config.low_latency
  {  // nodes of 8 and 4: local 1 of the small node is the rail peer of locals 1 and 5 of the large one
    ep::NodeMap m2;
    std::vector<Plan> uneven = dryRun(t, {8, 4}, allNvlink, &m2);
    assert_int_equal(uneven[9].rail_pairs, 2);  // rank 9 = node 1, local 1
    assert_int_equal(uneven[1].rail_pairs, 1);
    assert_int_equal(uneven[5].rail_pairs, 1);
    assert_int_equal(ep::planNetworkQps(uneven[9]), 2 + 8 + 8);
    assert_int_equal(ep::planNetworkQps(uneven[5]), 1 + 4 + 4);
  }
  ep::NodeMap m;  // one node: no network QPs at all
  std::vector<Plan> plans = dryRun(t, {8}, allNvlink, &m);
  for (const Plan& p : plans) assert_int_equal(ep::planNetworkQps(p), 0);
}

void dry_run_report(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);  // skips without hwloc
  std::string path = fixturePath("dgx_h100.xml");
  std::string text = printed([&](FILE* f) { assert_ok(ep::topoReport(f, path.c_str(), 8, 2)); });
  assert_contains(text.c_str(), "GPU 5 -> mlx5_5: PIX");
  assert_contains(text.c_str(), "plan of 2 nodes x 8 ranks");
  assert_contains(text.c_str(), "  rank 9 node 1 local 1 nic mlx5_1 paths 0:rail+fwd@1 1:rail ");
  assert_contains(text.c_str(), "plan of rank 0: node 0 of 2");
  text = printed([&](FILE* f) { assert_ok(ep::topoReport(f, path.c_str(), 0, 0)); });
  assert_null(strstr(text.c_str(), "plan of"));
  assert_result(ep::topoReport(stdout, "/nonexistent.xml", 8, 2), epInvalidArgument);
}

// ---- Per-node token counts (what epLayout reports) under a node map -----------------------

void layout_counts_tokens_per_node(void**) {
  // 6 ranks in nodes of sizes 3, 2, 1 (by host), 12 experts, 2 per rank.
  std::vector<epPeerInfo_v1_t> peers(6);
  const uint64_t host[6] = {1, 1, 1, 2, 2, 3};
  for (int r = 0; r < 6; r++) {
    memset(&peers[r], 0, sizeof(peers[r]));
    peers[r].host_hash = host[r];
  }
  ep::NodeMap m;
  assert_ok(ep::buildNodeMap(peers, 0, &m));
  ep::Placement pl;
  pl.num_experts = 12;
  pl.nranks = 6;
  pl.experts_per_rank = 2;
  // Token 0: ranks 0 and 1 (node 0 once); token 1: ranks 3 and 5; token 2: -1 and rank 4.
  const int64_t topk[3 * 2] = {0, 3, 6, 11, -1, 9};
  std::vector<int> per_node(3), per_rank(6);
  ep::computeLayout(pl, topk, epInt64, 3, 2, m.node_of_rank.data(), m.num_nodes, per_rank.data(),
                    per_node.data(), nullptr, nullptr);
  assert_true((per_node == std::vector<int>{1, 2, 1}));
  assert_true((per_rank == std::vector<int>{1, 1, 0, 1, 1, 1}));
  int worst = -1;
  assert_int_equal(ep::maxNodesPerToken(pl, topk, epInt64, 3, 2, m.node_of_rank.data(), m.num_nodes, &worst),
                   2);
  assert_int_equal(worst, 1);
}

// ---- InfiniBand traffic settings ------------------------------------------------------------

epConfig_t validConfig() {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  c.num_experts = 8;
  c.hidden = 128;
  c.max_tokens_per_rank = 16;
  c.max_topk = 2;
  c.backend = epBackendHost;
  return c;
}

void ib_defaults_and_explicit_values(void**) {
  epConfig_t c = validConfig();
  assert_int_equal(c.ib_sl_throughput, -1);  // the initialiser leaves every IB field unset
  assert_int_equal(c.ib_ar_control, -1);
  ep::Config r;
  assert_ok(ep::configResolve(&c, 2, &r, nullptr));
  const ep::IbTraffic& ib = r.ib;
  for (int k = 0; k < ep::kNumTrafficClasses; k++) {
    assert_int_equal(ib.sl[k], 0);
    assert_int_equal(ib.adaptive_routing[k], -1);
  }
  assert_int_equal(ib.traffic_class, 0);
  assert_int_equal(ib.gid_index, -1);
  assert_int_equal(ib.qps_per_peer, 1);
  c.ib_sl_throughput = 1;
  c.ib_sl_low_latency = 15;
  c.ib_sl_control = 0;
  c.ib_traffic_class = 106;
  c.ib_gid_index = 3;
  c.ib_qps_per_peer = 16;
  c.ib_ar_throughput = 1;
  c.ib_ar_low_latency = 0;
  assert_ok(ep::configResolve(&c, 2, &r, nullptr));
  assert_int_equal(r.ib.sl[ep::kTrafficThroughput], 1);
  assert_int_equal(r.ib.sl[ep::kTrafficLowLatency], 15);
  assert_int_equal(r.ib.traffic_class, 106);
  assert_int_equal(r.ib.gid_index, 3);
  assert_int_equal(r.ib.qps_per_peer, 16);
  assert_int_equal(r.ib.adaptive_routing[ep::kTrafficThroughput], 1);
  assert_int_equal(r.ib.adaptive_routing[ep::kTrafficLowLatency], 0);
  assert_int_equal(r.ib.adaptive_routing[ep::kTrafficControl], -1);
  assert_string_equal(ep::trafficClassName(ep::kTrafficControl), "control");
}

void ib_out_of_range_is_rejected_naming_the_field(void**) {
  struct Bad {
    int epConfig_t::*field;
    int value;
    const char* name;
  } bad[] = {
      {&epConfig_t::ib_sl_throughput, 16, "config.ib_sl_throughput = 16 is outside 0..15"},
      {&epConfig_t::ib_sl_low_latency, -2, "config.ib_sl_low_latency = -2"},
      {&epConfig_t::ib_sl_control, 99, "config.ib_sl_control"},
      {&epConfig_t::ib_traffic_class, 256, "config.ib_traffic_class = 256 is outside 0..255"},
      {&epConfig_t::ib_gid_index, 256, "config.ib_gid_index"},
      {&epConfig_t::ib_gid_index, -5, "config.ib_gid_index"},
      {&epConfig_t::ib_qps_per_peer, 0, "config.ib_qps_per_peer = 0 is outside 1..16"},
      {&epConfig_t::ib_qps_per_peer, 17, "config.ib_qps_per_peer"},
      {&epConfig_t::ib_ar_throughput, 2, "config.ib_ar_throughput = 2 is outside 0..1"},
      {&epConfig_t::ib_ar_control, -3, "config.ib_ar_control"},
  };
  for (const Bad& b : bad) {
    epConfig_t c = validConfig();
    c.*b.field = b.value;
    ep::Config r;
    r.hidden = -777;
    assert_result(ep::configResolve(&c, 2, &r, nullptr), epInvalidArgument);
    assert_contains(ep::threadLastError(), b.name);
    assert_int_equal(r.hidden, -777);  // nothing written on error
  }
}

void ib_older_config_gets_defaults(void**) {
  // A caller compiled before the IB fields: its struct ends at max_nodes_per_token,
  // and whatever lies past it is not its to give.
  const size_t v1 = offsetof(epConfig_t, max_nodes_per_token) + sizeof(int);
  union {
    epConfig_t c;
    unsigned char bytes[sizeof(epConfig_t)];
  } buf;
  memset(buf.bytes, 0x7f, sizeof(buf.bytes));
  epConfig_t valid = validConfig();
  memcpy(buf.bytes, &valid, v1);
  buf.c.size = v1;
  ep::Config r;
  assert_ok(ep::configResolve(&buf.c, 2, &r, nullptr));
  assert_int_equal(r.ib.qps_per_peer, 1);
  assert_int_equal(r.ib.sl[ep::kTrafficControl], 0);
}

// Child cases: EP_IB_* variables set before the library first reads them.
using eptest::ChildCase;

const std::vector<ChildCase>& childCases() {
  static const std::vector<ChildCase> cases = {
      {"env-fills-unset-fields",
       {{"EP_IB_SL_CONTROL", "7"},
        {"EP_IB_TC", "96"},
        {"EP_IB_QPS_PER_PEER", "4"},
        {"EP_IB_AR_LOW_LATENCY", "1"}},
       [] {
         epConfig_t c = validConfig();
         c.ib_qps_per_peer = 2;  // the struct wins over EP_IB_QPS_PER_PEER
         ep::Config r;
         if (ep::configResolve(&c, 2, &r, nullptr) != epSuccess) return 1;
         if (r.ib.sl[ep::kTrafficControl] != 7) return 2;
         if (r.ib.traffic_class != 96) return 3;
         if (r.ib.qps_per_peer != 2) return 4;
         if (r.ib.adaptive_routing[ep::kTrafficLowLatency] != 1) return 5;
         if (r.ib.sl[ep::kTrafficThroughput] != 0) return 6;
         return 0;
       }},
      {"env-out-of-range-names-variable",
       {{"EP_IB_QPS_PER_PEER", "0"}},
       [] {
         epConfig_t c = validConfig();
         ep::Config r;
         if (ep::configResolve(&c, 2, &r, nullptr) != epInvalidArgument) return 1;
         if (!strstr(ep::threadLastError(), "EP_IB_QPS_PER_PEER = 0 is outside 1..16")) return 2;
         c.ib_qps_per_peer = 8;  // a valid struct value hides the bad variable
         if (ep::configResolve(&c, 2, &r, nullptr) != epSuccess) return 3;
         return 0;
       }},
      {"env-gid-auto-allowed-sl-auto-not",
       {{"EP_IB_GID_INDEX", "-1"}, {"EP_IB_SL_THROUGHPUT", "-1"}},
       [] {
         epConfig_t c = validConfig();
         ep::Config r;
         if (ep::configResolve(&c, 2, &r, nullptr) != epInvalidArgument) return 1;
         if (!strstr(ep::threadLastError(), "EP_IB_SL_THROUGHPUT = -1")) return 2;
         c.ib_sl_throughput = 2;
         if (ep::configResolve(&c, 2, &r, nullptr) != epSuccess || r.ib.gid_index != -1) return 3;
         return 0;
       }},
  };
  return cases;
}

void runInFreshProcess(const char* name) { eptest::runInFreshProcess(childCases(), name); }

void ib_env_fills_unset_fields(void**) { runInFreshProcess("env-fills-unset-fields"); }
void ib_env_out_of_range(void**) { runInFreshProcess("env-out-of-range-names-variable"); }
void ib_env_auto_values(void**) { runInFreshProcess("env-gid-auto-allowed-sl-auto-not"); }

int groupSetup(void**) {
  eptest::unsetAllParams();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int child_rc = 0;
  if (eptest::runChildCase(argc, argv, childCases(), &child_rc)) return child_rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dgx_two_and_four_nodes),
      cmocka_unit_test(dgx_uneven_nodes_wrap_the_rail),
      cmocka_unit_test(pcie_box_two_and_four_nodes),
      cmocka_unit_test(vm_flat_two_and_four_nodes),
      cmocka_unit_test(plan_without_topology_or_masks),
      cmocka_unit_test(summary_and_report),
      cmocka_unit_test(qp_count_of_a_32_node_plan),
      cmocka_unit_test(dry_run_report),
      cmocka_unit_test(layout_counts_tokens_per_node),
      cmocka_unit_test(ib_defaults_and_explicit_values),
      cmocka_unit_test(ib_out_of_range_is_rejected_naming_the_field),
      cmocka_unit_test(ib_older_config_gets_defaults),
      cmocka_unit_test(ib_env_fills_unset_fields),
      cmocka_unit_test(ib_env_out_of_range),
      cmocka_unit_test(ib_env_auto_values),
  };
  return cmocka_run_group_tests_name("plan", tests, groupSetup, nullptr);
}
