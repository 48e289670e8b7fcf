// Communicator life cycle: bootstrap, peer exchange, node map, backend
// creation and plan (commCreate), and the free that ends it (commFree). The
// public entry points that call these are in api_comm.cc.
#include "comm.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "backend.h"
#include "bootstrap.h"
#include "checks.h"
#include "params.h"
#include "process.h"

namespace ep {

void commAddHandle(epComm* comm, epHandle* h) {
  std::lock_guard<std::mutex> lock(comm->handles_mu);
  comm->handles.insert(h);
}

void commRemoveHandle(epComm* comm, epHandle* h) {
  std::lock_guard<std::mutex> lock(comm->handles_mu);
  comm->handles.erase(h);
}

std::mutex& handleLinkMutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: handles may be destroyed during exit
  return *mu;
}

namespace {

// setError's store for a communicator's messages (debug.h), set as the
// library loads, before any communicator exists.
void storeCommError(epComm* comm, const char* msg) {
  std::lock_guard<std::mutex> lock(comm->error_mu);
  comm->last_error = msg;
}
struct ErrorStoreSetter {
  ErrorStoreSetter() { setCommErrorStore(&storeCommError); }
} error_store_setter;

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t hostHash() {
  const char* id = param::HOST_ID();
  if (id && *id) return fnv1a(id, strlen(id));
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  uint64_t h = fnv1a(host, strlen(host));
  // Containers can share a host name; the boot id tells machines apart.
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    char boot[64] = "";
    size_t n = fread(boot, 1, sizeof(boot) - 1, f);
    fclose(f);
    h = fnv1a(boot, n, h);
  }
  return h;
}

// What every rank must agree on; compared after the allgather.
struct ConfigDigest {
  int num_experts, hidden, max_tokens_per_rank, max_topk;
  int dispatch_type, combine_type, backend_kind, nranks, low_latency;
  // The host backend's ring geometry: peers write into each other's rings,
  // so they must lay them out alike.
  int host_chunk_tokens, host_ring_slots;
  unsigned long long buffer_bytes_cap;
  int node_size;  // EP_NODE_SIZE: the ranks must agree on which of them share a node
  int staging;    // EP_CUDA_NETWORK, EP_TEST_STAGED: which backend the ranks make
  int enable_shrink;  // every rank opens its recovery listener, or none
  IbTraffic ib;  // as resolved; which of them must agree: ibTrafficAgree
};

struct RankInfo {
  epPeerInfo_v1_t peer;
  ConfigDigest digest;
  unsigned long long pid_ns;  // pidNamespaceId(): whose pids this rank can watch
};

bool spansMachines(const std::vector<RankInfo>& infos) {
  for (const RankInfo& i : infos)
    if (i.peer.host_hash != infos[0].peer.host_hash) return true;
  return false;
}

