// Four host ranks on one machine declared as two nodes of two (EP_NODE_SIZE=2),
// through the public API only:
//  - epCommNodes gives the node of every rank;
//  - the plan each rank logs at INFO (EP_DEBUG_SUBSYS=TOPO, one file per rank
//    through EP_DEBUG_FILE; format in docs/TOPOLOGY.md) has the right path to
//    every peer (self / host-staged inside a node, rail to the same local index
//    on the other node, rail+fwd through it otherwise) and NIC (EP_TOPO_XML is
//    the flat VM fixture: GPU-less ranks take its two NICs in turn);
//  - epLayout's tokens_per_node matches a reference, tokens that respect
//    config.max_nodes_per_token = 1 dispatch, and one that breaks it is refused;
//  - InfiniBand settings in the config are accepted, or refused by name.
//
//   mp_topo [--xml FILE]   (default: tests/data/vm_flat.xml beside the build)
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/launch.h"
#include "mp_common.h"

using namespace mp;

namespace {

constexpr int kRanks = 4, kExperts = 8, kHidden = 64, kTopk = 2, kTokens = 24;

int nodeOfExpert(int64_t e) { return int(e / (kExperts / kRanks)) / 2; }

epConfig_t config() {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  c.num_experts = kExperts;
  c.hidden = kHidden;
  c.max_tokens_per_rank = kTokens;
  c.max_topk = kTopk;
  c.backend = epBackendHost;
  c.timeout_ms = 20000;
  c.max_nodes_per_token = 1;
  c.ib_sl_low_latency = 3;  // carried in the plan for the RDMA transport
  c.ib_qps_per_peer = 4;
  return c;
}

// Each token picks one node, then distinct experts on it (or -1).
std::vector<int64_t> tokensOf(int rank) {
  Rng rng(977 + uint64_t(rank));
  std::vector<int64_t> topk(size_t(kTokens) * kTopk);
  for (int t = 0; t < kTokens; t++) {
    int node = rng.below(2);
    int64_t first = node * 4 + rng.below(4);
    topk[size_t(t) * kTopk] = first;
    topk[size_t(t) * kTopk + 1] =
        rng.below(5) == 0 ? -1 : node * 4 + (first - node * 4 + 1 + rng.below(3)) % 4;
  }
  return topk;
}

// The plan line rank `rank` logged: what follows "EP INFO plan ". Every file in
// log_dir is read: the launcher's parent may have opened the log (its pid in
// the name) before forking the ranks, which then share it.
std::string loggedPlan(const std::string& log_dir, int rank, bool* from_xml) {
  const std::string key = "EP INFO plan rank " + std::to_string(rank) + " ";
  std::string plan;
  *from_xml = false;
  DIR* d = opendir(log_dir.c_str());
  while (struct dirent* ent = d ? readdir(d) : nullptr) {
    std::ifstream in(log_dir + "/" + ent->d_name);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("EP INFO topology of xml ") != std::string::npos) *from_xml = true;
      size_t at = line.find(key);
      if (at != std::string::npos) plan = line.substr(at + 13);
    }
  }
  if (d) closedir(d);
  return plan;
}

void checkPeerInfo(Tally* t, epComm_t comm, int me);

