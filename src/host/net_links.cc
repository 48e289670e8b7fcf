#include "net_links.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "../bootstrap.h"
#include "../checks.h"
#include "../debug.h"
#include "../plan.h"

namespace ep {
namespace host {

namespace {
// Every rank's transport name, so that ranks that would pick different
// transports (a module missing on one host) fail at init instead of hanging.
constexpr size_t kNameBytes = 32;
}  // namespace

NetLinks::NetLinks(const TransportEntry* transport, const BackendComm& comm)
    : transport_(transport), t_(transport->net), comm_(comm) {}

NetLinks::~NetLinks() {
  for (void*& c : conns_)
    if (c) t_->close(c), c = nullptr;
  if (mem_) t_->dereg_mem(tcomm_, mem_);
  if (tcomm_) {
    t_->comm_close(tcomm_);
    transportCommClosed();
  }
}

epResult_t NetLinks::fail(epResult_t res, const char* fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  int peer = -1;
  char why[256] = "";
  if (tcomm_) t_->last_error(tcomm_, &peer, why, sizeof(why));
  if (why[0] == '\0' && !transportLastWarning().empty()) snprintf(why, sizeof(why), "%s", transportLastWarning().c_str());
  return setError(comm_, res, "%s (transport %s%s%s)", msg, transport_->name, why[0] ? ": " : "", why);
}

epResult_t NetLinks::choose(const BackendComm& comm, const TransportEntry** out) {
  *out = nullptr;
  if (comm.nodes().num_nodes <= 1) return epSuccess;
  const TransportEntry* pick = nullptr;
  for (const char* name : {"ibverbs", "socket"}) {
    pick = transportFind(name);
    if (pick != nullptr && pick->net != nullptr) break;
    pick = nullptr;
  }
  for (const TransportEntry& e : transportList())  // any other version-2 module
    if (pick == nullptr && e.available && e.net != nullptr) pick = &e;
  // EP_TRANSPORTS named a network transport that cannot run here: an error,
  // never a quiet fall-back to another one (or to shm between faked nodes).
  if (pick == nullptr)
    for (const TransportEntry& e : transportList())
      if (e.net != nullptr && transportNamedByUser(e.name))
        return setError(comm, epNotSupported, "rank %d: EP_TRANSPORTS names %s for the ranks on other nodes, and it "
                        "is unavailable here: %s", comm.rank(), e.name, e.reason.c_str());
  const int R = comm.nranks(), me = comm.rank();
  std::vector<char> names(size_t(R) * kNameBytes, 0);
  if (pick) snprintf(&names[size_t(me) * kNameBytes], kNameBytes, "%s", pick->name);
  EPCHECK(bootstrapAllGather(comm.bootstrap(), names.data(), kNameBytes));
  const std::string mine = pick ? pick->name : "";
  for (int r = 0; r < R; r++) {
    const std::string theirs(&names[size_t(r) * kNameBytes], strnlen(&names[size_t(r) * kNameBytes], kNameBytes));
    if (theirs != mine)
      return setError(comm, epInvalidUsage,
                      "ranks across nodes must use one network transport: rank %d has %s, rank %d has %s "
                      "(EP_TRANSPORTS decides; moeep_info lists each host's transports)",
                      me, mine.empty() ? "none" : mine.c_str(), r, theirs.empty() ? "none" : theirs.c_str());
  }
  if (pick)
    EP_INFO(kSubsysInit, "host backend: %d nodes, ranks on other nodes through %s", comm.nodes().num_nodes,
            pick->name);
  *out = pick;
  return epSuccess;
}

// Each rank's endpoint for each of its remote peers, in slots of the largest
// endpoint size any rank has; theirs[r] is what rank r made for this rank.
epResult_t NetLinks::exchangeEndpoints(epTrafficClass_t cls, const std::vector<bool>& peers,
                                       std::vector<std::vector<uint8_t>>* theirs) {
  const int R = comm_.nranks(), me = comm_.rank();
  std::vector<std::vector<uint8_t>> mine(static_cast<size_t>(R));
  uint64_t largest = 0;
  for (int r = 0; r < R; r++) {
    if (!peers[size_t(r)]) continue;
    std::vector<uint8_t> buf(EP_TRANSPORT_ENDPOINT_MAX_BYTES);
    size_t bytes = buf.size();
    transportClearWarning();
    const epResult_t res = t_->endpoint(tcomm_, r, cls, buf.data(), &bytes);
    if (res != epSuccess) return fail(res, "rank %d: cannot make a %s endpoint for rank %d", me, trafficClassName(int(cls)), r);
    if (bytes > buf.size()) return fail(epInternalError, "rank %d: an endpoint of %zu bytes", me, bytes);
    buf.resize(bytes);
    largest = std::max<uint64_t>(largest, bytes);
    mine[size_t(r)] = std::move(buf);
  }
  std::vector<uint64_t> sizes(size_t(R), 0);
  sizes[size_t(me)] = largest;
  EPCHECK(bootstrapAllGather(comm_.bootstrap(), sizes.data(), sizeof(uint64_t)));
  const uint64_t slot = 4 + *std::max_element(sizes.begin(), sizes.end());
  // Rank r's block: [R] slots of (uint32 size, bytes).
  const size_t block = size_t(R) * slot;
  std::vector<uint8_t> all(size_t(R) * block, 0);
  for (int r = 0; r < R; r++) {
    uint8_t* p = &all[size_t(me) * block + size_t(r) * slot];
    const uint32_t n = uint32_t(mine[size_t(r)].size());
    memcpy(p, &n, 4);
    if (n) memcpy(p + 4, mine[size_t(r)].data(), n);
  }
  EPCHECK(bootstrapAllGather(comm_.bootstrap(), all.data(), block));
  theirs->assign(size_t(R), {});
  for (int r = 0; r < R; r++) {
    if (!peers[size_t(r)]) continue;
    const uint8_t* p = &all[size_t(r) * block + size_t(me) * slot];
    uint32_t n = 0;
    memcpy(&n, p, 4);
    if (n == 0 || n > slot - 4)
      return setError(comm_, epInvalidUsage, "rank %d made no %s %s endpoint for rank %d: the ranks disagree on "
                      "which ranks it connects to", r, transport_->name, trafficClassName(int(cls)), me);
    (*theirs)[size_t(r)].assign(p + 4, p + 4 + n);
  }
  return epSuccess;
}

epResult_t NetLinks::exchangeHandles() {
  const int R = comm_.nranks(), me = comm_.rank();
  constexpr size_t kSlot = 4 + EP_TRANSPORT_MEM_HANDLE_MAX_BYTES;
  std::vector<uint8_t> all(size_t(R) * kSlot, 0);
  size_t bytes = EP_TRANSPORT_MEM_HANDLE_MAX_BYTES;
  uint8_t* mine = &all[size_t(me) * kSlot];
  const epResult_t res = t_->mem_handle(mem_, mine + 4, &bytes);
  if (res != epSuccess || bytes > EP_TRANSPORT_MEM_HANDLE_MAX_BYTES)
    return fail(res == epSuccess ? epInternalError : res, "rank %d: no handle for its registered segment", me);
  const uint32_t n = uint32_t(bytes);
  memcpy(mine, &n, 4);
  EPCHECK(bootstrapAllGather(comm_.bootstrap(), all.data(), kSlot));
  handles_.assign(size_t(R), {});
  for (int r = 0; r < R; r++) {
    const uint8_t* p = &all[size_t(r) * kSlot];
    uint32_t m = 0;
    memcpy(&m, p, 4);
    handles_[size_t(r)].assign(p + 4, p + 4 + std::min<uint32_t>(m, EP_TRANSPORT_MEM_HANDLE_MAX_BYTES));
  }
  return epSuccess;
}

epResult_t NetLinks::open(const std::vector<bool>& remote, const std::vector<bool>& throughput, void* segment,
                          size_t bytes) {
  const int R = comm_.nranks(), me = comm_.rank();
  remote_ = remote;
  remote_.resize(size_t(R), false);
  remote_[size_t(me)] = false;
  std::vector<bool> ht(throughput);
  ht.resize(size_t(R), false);
  for (int r = 0; r < R; r++) ht[size_t(r)] = ht[size_t(r)] && remote_[size_t(r)];
  conns_.assign(size_t(R) * EP_TRAFFIC_CLASSES, nullptr);

  const Config& cfg = comm_.config();
  const NodeMap& nodes = comm_.nodes();
  epTransportCommInfo_v2_t info;
  memset(&info, 0, sizeof(info));
  info.size = sizeof(info);
  info.rank = me;
  info.nranks = R;
  info.node = nodes.node_of_rank[size_t(me)];
  info.num_nodes = nodes.num_nodes;
  // The plan's NIC (nearest the rank's GPU); EP_IB_HCA / EP_SOCKET_IFNAME still win in the transport.
  const std::string& nic = comm_.plan().nic_name;
  info.device = nic.empty() ? nullptr : nic.c_str();
  info.port = 0;
  info.gid_index = cfg.ib.gid_index;
  info.qps_per_peer = cfg.ib.qps_per_peer;
  info.ib_timeout = cfg.ib.timeout;
  info.ib_retry_cnt = cfg.ib.retry_cnt;
  info.timeout_ms = cfg.timeout_ms;
  for (int c = 0; c < EP_TRAFFIC_CLASSES; c++) {
    info.classes[c].service_level = cfg.ib.sl[c];
    info.classes[c].traffic_class = cfg.ib.tclass[c];
    info.classes[c].adaptive_routing = cfg.ib.adaptive_routing[c];  // -1: auto, the transport's rule
  }
  info.qp_budget = cfg.ib.qp_budget;
  // A connect waiting for a peer (the first low-latency call's, or init's)
  // ends at epCommAbort instead of at the timeout.
  info.aborted = [](void* arg) { return static_cast<const NetLinks*>(arg)->comm_.aborted() ? 1 : 0; };
  info.aborted_arg = this;
  // The QPs this rank opens once every class is connected (docs/TOPOLOGY.md,
  // "Queue pairs"), checked before any: a budget the first low-latency call
  // would break fails here, not in the middle of a job. Without
  // config.low_latency no low-latency call can run, so none are counted.
  const int nremote = int(std::count(remote_.begin(), remote_.end(), true));
  const int nht = int(std::count(ht.begin(), ht.end(), true));
  const int nll = cfg.low_latency ? nremote : 0;
  const int64_t qps = networkQpCount(nht, nll, nremote, cfg.ib.qps_per_peer);
  if (cfg.ib.qp_budget > 0 && qps > cfg.ib.qp_budget)
    return setError(comm_, epInvalidArgument,
                    "rank %d would open %lld queue pairs (throughput %d peers x %d, low latency %d x %d%s, control %d "
                    "x 1), more than ib_qp_budget = %d (config, else EP_IB_QP_BUDGET): lower ib_qps_per_peer or "
                    "raise the budget",
                    me, (long long)qps, nht, cfg.ib.qps_per_peer, nll, cfg.ib.qps_per_peer,
                    cfg.low_latency ? "" : " (config.low_latency = 0)", nremote, cfg.ib.qp_budget);
  transportClearWarning();
  epResult_t res = t_->comm_open(transport_->ctx, &info, &tcomm_);
  if (res != epSuccess) {
    tcomm_ = nullptr;
    return fail(res, "rank %d: the network transport cannot open", me);
  }
  transportCommOpened();

  EPCHECK(connectPeers(epTrafficControl, remote_));
  EPCHECK(connectPeers(epTrafficThroughput, ht));
  // With shrink allowed, the low-latency class too: a death breaks the
  // bootstrap over which the first low-latency call would connect it. The
  // handles' allgather below is the barrier: no rank puts before every
  // rank's connections are ready.
  const bool ll_now = cfg.enable_shrink && cfg.low_latency;
  if (ll_now) {
    EPCHECK(connectPeers(epTrafficLowLatency, remote_));
    class_connected_[epTrafficLowLatency] = true;
  }
  transportClearWarning();
  res = t_->reg_mem(tcomm_, segment, bytes, EP_TRANSPORT_MEM_HOST, -1, 0, &mem_);
  if (res != epSuccess) {
    mem_ = nullptr;
    return fail(res, "rank %d cannot register its %zu-byte segment", me, bytes);
  }
  EPCHECK(exchangeHandles());
  EP_INFO(kSubsysInit, "host backend: rank %d reaches %d ranks on other nodes through %s (throughput to %d of them; "
          "low latency %s)", me, nremote, transport_->name, nht,
          ll_now ? "now, config.enable_shrink" : "at the first low-latency call");
  return epSuccess;
}

epResult_t NetLinks::connectClass(epTrafficClass_t cls) {
  if (class_connected_[cls]) return epSuccess;
  const epResult_t res = connectPeers(cls, remote_);
  if (res != epSuccess) {
    // Peers in this collective learn why instead of waiting for their timeout.
    bootstrapNotifyFailure(comm_.bootstrap(), res, threadLastError());
    return res;
  }
  // Every rank's side is ready before anyone puts: a QP still in INIT drops
  // what reaches it (ibverbs' connect by endpoint exchange waits for nothing).
  EPCHECK(bootstrapBarrier(comm_.bootstrap()));
  EP_INFO(kSubsysInit, "host backend: rank %d connected its %s class to %d ranks on other nodes", comm_.rank(),
          trafficClassName(int(cls)), int(std::count(remote_.begin(), remote_.end(), true)));
  return epSuccess;
}

epResult_t NetLinks::connectPeers(epTrafficClass_t cls, const std::vector<bool>& peers) {
  const int R = comm_.nranks(), me = comm_.rank();
  std::vector<std::vector<uint8_t>> theirs;
  EPCHECK(exchangeEndpoints(cls, peers, &theirs));
  for (int r = 0; r < R; r++) {  // ascending on every rank: each pair's two connects meet
    if (!peers[size_t(r)]) continue;
    transportClearWarning();
    void*& conn = conns_[slot(r, cls)];
    const epResult_t res = t_->connect(tcomm_, r, cls, theirs[size_t(r)].data(), theirs[size_t(r)].size(), &conn);
    if (res != epSuccess) {
      conn = nullptr;
      return fail(res == epTimeout ? epRemoteError : res, "rank %d cannot connect to rank %d (node %d, %s class)",
                  me, r, comm_.nodes().node_of_rank[size_t(r)], trafficClassName(int(cls)));
    }
  }
  class_connected_[cls] = true;
  return epSuccess;
}

epResult_t NetLinks::put(int peer, epTrafficClass_t cls, size_t local_offset, size_t remote_offset, size_t bytes,
                         size_t signal_offset, uint64_t value) {
  void* conn = conns_[slot(peer, cls)];
  if (conn == nullptr)  // a caller's bug: classFor chose a class this pair never connected
    return fail(epInternalError, "rank %d has no %s connection to rank %d", comm_.rank(), trafficClassName(int(cls)), peer);
  const epResult_t res = t_->put(conn, mem_, local_offset, handles_[size_t(peer)].data(),
                                 remote_offset, bytes, signal_offset, value, EP_PUT_SIGNAL, nullptr);
  if (res == epSuccess || res == epInProgress) return res;
  int p = peer;
  std::string why;
  progress(&p, &why);
  return res;
}

epResult_t NetLinks::progress(int* peer, std::string* why) {
  return whyFailed(t_->progress(tcomm_), peer, why);
}

epResult_t NetLinks::whyFailed(epResult_t res, int* peer, std::string* why) {
  if (res == epSuccess) return res;
  char msg[256] = "";
  int p = -1;
  t_->last_error(tcomm_, &p, msg, sizeof(msg));
  *peer = p;
  *why = msg[0] ? msg : epGetErrorString(res);
  return res;
}

epResult_t NetLinks::wait(int timeout_us, int* peer, std::string* why) {
  if (transport_->wait == nullptr) {  // nothing would end a long sleep early: a nap
    struct timespec nap = {0, 1000L * std::min(timeout_us, 200)};
    nanosleep(&nap, nullptr);
    return progress(peer, why);
  }
  return whyFailed(transport_->wait(tcomm_, timeout_us), peer, why);
}

epResult_t NetLinks::dropPeer(int peer) {
  if (transport_->drop_peer == nullptr)
    return setError(comm_, epNotSupported,
                    "epCommShrink: transport %s cannot forget a dead peer's errors (no drop_peer, transport ABI v3)",
                    transport_->name);
  // First the transport gives the peer up (its connections' close then
  // waits for nothing), then the connections go.
  const epResult_t res = transport_->drop_peer(tcomm_, peer);
  if (res != epSuccess)
    return setError(comm_, res, "epCommShrink: transport %s could not drop rank %d", transport_->name, peer);
  for (int k = 0; k < EP_TRAFFIC_CLASSES; k++) {
    void*& conn = conns_[slot(peer, epTrafficClass_t(k))];
    if (conn == nullptr) continue;
    t_->close(conn);
    conn = nullptr;
  }
  return epSuccess;
}

bool NetLinks::connInfo(int peer, epTransportConnInfo_v2_t* info) const {
  // Connections made at open only (the low-latency ones come later, on the
  // calling thread): throughput where there is one, else control.
  void* conn = !remote(peer) ? nullptr
               : conns_[slot(peer, epTrafficThroughput)] ? conns_[slot(peer, epTrafficThroughput)]
                                                         : conns_[slot(peer, epTrafficControl)];
  if (conn == nullptr || t_->conn_info == nullptr) return false;
  return t_->conn_info(conn, info) == epSuccess;
}

}  // namespace host
}  // namespace ep