epResult_t checkDigests(epComm* comm, const std::vector<RankInfo>& infos) {
  const ConfigDigest& mine = infos[comm->rank].digest;
  for (int r = 0; r < comm->nranks; r++) {
    const ConfigDigest& d = infos[r].digest;
#define EP_CHECK_FIELD(field)                                                                  \
  if (d.field != mine.field)                                                                    \
    return setError(comm, epInvalidArgument,                                                    \
                    "config differs across ranks: rank %d has " #field " = %d, rank %d has %d", \
                    r, d.field, comm->rank, mine.field);
    EP_CHECK_FIELD(nranks)
    EP_CHECK_FIELD(num_experts)
    EP_CHECK_FIELD(hidden)
    EP_CHECK_FIELD(max_tokens_per_rank)
    EP_CHECK_FIELD(max_topk)
    EP_CHECK_FIELD(dispatch_type)
    EP_CHECK_FIELD(combine_type)
    EP_CHECK_FIELD(backend_kind)
    EP_CHECK_FIELD(low_latency)
    EP_CHECK_FIELD(enable_shrink)
    if (d.staging != mine.staging)
      return setError(comm, epInvalidArgument,
                      "EP_CUDA_NETWORK / EP_TEST_STAGED differ across ranks: rank %d has %d / %d, rank %d has %d / %d "
                      "(they choose the backend, which must be the same on every rank)",
                      r, d.staging >> 1, d.staging & 1, comm->rank, mine.staging >> 1, mine.staging & 1);
    // The host backend's rings: on GPUs too where the ranks span machines (the staged path).
    if (mine.backend_kind == int(epBackendHost) || mine.staging != 0 || spansMachines(infos)) {
      EP_CHECK_FIELD(host_chunk_tokens)
      EP_CHECK_FIELD(host_ring_slots)
    }
    if (d.node_size != mine.node_size)
      return setError(comm, epInvalidArgument,
                      "EP_NODE_SIZE differs across ranks: rank %d has %d, rank %d has %d (0: unset)", r,
                      d.node_size, comm->rank, mine.node_size);
#undef EP_CHECK_FIELD
    if (d.buffer_bytes_cap != mine.buffer_bytes_cap)
      return setError(comm, epInvalidArgument,
                      "config differs across ranks: rank %d has buffer_bytes_cap = %llu, rank %d has %llu", r,
                      d.buffer_bytes_cap, comm->rank, mine.buffer_bytes_cap);
    EPCHECK(ibTrafficAgree(r, d.ib, comm->rank, mine.ib, comm));
  }
  return epSuccess;
}

// comm->plan from its node map, peers and config, with the topology of this
// process (topoLocal); logs a summary at INFO (subsystem TOPO).
epResult_t buildPlanOf(epComm* comm) {
  std::shared_ptr<const Topology> topo;
  if (topoLocal(&topo) != epSuccess) return setError(comm, epInvalidArgument, "%s", threadLastError());
  PlanInput in;
  in.nodes = &comm->nodes;
  in.rank = comm->rank;
  in.topo = topo.get();
  in.ib = comm->cfg.ib;
  in.low_latency = comm->cfg.low_latency != 0;
  for (const epPeerInfo_v1_t& peer : comm->peers)
    in.bus_id.emplace_back(peer.bus_id, strnlen(peer.bus_id, sizeof(peer.bus_id)));
  EPCHECK(buildPlan(in, &comm->plan));
  EP_INFO(kSubsysTopo, "plan %s", planSummary(comm->plan).c_str());
  return epSuccess;
}

// GPU ranks reach each other by CUDA IPC on one machine; ranks on several
// machines (or nodes of one machine with EP_CUDA_NETWORK=1) go through the
// staged path over the network transports.
bool cudaNeedsNetwork(const epComm& comm) {
  if (comm.nodes.num_nodes < 2) return false;
  for (const epPeerInfo_v1_t& p : comm.peers)
    if (p.host_hash != comm.peers[size_t(comm.rank)].host_hash) return true;
  return param::CUDA_NETWORK() != 0;
}

// config.enable_shrink: this rank's recovery listener (the survivors of a
// death agree over these, docs/SHRINK.md), its address shared with every rank.
epResult_t openRecovery(epComm* comm) {
  if (!comm->backend->canShrink())
    return setError(comm, epNotSupported,
                    "config.enable_shrink (EP_ENABLE_SHRINK): the %s backend cannot shrink (the host backend can, "
                    "and GPUs across nodes, over network transports that can drop a dead peer: transport ABI v3 "
                    "drop_peer; the CUDA backend of one node)",
                    comm->backend->name());
  std::string why;
  const epResult_t res = recovery::RecoveryLink::open(comm->bootstrap, &comm->shrink_heard, &comm->recovery, &why);
  if (res != epSuccess) return setError(comm, res, "config.enable_shrink: the recovery listener: %s", why.c_str());
  std::vector<PackedAddress> packed(static_cast<size_t>(comm->nranks));
  packAddress(comm->recovery->address(), &packed[size_t(comm->rank)]);
  EPCHECK(bootstrapAllGather(comm->bootstrap, packed.data(), sizeof(PackedAddress)));
  std::vector<SocketAddress> addrs(static_cast<size_t>(comm->nranks));
  for (int r = 0; r < comm->nranks; r++)
    if (!unpackAddress(packed[size_t(r)], &addrs[size_t(r)]))
      return setError(comm, epInternalError, "config.enable_shrink: rank %d sent no recovery address", r);
  comm->recovery->setPeers(std::move(addrs));
  comm->dead.assign(size_t(comm->nranks), false);
  EP_INFO(kSubsysInit, "rank %d: recovery listener at %s (shrink enabled)", comm->rank,
          comm->recovery->address().toString().c_str());
  return epSuccess;
}

