// Communicator life cycle: config resolution, bootstrap, peer exchange, node
// map, backend creation, destroy and abort.
#include "comm.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "api_guard.h"
#include "backend.h"
#include "bootstrap.h"
#include "checks.h"
#include "params.h"
#include "process.h"

namespace ep {

size_t dataTypeSize(epDataType_t t) {
  switch (t) {
    case epBfloat16: case epFloat16: return 2;
    case epFloat32: case epInt32: return 4;
    case epFloat8E4M3: return 1;
    case epInt64: return 8;
    default: return 0;
  }
}

const char* dataTypeName(epDataType_t t) {
  switch (t) {
    case epBfloat16: return "bf16";
    case epFloat16: return "fp16";
    case epFloat32: return "fp32";
    case epFloat8E4M3: return "fp8e4m3";
    case epInt32: return "int32";
    case epInt64: return "int64";
    default: return "unknown";
  }
}

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

void commStoreError(epComm* comm, const char* msg) {
  std::lock_guard<std::mutex> lock(comm->error_mu);
  comm->last_error = msg;
}

// The bytes of a caller's config that are its fields: up to the end of the
// last field of its version, never its tail padding (the current struct has
// 4 bytes of it, where a field added later would otherwise read an older
// caller's garbage). A field added to epConfig_t raises EP_CONFIG_VERSION and
// gives its version's end here; a newer caller is read as far as this
// library knows.
size_t configCallerBytes(const epConfig_t& user) {
  constexpr size_t kVersion1End = offsetof(epConfig_t, ib_ar_control) + sizeof(int);
  static_assert(EP_CONFIG_VERSION == 1, "a new version of epConfig_t needs its end in configCallerBytes");
  return std::min(user.size, user.version <= 1 ? kVersion1End : sizeof(epConfig_t));
}

epResult_t configResolve(const epConfig_t* user, int nranks, Config* out, epComm* comm) {
  if (user == nullptr) return setError(comm, epInvalidArgument, "config is NULL");
  if (nranks < 1 || nranks > kMaxCommRanks)
    return setError(comm, epInvalidArgument, "nranks = %d is outside 1..%d", nranks, kMaxCommRanks);
  if (user->magic != EP_CONFIG_MAGIC)
    return setError(comm, epInvalidArgument,
                    "config.magic = 0x%x is not EP_CONFIG_MAGIC: initialise the config with "
                    "EP_CONFIG_INITIALIZER",
                    user->magic);
  // Version 1 ends with max_nodes_per_token; a caller compiled against it is the smallest we accept.
  const size_t min_size = offsetof(epConfig_t, max_nodes_per_token) + sizeof(int);
  if (user->size < min_size)
    return setError(comm, epInvalidArgument, "config.size = %zu is smaller than any known epConfig_t",
                    user->size);
  // Copy what the caller knew about; later fields keep their defaults.
  epConfig_t c = EP_CONFIG_INITIALIZER;
  memcpy(&c, user, configCallerBytes(*user));
  c.size = sizeof(epConfig_t);

  Config r;
  r.num_experts = c.num_experts;
  r.hidden = c.hidden;
  r.max_tokens_per_rank = c.max_tokens_per_rank;
  r.max_topk = c.max_topk;
  // The enum fields come from C callers as any int: checked as ints before
  // they are held as enums (an enum holding a value outside its range is
  // undefined behaviour in C++).
  const int dispatch_type = rawEnum(c.dispatch_type), combine_type = rawEnum(c.combine_type),
            backend = rawEnum(c.backend);
  if (dispatch_type != epBfloat16 && dispatch_type != epFloat16 && dispatch_type != epFloat32 &&
      dispatch_type != epFloat8E4M3)
    return setError(comm, epInvalidArgument, "config.dispatch_type = %d is not bf16, fp16, fp32 or fp8e4m3",
                    dispatch_type);
  if (combine_type != epBfloat16 && combine_type != epFloat16 && combine_type != epFloat32)
    return setError(comm, epInvalidArgument, "config.combine_type = %d is not bf16, fp16 or fp32",
                    combine_type);
  if (backend != epBackendAuto && backend != epBackendHost && backend != epBackendCuda)
    return setError(comm, epInvalidArgument, "config.backend = %d is unknown", backend);
  r.dispatch_type = epDataType_t(dispatch_type);
  r.combine_type = epDataType_t(combine_type);
  r.backend = epBackend_t(backend);
  r.device = c.device;
  // 0 means "not set here": the EP_* variable, else the default. Negative
  // values are errors, named after where they came from.
  if (c.timeout_ms < 0)
    return setError(comm, epInvalidArgument, "config.timeout_ms = %d is negative", c.timeout_ms);
  if (c.num_sms < 0) return setError(comm, epInvalidArgument, "config.num_sms = %d is negative", c.num_sms);
  if (c.buffer_bytes_cap == 0 && param::BUFFER_BYTES_CAP() < 0)
    return setError(comm, epInvalidArgument, "EP_BUFFER_BYTES_CAP = %lld is negative",
                    (long long)param::BUFFER_BYTES_CAP());
  if (c.timeout_ms == 0 && (param::TIMEOUT_MS() <= 0 || param::TIMEOUT_MS() > INT32_MAX))
    return setError(comm, epInvalidArgument, "EP_TIMEOUT_MS = %lld must be in 1..%d",
                    (long long)param::TIMEOUT_MS(), INT32_MAX);
  if (c.num_sms == 0 && (param::NUM_SMS() < 0 || param::NUM_SMS() > 1024))
    return setError(comm, epInvalidArgument, "EP_NUM_SMS = %lld must be in 0..1024", (long long)param::NUM_SMS());
  if (param::NODE_SIZE() < 0 || param::NODE_SIZE() > nranks)
    return setError(comm, epInvalidArgument, "EP_NODE_SIZE = %lld is outside 0..%d (the ranks; 0: by host)",
                    (long long)param::NODE_SIZE(), nranks);
  r.buffer_bytes_cap = c.buffer_bytes_cap ? c.buffer_bytes_cap : size_t(param::BUFFER_BYTES_CAP());
  r.timeout_ms = c.timeout_ms > 0 ? c.timeout_ms : int(param::TIMEOUT_MS());
  r.num_sms = c.num_sms > 0 ? c.num_sms : int(param::NUM_SMS());
  r.max_nodes_per_token = c.max_nodes_per_token;
  r.low_latency = c.low_latency;

  // Upper bounds keep every buffer size computed from the config far from
  // overflowing size_t (a larger buffer could not be allocated anyway).
  if (r.num_experts <= 0 || r.num_experts > kMaxExperts)
    return setError(comm, epInvalidArgument, "config.num_experts = %d is outside 1..%d", r.num_experts,
                    kMaxExperts);
  if (r.num_experts % nranks != 0)
    return setError(comm, epInvalidArgument,
                    "config.num_experts = %d is not a multiple of the %d ranks", r.num_experts, nranks);
  if (r.hidden <= 0 || r.hidden > kMaxHidden)
    return setError(comm, epInvalidArgument, "config.hidden = %d is outside 1..%d", r.hidden, kMaxHidden);
  if (r.max_tokens_per_rank < 0 || r.max_tokens_per_rank > kMaxTokensPerRank)
    return setError(comm, epInvalidArgument, "config.max_tokens_per_rank = %d is outside 0..%d",
                    r.max_tokens_per_rank, kMaxTokensPerRank);
  if (r.max_topk < 1 || r.max_topk > 32)
    return setError(comm, epInvalidArgument, "config.max_topk = %d is outside 1..32", r.max_topk);
  for (epDataType_t t : {r.dispatch_type, r.combine_type})
    if ((size_t(r.hidden) * dataTypeSize(t)) % 16 != 0)
      return setError(comm, epInvalidArgument,
                      "config.hidden = %d: a %s row is %zu bytes, not a multiple of 16", r.hidden,
                      dataTypeName(t), size_t(r.hidden) * dataTypeSize(t));
  if (r.low_latency != 0 && r.low_latency != 1)
    return setError(comm, epInvalidArgument, "config.low_latency = %d must be 0 or 1", r.low_latency);
  if (r.max_nodes_per_token < 0)
    return setError(comm, epInvalidArgument, "config.max_nodes_per_token = %d is negative",
                    r.max_nodes_per_token);
  EPCHECK(ibTrafficResolve(c, &r.ib, comm));
  *out = r;
  return epSuccess;
}

bool peerExited(const epComm* comm, int r) {
  return comm->pid_visible[r] && !processAlive(comm->peers[r].pid);
}

epResult_t buildNodeMap(const std::vector<epPeerInfo_v1_t>& peers, int node_size, NodeMap* out) {
  const int R = int(peers.size());
  NodeMap m;
  m.node_of_rank.assign(R, -1);
  m.local_rank.assign(R, 0);
  if (node_size > 0) {
    if (R % node_size != 0)
      return setError(nullptr, epInvalidArgument, "EP_NODE_SIZE = %d does not divide the %d ranks",
                      node_size, R);
    for (int r = 0; r < R; r++) m.node_of_rank[r] = r / node_size;
    m.num_nodes = R / node_size;
  } else {
    std::vector<uint64_t> hosts;
    for (int r = 0; r < R; r++) {
      int n = 0;
      while (n < int(hosts.size()) && hosts[n] != peers[r].host_hash) n++;
      if (n == int(hosts.size())) hosts.push_back(peers[r].host_hash);
      m.node_of_rank[r] = n;
    }
    m.num_nodes = int(hosts.size());
  }
  m.node_size.assign(m.num_nodes, 0);
  m.node_first.assign(m.num_nodes, -1);
  m.node_ranks.assign(m.num_nodes, {});
  for (int r = 0; r < R; r++) {
    int n = m.node_of_rank[r];
    m.local_rank[r] = m.node_size[n]++;
    if (m.node_first[n] < 0) m.node_first[n] = r;
    m.node_ranks[n].push_back(r);
  }
  *out = std::move(m);
  return epSuccess;
}

namespace {

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
  IbTraffic ib;  // as resolved; which of them must agree: ibTrafficAgree
};

struct RankInfo {
  epPeerInfo_v1_t peer;
  ConfigDigest digest;
  unsigned long long pid_ns;  // pidNamespaceId(): whose pids this rank can watch
};

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
    if (mine.backend_kind == int(epBackendHost)) {
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
    EPCHECK(ibTrafficAgree(r, d.ib, mine.ib, comm));
  }
  return epSuccess;
}

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
  bootstrapClose(comm->bootstrap);
  comm->bootstrap = nullptr;
  comm->magic = kDeadMagic;
  delete comm;
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
               (unsigned long long)comm->cfg.buffer_bytes_cap, int(param::NODE_SIZE())};
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

  if (param::TEST_FAIL_INIT() != 0)
    return setError(comm, epInternalError, "init failed on purpose (EP_TEST_FAIL_INIT=%lld)",
                    (long long)param::TEST_FAIL_INIT());
  if (kind == epBackendCuda) EPCHECK(createCudaBackend(comm, &comm->backend));
  else EPCHECK(createHostBackend(comm, &comm->backend));
  // After the backend, which may fill in the GPU bus ids of the peers.
  EPCHECK(planBuildForComm(comm));
  EPCHECK(bootstrapBarrier(comm->bootstrap));
  EP_INFO(kSubsysInit, "rank %d/%d ready: %s backend, %d nodes, experts [%d, %d), buffer %zu bytes",
          comm->rank, comm->nranks, comm->backend->name(), comm->nodes.num_nodes, comm->first_expert,
          comm->first_expert + comm->num_local_experts, comm->backend->bufferBytes());
  return epSuccess;
}