void run(const LaunchInfo& li, const std::string& log_dir, Tally* t) {
  const int me = li.rank;
  // A bad IB setting is refused before any communication, naming the field.
  epConfig_t bad = config();
  bad.ib_sl_control = 16;
  epComm_t comm = nullptr;
  t->check(epCommInitRank(&comm, li.nranks, li.id, me, &bad) == epInvalidArgument &&
               strstr(epGetLastError(nullptr), "config.ib_sl_control = 16") != nullptr,
           "ib_sl_control = 16 refused by name", me);

  epConfig_t cfg = config();
  if (epCommInitRank(&comm, li.nranks, li.id, me, &cfg) != epSuccess) {
    fprintf(stderr, "rank %d: init: %s\n", me, epGetLastError(nullptr));
    t->check(false, "init", me);
    return;
  }
  int num_nodes = 0, node_of_rank[kRanks] = {-1, -1, -1, -1};
  t->check(epCommNodes(comm, &num_nodes, node_of_rank) == epSuccess && num_nodes == 2 &&
               node_of_rank[0] == 0 && node_of_rank[1] == 0 && node_of_rank[2] == 1 && node_of_rank[3] == 1,
           "EP_NODE_SIZE=2 makes nodes {0,1} {2,3}", me);

  // The plan: same local index across nodes is the rail; the other rank of the
  // far node is reached through it; the near rank is host-staged (no GPUs).
  bool from_xml = false;
  std::string plan = loggedPlan(log_dir, me, &from_xml);
  const char* paths[kRanks] = {
      "0:self 1:host-staged 2:rail 3:rail+fwd@2", "0:host-staged 1:self 2:rail+fwd@3 3:rail",
      "0:rail 1:rail+fwd@0 2:self 3:host-staged", "0:rail+fwd@1 1:rail 2:host-staged 3:self"};
  const int local = me % 2;
  std::string nic = from_xml ? "mlx5_" + std::to_string(local) : "none";
  std::string want = "rank " + std::to_string(me) + " node " + std::to_string(me / 2) + " local " +
                     std::to_string(local) + " nic " + nic + " paths " + paths[me];
  t->check(plan == want, "logged plan", me);
  if (plan != want)
    fprintf(stderr, "  rank %d plan: \"%s\"\n  expected:     \"%s\"\n", me, plan.c_str(), want.c_str());
  if (!from_xml) printf("rank %d: NIC not checked (no XML topology: built without hwloc?)\n", me);
  // The same through epCommPeerPath: via_rank is the forwarding rank, -1 on a direct path.
  bool paths_ok = true;
  for (int q = 0; q < kRanks; q++) {
    epPathKind_t kind = epPathSelf;
    int via = -7;
    const bool far = q / 2 != me / 2, rail = far && q % 2 == local;
    const epPathKind_t want_kind =
        q == me ? epPathSelf : !far ? epPathHostStaged : rail ? epPathRail : epPathRailForward;
    const int want_via = far && !rail ? (q / 2) * 2 + local : -1;
    paths_ok &= epCommPeerPath(comm, q, &kind, &via) == epSuccess && kind == want_kind && via == want_via;
  }
  t->check(paths_ok, "epCommPeerPath kinds and via ranks (-1 when direct)", me);
  checkPeerInfo(t, comm, me);

  // Per-node counts against the reference.
  std::vector<int64_t> topk = tokensOf(me);
  int per_node[2] = {-1, -1}, per_rank[kRanks];
  epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
  la.topk_idx = topk.data();
  la.num_tokens = kTokens;
  la.num_topk = kTopk;
  la.tokens_per_node = per_node;
  la.tokens_per_rank = per_rank;
  t->check(epLayout(comm, &la, nullptr) == epSuccess, "layout", me);
  int want_node[2] = {0, 0};
  for (int tk = 0; tk < kTokens; tk++) want_node[nodeOfExpert(topk[size_t(tk) * kTopk])]++;
  t->check(per_node[0] == want_node[0] && per_node[1] == want_node[1], "tokens_per_node", me);

  // A token on both nodes breaks max_nodes_per_token = 1 (checked locally).
  std::vector<int64_t> wide = topk;
  wide[size_t(5) * kTopk] = 0;
  wide[size_t(5) * kTopk + 1] = 7;
  la.topk_idx = wide.data();
  t->check(epLayout(comm, &la, nullptr) == epInvalidArgument &&
               strstr(epGetLastError(comm), "token 5 selects experts on 2 nodes") != nullptr,
           "token on 2 nodes refused under max_nodes_per_token = 1", me);

  // Node-limited tokens still dispatch: count the rows that arrive.
  std::vector<uint16_t> x(size_t(kTokens) * kHidden, toBf16(1.0f));
  std::vector<uint16_t> recv(size_t(kRanks) * kTokens * kHidden);
  epDispatchArgs_t da = EP_DISPATCH_ARGS_INITIALIZER;
  da.x = x.data();
  da.topk_idx = topk.data();
  da.num_tokens = kTokens;
  da.num_topk = kTopk;
  da.recv_x = recv.data();
  da.recv_capacity = int64_t(kRanks) * kTokens;
  int64_t num_recv = -1;
  da.num_recv = &num_recv;
  epHandle_t h = nullptr;
  t->check(epDispatch(comm, &da, &h, nullptr) == epSuccess, "dispatch", me);
  int64_t want_recv = 0;
  for (int src = 0; src < kRanks; src++) {
    std::vector<int64_t> s = tokensOf(src);
    for (int tk = 0; tk < kTokens; tk++) {
      int64_t a = s[size_t(tk) * kTopk], b = s[size_t(tk) * kTopk + 1];
      want_recv += a / 2 == me || (b >= 0 && b / 2 == me);
    }
  }
  t->check(num_recv == want_recv, "rows received", me);
  epHandleDestroy(h);
  epCommDestroy(comm);
}

