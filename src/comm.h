// The communicator and the routing handle: the core's shared state.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "moeep.h"
#include "moeep_transport.h"
#include "plan.h"
#include "routing.h"

namespace ep {

struct Bootstrap;
class Backend;

constexpr uint32_t kCommMagic = 0x6570436du;    // 'epCm'
constexpr uint32_t kHandleMagic = 0x65704864u;  // 'epHd'
constexpr uint32_t kDeadMagic = 0xdeadbeefu;

// The config after defaults and EP_* variables were applied.
struct Config {
  int num_experts = 0;
  int hidden = 0;
  int max_tokens_per_rank = 0;
  int max_topk = 0;
  epDataType_t dispatch_type = epBfloat16;
  epDataType_t combine_type = epBfloat16;
  epBackend_t backend = epBackendAuto;
  int device = -1;
  size_t buffer_bytes_cap = 0;
  int timeout_ms = 0;
  int num_sms = 0;
  int max_nodes_per_token = 0;
  int low_latency = 0;
  IbTraffic ib;  // InfiniBand traffic settings, resolved by ibTrafficResolve
};

// Bytes of one element; 0 for an unknown type.
size_t dataTypeSize(epDataType_t t);
const char* dataTypeName(epDataType_t t);

// Reads a caller's epConfig_t of any known size, fills defaults, validates.
// comm may be NULL (errors go to the thread-local slot).
epResult_t configResolve(const epConfig_t* user, int nranks, Config* out, struct epComm* comm);

// Ranks grouped into nodes.
struct NodeMap {
  int num_nodes = 1;
  std::vector<int> node_of_rank;   // [R]
  std::vector<int> local_rank;     // [R] index within its node
  std::vector<int> node_size;      // [N]
  std::vector<int> node_first;     // [N] first rank of the node (ranks of a node are listed)
  std::vector<std::vector<int>> node_ranks;  // [N] ranks of each node, ascending
};

// Groups ranks by host hash (ascending first rank decides node order), or into
// consecutive blocks of node_size when node_size > 0.
epResult_t buildNodeMap(const std::vector<epPeerInfo_v1_t>& peers, int node_size, NodeMap* out);

// True once rank r's process exited, as far as this rank can tell: only a
// peer whose pid means something here (epComm::pid_visible) can be seen to
// exit; for any other peer, false.
bool peerExited(const epComm* comm, int r);

// Limits of a communicator (SEMANTICS.md): far above any model, low enough
// that no buffer size computed from them overflows size_t.
constexpr int kMaxCommRanks = 1 << 16;
constexpr int kMaxExperts = 1 << 20;
constexpr int kMaxHidden = 1 << 18;
constexpr int kMaxTokensPerRank = 1 << 24;
constexpr int kMaxExpertAlignment = 1 << 20;

// Records a new handle of comm / forgets it (epHandleDestroy).
void commAddHandle(struct epComm* comm, struct epHandle* h);
void commRemoveHandle(struct epComm* comm, struct epHandle* h);

// Guards every handle's link to its communicator (epHandle::comm) in this
// process: held by commFree while it detaches the handles and by
// epHandleDestroy while it reads the link and works on the communicator, so
// that a handle destroyed while another thread destroys or aborts its
// communicator finds it either alive or detached, never freed under it.
// Taken before epComm::handles_mu.
std::mutex& handleLinkMutex();

// Stores msg as the communicator's last error (called by setError).
void commStoreError(struct epComm* comm, const char* msg);

}  // namespace ep

struct epComm {
  uint32_t magic = ep::kCommMagic;
  int rank = 0;
  int nranks = 0;
  ep::Config cfg;
  int first_expert = 0;
  int num_local_experts = 0;
  ep::NodeMap nodes;
  ep::Plan plan;  // path to every peer, rail peers, NIC (built by planBuildForComm)
  std::vector<epPeerInfo_v1_t> peers;  // [R]
  std::vector<bool> pid_visible;        // [R]: peers[r].pid names that rank's process here (peerExited)
  ep::Bootstrap* bootstrap = nullptr;
  std::atomic<int> abort_flag{0};
  // Non-zero (an epResult_t) once a peer failed or timed out: the comm is unusable.
  std::atomic<int> broken{0};
  std::atomic<int> active_calls{0};  // public calls in flight (epCommAbort waits for them)
  std::atomic<int> collective_busy{0};  // a data call is in progress (CallGuard::enterCollective)
  std::atomic<int> closing{0};          // epCommDestroy or epCommAbort has begun
  uint64_t call_seq = 0;  // collective calls issued, to check ranks stay in step
  // Low latency: pairs (a dispatch and its combine) alternate between two
  // buffer sets by the parity of the dispatch's order. On the device the
  // dispatch of a pair waits until the pair two before it (same set) was
  // combined, and its combine until that pair's combine receive has read the
  // set; both would wait forever for a call that comes later in the stream,
  // or never. So per set: whether its last pair still owes its combine
  // (ll_uncombined) and whether a send-only combine still owes its receive
  // half (ll_receive_owed); kLLLost once the handle that owed it was
  // destroyed (the set cannot be used again).
  enum LLSetState : int { kLLFree = 0, kLLOwed = 1, kLLLost = 2 };
  uint64_t ll_dispatches = 0;  // low-latency dispatches issued (collective calls: one at a time)
  std::atomic<int> ll_uncombined[2] = {{kLLFree}, {kLLFree}};
  std::atomic<int> ll_receive_owed[2] = {{kLLFree}, {kLLFree}};
  std::unique_ptr<ep::Backend> backend;
  std::mutex error_mu;
  std::string last_error;
  // Live handles: destroying the comm first detaches them, so a later
  // epHandleDestroy never reads the freed communicator.
  std::mutex handles_mu;
  std::unordered_set<struct epHandle*> handles;
};

struct epHandle {
  uint32_t magic = ep::kHandleMagic;
  epComm* comm = nullptr;
  bool low_latency = false;  // made by epLowLatencyDispatch
  // Low latency: the op whose receive half epLowLatencyComplete still owes.
  enum class Pending { kNone, kDispatch, kCombine } pending = Pending::kNone;
  ep::Routing routing;  // host view of where every token goes and comes from
  bool counts_known = false;
  bool dispatched = false;  // a dispatch ran: combine and cached re-dispatch are allowed
  bool ll_combined = false;  // low latency: each dispatch is combined once
  int ll_set = 0;            // low latency: the buffer set of its pair (epComm::ll_uncombined)
  void* backend_state = nullptr;
};