epResult_t commInit(epComm* comm, const epUniqueId& id, const std::atomic<int>* init_abort) {
  EPCHECK(bootstrapInit(id, comm->rank, comm->nranks, comm->cfg.timeout_ms, &comm->abort_flag, comm,
                        &comm->bootstrap, init_abort));
  // Which backend: decided locally, then checked to agree.
  epBackend_t kind = comm->cfg.backend;
  if (kind == epBackendAuto) kind = cudaBackendAvailable() ? epBackendCuda : epBackendHost;
  if (kind == epBackendCuda && !cudaBackendAvailable())
    return setError(comm, epNotSupported, "config.backend is epBackendCuda but %s",
                    "this build has no CUDA support or no GPU is visible");

  std::vector<RankInfo> infos(comm->nranks);  // value-initialized: zeroed, padding included, then IbTraffic's defaults
  RankInfo& me = infos[comm->rank];
  me.peer.rank = comm->rank;
  me.peer.pid = int(getpid());
  me.peer.host_hash = hostHash();
  me.pid_ns = pidNamespaceId();
  me.peer.cuda_device = -1;
  // Each rank's GPU, by PCI bus id: the plan places it in the topology.
  if (kind == epBackendCuda &&
      !cudaDeviceIdentity(comm->cfg.device, &me.peer.cuda_device, me.peer.bus_id, sizeof(me.peer.bus_id))) {
    me.peer.cuda_device = -1;
    me.peer.bus_id[0] = '\0';
  }
  me.digest = {comm->cfg.num_experts, comm->cfg.hidden, comm->cfg.max_tokens_per_rank,
               comm->cfg.max_topk, int(comm->cfg.dispatch_type), int(comm->cfg.combine_type),
               int(kind), comm->nranks, comm->cfg.low_latency,
               int(param::HOST_CHUNK_TOKENS()), int(param::HOST_RING_SLOTS()),
               (unsigned long long)comm->cfg.buffer_bytes_cap, int(param::NODE_SIZE()),
               int(param::CUDA_NETWORK() != 0) * 2 + int(param::TEST_STAGED() != 0), comm->cfg.enable_shrink};
  me.digest.ib = comm->cfg.ib;
  EPCHECK(bootstrapAllGather(comm->bootstrap, infos.data(), sizeof(RankInfo)));
  EPCHECK(checkDigests(comm, infos));
  comm->peers.resize(comm->nranks);
  for (int r = 0; r < comm->nranks; r++) comm->peers[r] = infos[r].peer;
  // A peer's pid can be watched where it is this machine's and this pid
  // namespace's (namespaces unknown: as if the same).
  comm->pid_visible.assign(comm->nranks, false);
  for (int r = 0; r < comm->nranks; r++) {
    const unsigned long long mine = infos[comm->rank].pid_ns, theirs = infos[r].pid_ns;
    comm->pid_visible[r] = infos[r].peer.host_hash == me.peer.host_hash && (mine == 0 || theirs == 0 || mine == theirs);
  }
  EPCHECK(buildNodeMap(comm->peers, int(param::NODE_SIZE()), &comm->nodes));
  comm->num_local_experts = comm->cfg.num_experts / comm->nranks;
  comm->first_expert = comm->rank * comm->num_local_experts;
  comm->placement.num_experts = comm->cfg.num_experts;
  comm->placement.nranks = comm->nranks;
  comm->placement.experts_per_rank = comm->num_local_experts;

  if (param::TEST_FAIL_INIT() != 0)
    return setError(comm, epInternalError, "init failed on purpose (EP_TEST_FAIL_INIT=%lld)",
                    (long long)param::TEST_FAIL_INIT());
  // The plan needs no backend (peer access comes from the CUDA hook, set at
  // load), and the backends read it: the NIC each rank's network traffic uses.
  EPCHECK(buildPlanOf(comm));
  BackendComm view(comm, comm, comm->bootstrap, &comm->abort_flag, &comm->broken);
  view.watchShrink(&comm->shrink_heard, &comm->shrink_epoch, &comm->gone);
  if (kind == epBackendCuda && cudaNeedsNetwork(*comm)) {
    // GPUs on different nodes: the host backend's paths on staged copies
    // (docs/PROXY.md, "The staged path"), the same on every rank (the node
    // map and EP_NODE_SIZE are in the digest; EP_CUDA_NETWORK must agree too).
    std::unique_ptr<Stager> stager;
    EPCHECK(createCudaStager(view, &stager));
    EPCHECK(createStagedBackend(view, std::move(stager), "cuda_staged", &comm->backend));
  } else if (kind == epBackendCuda) {
    EPCHECK(createCudaBackend(view, &comm->backend));
  } else if (param::TEST_STAGED() != 0) {
    EPCHECK(createStagedBackend(view, makeHostStager(), "host_staged", &comm->backend));
  } else {
    EPCHECK(createHostBackend(view, &comm->backend));
  }
  if (comm->cfg.enable_shrink) EPCHECK(openRecovery(comm));
  EPCHECK(bootstrapBarrier(comm->bootstrap));
  EP_INFO(kSubsysInit, "rank %d/%d ready: %s backend, %d nodes, experts [%d, %d), buffer %zu bytes",
          comm->rank, comm->nranks, comm->backend->name(), comm->nodes.num_nodes, comm->first_expert,
          comm->first_expert + comm->num_local_experts, comm->backend->bufferBytes());
  return epSuccess;
}

}  // namespace