// epCommPeerInfo: the path as epCommPeerPath gives it, the transport of each
// peer, and for a network peer its connection and the config's per-class
// request (ib_sl_low_latency = 3 in config()); bad arguments refused by name.
void checkPeerInfo(Tally* t, epComm_t comm, int me) {
  bool ok = true;
  for (int q = 0; q < kRanks; q++) {
    epCommPeerInfo_t info = EP_COMM_PEER_INFO_INITIALIZER;
    epPathKind_t kind = epPathSelf;
    int via = -7;
    if (epCommPeerInfo(comm, q, &info) != epSuccess || epCommPeerPath(comm, q, &kind, &via) != epSuccess) {
      fprintf(stderr, "  rank %d: epCommPeerInfo(%d): %s\n", me, q, epGetLastError(comm));
      ok = false;
      continue;
    }
    const bool far = q / 2 != me / 2;
    const std::string transport = info.transport;
    bool good = info.peer == q && info.node == q / 2 && info.path == kind && info.via_rank == via &&
                info.size == sizeof(info);
    if (q == me) good &= transport == "self" && info.qps == 0;
    else if (!far || transport == "shm") good &= transport == "shm" && info.qps == 0 && info.device[0] == '\0';
    else  // over the network: the socket transport here (no RDMA device)
      good &= info.qps >= 1 && info.device[0] != '\0' && info.classes[1].service_level == 3 &&
              info.classes[0].service_level == 0 && info.detail[0] != '\0' &&
              (transport != "socket" || (std::string(info.link) == "TCP" && info.classes[0].adaptive_routing == 0));
    if (!good)
      fprintf(stderr, "  rank %d peer %d: transport %s node %d path %d via %d device '%s' port %d qps %d link '%s' "
              "SL %d/%d/%d AR %d/%d/%d detail '%s'\n", me, q, info.transport, info.node, int(info.path),
              info.via_rank, info.device, info.port, info.qps, info.link, info.classes[0].service_level,
              info.classes[1].service_level, info.classes[2].service_level, info.classes[0].adaptive_routing,
              info.classes[1].adaptive_routing, info.classes[2].adaptive_routing, info.detail);
    if (q == (me + 2) % kRanks)
      printf("rank %d: peer %d through %s (%s %s, %d QPs)\n", me, q, info.transport, info.device, info.link,
             info.qps);
    ok &= good;
  }
  t->check(ok, "epCommPeerInfo of every peer (transport, node, path, connection)", me);

  epCommPeerInfo_t bad = EP_COMM_PEER_INFO_INITIALIZER;
  bool refused = epCommPeerInfo(comm, kRanks, &bad) == epInvalidArgument &&
                 strstr(epGetLastError(comm), "peer = 4") != nullptr;
  refused &= epCommPeerInfo(comm, 0, nullptr) == epInvalidArgument;
  bad.magic = 0;
  refused &= epCommPeerInfo(comm, 0, &bad) == epInvalidArgument &&
             strstr(epGetLastError(comm), "EP_COMM_PEER_INFO_INITIALIZER") != nullptr;
  bad.magic = EP_COMM_PEER_INFO_MAGIC;
  bad.size = 16;
  refused &= epCommPeerInfo(comm, 0, &bad) == epInvalidArgument && bad.peer == 0;
  t->check(refused, "epCommPeerInfo refuses a peer out of range, NULL, a wrong magic, a short struct", me);
}

std::string defaultXml(const char* argv0) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string dir = n > 0 ? std::string(exe, size_t(n)) : std::string(argv0);
  std::string path = dir.substr(0, dir.rfind('/') + 1) + "../../tests/data/vm_flat.xml";
  return access(path.c_str(), R_OK) == 0 ? path : "tests/data/vm_flat.xml";
}

}  // namespace

int main(int argc, char** argv) {
  std::string xml = defaultXml(argv[0]);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--xml") == 0 && i + 1 < argc)
      xml = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--xml FILE]\n", argv[0]);
      return 2;
    }
  }
  // Before the library reads any parameter; the launcher's children inherit them.
  char dir[] = "/tmp/mp_topo_XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  const std::string log_dir = dir;
  setenv("EP_NODE_SIZE", "2", 1);
  setenv("EP_DEBUG", "INFO", 1);
  setenv("EP_DEBUG_SUBSYS", "TOPO", 1);
  setenv("EP_DEBUG_FILE", (log_dir + "/rank.%p.log").c_str(), 1);
  setenv("EP_TOPO_XML", xml.c_str(), 1);

  // The launcher's parent (the process that exits last) removes the logs.
  static std::string cleanup;
  static pid_t parent;
  cleanup = log_dir;
  parent = getpid();
  atexit([] {
    if (getpid() != parent) return;
    if (DIR* d = opendir(cleanup.c_str())) {
      while (struct dirent* ent = readdir(d))
        if (ent->d_name[0] != '.') unlink((cleanup + "/" + ent->d_name).c_str());
      closedir(d);
    }
    rmdir(cleanup.c_str());
  });

  LaunchInfo li;
  if (launchRanks(kRanks, 120, &li) != 0) return 1;
  if (li.under_mpi) parent = -1;  // every rank is a parent: leave the logs rather than race
  if (li.nranks != kRanks) {
    fprintf(stderr, "mp_topo needs %d ranks, got %d\n", kRanks, li.nranks);
    return 2;
  }
  Tally tally;
  run(li, log_dir, &tally);
  printf("mp_topo rank %d/%d: %d passed, %d failed\n", li.rank, li.nranks, tally.passed, tally.failed);
  fflush(stdout);
  return tally.failed == 0 ? 0 : 1;
}
