// The plan of a communicator: for every peer, how bytes travel (self, NVLink,
// host-staged, or the network over this rank's rail, forwarded on the far node
// when the peer is not the rail peer), the numbers the kernels need (rail peers,
// node masks), this rank's NIC, and the InfiniBand traffic settings for the RDMA
// transport. docs/TOPOLOGY.md explains the rules.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moeep.h"
#include "topo/topo.h"

struct epComm;

namespace ep {

struct NodeMap;

// ---- InfiniBand / RoCE traffic settings --------------------------------------

enum TrafficClass {
  kTrafficThroughput = 0,
  kTrafficLowLatency = 1,
  kTrafficControl = 2,
  kNumTrafficClasses = 3
};
const char* trafficClassName(int c);  // "throughput", "low-latency", "control"

// Resolved from epConfig_t (struct > EP_IB_* > default).
struct IbTraffic {
  int sl[kNumTrafficClasses] = {0, 0, 0};  // service level 0..15 (the SM maps it to a virtual lane)
  // Adaptive routing per class: 1 on, 0 off, -1 auto (the RDMA transport
  // decides: NCCL's rule is on for InfiniBand, off for RoCE).
  int adaptive_routing[kNumTrafficClasses] = {-1, -1, -1};
  int traffic_class = 0;  // RoCE traffic class 0..255 (DSCP << 2)
  int gid_index = -1;     // 0..255, -1: the transport picks (RoCE v2 GID)
  int qps_per_peer = 1;   // 1..16 queue pairs per peer connection
  // Config version 2. Per class: the class's own traffic class, else traffic_class.
  int tclass[kNumTrafficClasses] = {0, 0, 0};
  int timeout = 20;       // QP local ACK timeout exponent 1..31
  int retry_cnt = 7;      // 0..7
  int qp_budget = 0;      // most QPs per rank, 0: no cap
};

// Reads the ib_* fields of a full-size config c (defaults already filled for
// fields an older caller did not know), applies EP_IB_* variables for the
// fields left at -1, validates, and names the config field or variable at
// fault. Writes *out only on success.
epResult_t ibTrafficResolve(const epConfig_t& c, IbTraffic* out, struct epComm* comm);
// epInvalidArgument naming the first setting that rank r resolved otherwise
// than this rank (me), where the ranks must agree (every one but the GID index).
epResult_t ibTrafficAgree(int r, const IbTraffic& theirs, int me, const IbTraffic& mine, struct epComm* comm);

// ---- The plan ----------------------------------------------------------------

enum class PathKind : uint8_t {
  kSelf = 0,
  kNvlink = 1,       // same node, GPU peer access (CUDA says cudaDeviceCanAccessPeer)
  kHostStaged = 2,   // same node, through host memory
  kRail = 3,         // other node: RDMA to the peer, which is this rank's rail peer there
  kRailForward = 4,  // other node: RDMA to the rail peer there (via), which forwards locally
};
const char* pathKindName(PathKind k);  // "self", "nvlink", "host-staged", "rail", "rail+fwd"

struct PeerPath {
  PathKind kind = PathKind::kHostStaged;
  int node = 0;                              // the peer's node
  int via = -1;                              // kRail / kRailForward: the rank that receives the RDMA
  PeerAccess access = PeerAccess::kUnknown;  // same node: what CUDA said
};

// Node masks have one bit per local index; nodes of more ranks than this get
// no masks (masks_valid = false) but still a full plan.
constexpr int kMaxMaskRanks = 64;

struct Plan {
  int rank = 0, nranks = 0;
  int node = 0, local_rank = 0, num_nodes = 1;
  std::vector<PeerPath> peers;  // [R]
  // The rank this one talks RDMA to on node n (same local index; a smaller node
  // wraps: local index modulo its size). rail_peer[node] is this rank.
  std::vector<int> rail_peer;  // [N]
  // Bit i of rail_sources[n]: local rank i of node n has this rank as its rail
  // peer, so its RDMA arrives here and is forwarded from here.
  std::vector<uint64_t> rail_sources;  // [N]
  int rail_pairs = 0;  // ranks on other nodes it exchanges high-throughput traffic with (railPair)
  bool low_latency = true;  // config.low_latency (without it no low-latency connection is made)
  uint64_t nvlink_mask = 0;            // bit i: local rank i of this node is reachable by peer access
  bool masks_valid = true;
  // Where this rank's network traffic leaves.
  int gpu = -1;  // index in the topology, -1: none
  std::string gpu_bus_id;
  int nic = -1;          // index in the topology, -1: none
  std::string nic_name;  // "" when there is no RDMA NIC
  std::string nic_why;
  std::string topo_source;  // where the topology came from, or why there is none
  IbTraffic ib;
};

// Queue pairs (TCP stream sets) a rank opens on the network once every
// traffic class is connected (docs/TOPOLOGY.md, "Queue pairs"):
//   throughput   qps_per_peer to each of its throughput peers (its rail pairs)
//   low latency  qps_per_peer to every rank on another node, at the first
//                low-latency call (none without config.low_latency)
//   control      1 to every rank on another node
int64_t networkQpCount(int throughput_peers, int low_latency_peers, int control_peers, int qps_per_peer);
// The peers of each class's connections for the rank of plan p (its
// throughput peers: its rail pairs), and the QPs they make.
struct PlanQpTerms {
  int throughput = 0, low_latency = 0, control = 0;
};
PlanQpTerms planQpTerms(const Plan& p);
int64_t planNetworkQps(const Plan& p);

// The rank that `rank` talks RDMA to on node n (itself on its own node).
int railPeer(const NodeMap& m, int rank, int node);
// The rail peer once ranks died (dead: [R], empty for none): railPeer where
// it lives, else its substitute, the next live rank of that node after it
// in local order (wrapping); -1 where every rank of the node is dead. Every
// survivor computes the same from the same dead set (docs/SHRINK.md).
int railPeerAlive(const NodeMap& m, int rank, int node, const std::vector<bool>& dead);
// Ranks a and b on different nodes exchange high-throughput traffic: one is
// the other's rail peer (equal local indices; with nodes of unequal sizes the
// relation is not symmetric, so either way counts).
bool railPair(const NodeMap& m, int a, int b);

// Everything buildPlan needs, so that tests and dry runs can fake any part.
struct PlanInput {
  const NodeMap* nodes = nullptr;
  int rank = 0;
  const Topology* topo = nullptr;   // this rank's machine; may be NULL or unavailable
  std::vector<std::string> bus_id;  // [R] GPU of each rank, "" for none (only this node's are read)
  PeerAccessFn access = nullptr;    // NULL: topoPeerAccess (the CUDA hook)
  IbTraffic ib;
  bool low_latency = true;  // config.low_latency: the low-latency connections can be made
};
epResult_t buildPlan(const PlanInput& in, Plan* out);

// A plan for every rank of nodes of the given sizes on machines like topo, as
// if local rank i drove GPU i of topo (a dry run for moeep_info and tests).
epResult_t planDryRun(const Topology& topo, const std::vector<int>& node_sizes, const IbTraffic& ib,
                      PeerAccessFn access, NodeMap* nodes, std::vector<Plan>* plans);

// One line: "rank 1 node 0 local 1 nic mlx5_1 paths 0:host-staged 1:self 2:rail+fwd@3 3:rail"
std::string planSummary(const Plan& p);
// The plan as a small report (paths per peer, rail peers, masks, NIC, IB settings).
void planPrint(FILE* out, const Plan& p);

// What `moeep_info --topo` / `--plan` print: the topology of xml_path (NULL or
// "": EP_TOPO_XML, else this machine), then, when ranks_per_node and num_nodes
// are positive, the dry-run plan of every rank in one line each and the full
// plan of rank 0. Peer access comes from the CUDA hook, if installed.
epResult_t topoReport(FILE* out, const char* xml_path, int ranks_per_node, int num_nodes);

}  // namespace ep