void commFree(epComm* comm) {
  if (comm == nullptr) return;
  {  // Handles outlive their communicator only as empty shells.
    std::lock_guard<std::mutex> link(handleLinkMutex());  // no epHandleDestroy is inside comm now
    std::lock_guard<std::mutex> lock(comm->handles_mu);
    for (epHandle* h : comm->handles) {
      if (comm->backend) comm->backend->releaseHandle(h);
      h->comm = nullptr;
    }
    comm->handles.clear();
  }
  comm->backend.reset();
  comm->recovery.reset();
  bootstrapClose(comm->bootstrap);
  comm->bootstrap = nullptr;
  comm->magic = kDeadMagic;
  delete comm;
}

epResult_t commCreate(int nranks, const epUniqueId& id, int rank, const Config& cfg,
                      const std::atomic<int>* init_abort, epComm** out) {
  *out = nullptr;
  auto* comm = new (std::nothrow) epComm();
  if (comm == nullptr) return setError(nullptr, epOutOfMemory, "cannot allocate a communicator");
  comm->rank = rank;
  comm->nranks = nranks;
  comm->cfg = cfg;
  epResult_t res;
  try {
    res = commInit(comm, id, init_abort);
  } catch (...) {
    // An allocation of init threw (apiException makes the result): the peers
    // are told and what init made is freed (its sockets, threads, shared
    // memory), as after a failed result, before the exception goes on.
    try {
      bootstrapNotifyFailure(comm->bootstrap, epOutOfMemory, "init failed: out of host memory");
    } catch (...) {  // the notice itself could not be made: the peers see the ring close
    }
    commFree(comm);
    throw;
  }
  if (res != epSuccess) {
    // Keep the message for the caller, who has no comm to ask.
    std::string msg;
    {
      std::lock_guard<std::mutex> lock(comm->error_mu);
      msg = comm->last_error;
    }
    // The peers may wait in a collective for this rank: tell them why it left.
    bootstrapNotifyFailure(comm->bootstrap, res, msg.empty() ? "init failed" : msg.c_str());
    commFree(comm);
    if (!msg.empty()) setError(nullptr, res, "%s", msg.c_str());
    return res;
  }
  *out = comm;
  return epSuccess;
}

}  // namespace ep