// The one destroy or abort of a live communicator: the first caller gets it,
// a second one racing it is refused (both would free it).
epResult_t claimClose(epComm* comm, const char* fn) {
  if (comm->magic != kCommMagic) return setError(nullptr, epInvalidArgument, "%s: comm is not a live communicator", fn);
  if (comm->closing.exchange(1) != 0)
    return setError(nullptr, epInvalidUsage,
                    "%s: the communicator is already being destroyed or aborted in another thread", fn);
  return epSuccess;
}

// Destroys what an epCommInitAll that failed made, leaving every slot NULL.
void destroyAll(epComm_t* comms, int nranks) {
  for (int r = 0; r < nranks; r++) {
    if (comms[r]) epCommDestroy(comms[r]);
    comms[r] = nullptr;
  }
}

// epCommInitRank; init_abort (may be NULL) gives up the bootstrap (epCommInitAll).
epResult_t commInitRank(epComm_t* out, int nranks, const epUniqueId& id, int rank, const epConfig_t* config,
                        const std::atomic<int>* init_abort) {
  clearThreadError();
  paramWarnUnknown();
  if (out == nullptr) return setError(nullptr, epInvalidArgument, "comm is NULL");
  *out = nullptr;
  if (nranks < 1) return setError(nullptr, epInvalidArgument, "nranks = %d must be at least 1", nranks);
  if (rank < 0 || rank >= nranks)
    return setError(nullptr, epInvalidArgument, "rank = %d is outside [0, %d)", rank, nranks);
  if (!bootstrapIdValid(id))
    return setError(nullptr, epInvalidArgument, "unique_id was not made by epGetUniqueId");
  Config cfg;
  EPCHECK(configResolve(config, nranks, &cfg, nullptr));
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

// Runs body(rank, give_up) in a thread per rank and joins them. A thread that
// cannot be started (RLIMIT_NPROC, pids.max, address space) sets give_up, so
// that the started ranks leave the bootstrap at once instead of waiting for
// the rest until their timeout. Returns false with *why set then.
bool runRankThreads(int nranks, const std::function<void(int, const std::atomic<int>*)>& body,
                    char* why, size_t why_size) {
  std::atomic<int> give_up{0};
  std::vector<std::thread> threads;
  threads.reserve(size_t(nranks));  // before any thread: a throw here leaves none to join
  for (int r = 0; r < nranks; r++) {
    try {
      threads.emplace_back(body, r, &give_up);
    } catch (const std::exception& e) {  // std::system_error; std::bad_alloc for the thread's state
      // No allocation here: a joinable thread destroyed by a throw would terminate the process.
      snprintf(why, why_size, "cannot start the thread of rank %d of %d: %s", r, nranks, e.what());
      give_up.store(1);
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  return give_up.load() == 0;
}

}  // namespace

}  // namespace ep

using namespace ep;

extern "C" {

EP_API epResult_t epCommInitRank(epComm_t* out, int nranks, epUniqueId id, int rank,
                                 const epConfig_t* config) try {
  return commInitRank(out, nranks, id, rank, config, nullptr);
} catch (...) {
  return apiException("epCommInitRank", nullptr);
}

EP_API epResult_t epCommInitAll(epComm_t* comms, int nranks, const int* devices,
                                const epConfig_t* config) try {
  clearThreadError();
  if (comms == nullptr) return setError(nullptr, epInvalidArgument, "comms is NULL");
  if (nranks < 1) return setError(nullptr, epInvalidArgument, "nranks = %d must be at least 1", nranks);
  if (config == nullptr) return setError(nullptr, epInvalidArgument, "config is NULL");
  Config probe;
  EPCHECK(configResolve(config, nranks, &probe, nullptr));
  for (int r = 0; r < nranks; r++) comms[r] = nullptr;
  epUniqueId id;  // private to this process: EP_COMM_ID names the job's address, not this one
  EPCHECK(bootstrapGetUniqueId(&id, false));
  std::vector<epResult_t> results(nranks, epSuccess);
  std::vector<std::string> errors(nranks);
  char thread_failure[256] = "";
  const bool all_ran = runRankThreads(
      nranks,
      [&](int r, const std::atomic<int>* give_up) {
        epConfig_t c = EP_CONFIG_INITIALIZER;
        memcpy(&c, config, configCallerBytes(*config));
        c.size = sizeof(c);
        if (devices != nullptr) c.device = devices[r];
        else if (c.device < 0 && (c.backend == epBackendCuda || c.backend == epBackendAuto)) c.device = r;
        try {  // nothing may leave a thread
          results[r] = commInitRank(&comms[r], nranks, id, r, &c, give_up);
          if (results[r] != epSuccess) errors[r] = threadLastError();
        } catch (...) {
          results[r] = apiException("epCommInitAll", nullptr);
        }
      },
      thread_failure, sizeof(thread_failure));
  for (int r = 0; r < nranks && all_ran; r++) {
    if (results[r] == epSuccess) continue;
    destroyAll(comms, nranks);
    return setError(nullptr, results[r], "rank %d: %s", r, errors[r].c_str());
  }
  if (!all_ran) {
    destroyAll(comms, nranks);
    return setError(nullptr, epSystemError,
                    "epCommInitAll: %s (the limit on processes or threads, ulimit -u or the cgroup's "
                    "pids.max, or on address space, ulimit -v, is too low for %d ranks in one process)",
                    thread_failure, nranks);
  }
  return epSuccess;
} catch (...) {
  return apiException("epCommInitAll", nullptr);
}

EP_API epResult_t epCommDestroy(epComm_t comm) try {
  if (comm == nullptr) return epSuccess;  // like free(NULL)
  EPCHECK(claimClose(comm, "epCommDestroy"));
  // Freeing it under a call of another thread would pull the memory from
  // under that call: refuse (epCommAbort is the way to unblock a call).
  if (comm->active_calls.load() > 0) {
    comm->closing.store(0);
    return setError(comm, epInvalidUsage,
                    "epCommDestroy: a call on this communicator is in progress in another thread; destroy "
                    "it after the call returned, or unblock the call with epCommAbort");
  }
  commFree(comm);
  return epSuccess;
} catch (...) {
  return apiException("epCommDestroy", nullptr);
}

EP_API epResult_t epCommAbort(epComm_t comm) try {
  if (comm == nullptr) return epSuccess;
  EPCHECK(claimClose(comm, "epCommAbort"));
  comm->abort_flag.store(1);
  if (comm->bootstrap) bootstrapAbort(comm->bootstrap);
  if (comm->backend) comm->backend->abort();
  // Let calls blocked in other threads see the flag and leave before freeing.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (comm->active_calls.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (comm->active_calls.load() > 0)
    return setError(nullptr, epInternalError, "epCommAbort: a call on this communicator did not return");
  commFree(comm);
  return epSuccess;
} catch (...) {
  return apiException("epCommAbort", nullptr);
}

}  // extern "C"
