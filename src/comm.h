// The communicator: the core's state of one rank of a job, its life cycle
// (comm.cc) and its handles (the routing handle itself: handle.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "backend_comm.h"
#include "config.h"
#include "data_types.h"
#include "handle.h"
#include "moeep.h"
#include "moeep_transport.h"
#include "node_map.h"
#include "plan.h"
#include "recovery/recovery_link.h"
#include "routing.h"

namespace ep {

struct Bootstrap;
class Backend;

constexpr uint32_t kCommMagic = 0x6570436du;    // 'epCm'

// A new communicator of rank `rank` of nranks, config resolved: the
// bootstrap, the peer exchange, the node map, the plan, the backend
// (epCommInitRank, epCommInitAll). init_abort (may be NULL) gives up the
// bootstrap. On failure the peers are told why and *out stays NULL.
epResult_t commCreate(int nranks, const epUniqueId& id, int rank, const Config& cfg,
                      const std::atomic<int>* init_abort, epComm** out);
// Frees a communicator: detaches its handles, then the backend, then the
// bootstrap (epCommDestroy, epCommAbort, a failed init).
void commFree(epComm* comm);

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

}  // namespace ep

// The facts a backend may read (rank, config, peers, ...) come from
// ep::CommFacts; the rest is the core's.
struct epComm : ep::CommFacts {
  uint32_t magic = ep::kCommMagic;
  ep::Bootstrap* bootstrap = nullptr;
  std::atomic<int> abort_flag{0};
  // Non-zero (an epResult_t) once a peer failed or timed out: the comm is unusable.
  std::atomic<int> broken{0};
  std::atomic<int> active_calls{0};  // public calls in flight (epCommAbort waits for them)
  std::atomic<int> collective_busy{0};  // a data call is in progress (CallGuard::enterCollective)
  std::atomic<int> closing{0};          // epCommDestroy or epCommAbort has begun
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
  // Shrink (config.enable_shrink, docs/SHRINK.md): the recovery link the
  // survivors agree over, the shrinks so far (handles carry the number they
  // were made at), and the ranks found dead.
  std::unique_ptr<ep::recovery::RecoveryLink> recovery;
  uint32_t shrink_epoch = 0;
  uint32_t shrink_attempts = 0;  // the epoch of the last attempt, done or not
  ep::recovery::ShrinkNotice shrink_heard;  // the newest epoch a peer's recovery message carried, and who began it
  std::vector<bool> dead;  // [R]; with shrink_epoch, written under dead_mu (epCommDeadRanks reads them anytime)
  std::mutex dead_mu;
  std::atomic<int> gone{-1};  // the rank the last failed call found gone (-1: none), a suspect for the next shrink
  std::mutex error_mu;
  std::string last_error;
  // Live handles: destroying the comm first detaches them, so a later
  // epHandleDestroy never reads the freed communicator.
  std::mutex handles_mu;
  std::unordered_set<struct epHandle*> handles;
};
