// The communicator as a backend sees it. A backend reads what the core
// settled at init (CommFacts, fixed before the backend is made) and changes
// the communicator only through the calls below; it never sees epComm itself
// (comm.h is a layer above the backends: scripts/check_layers.py).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "moeep_transport.h"
#include "node_map.h"
#include "plan.h"
#include "recovery/shrink_notice.h"
#include "routing.h"

struct epComm;

namespace ep {

struct Bootstrap;

// What a communicator is, settled by init before its backend is made and
// never changed after. The core owns it: epComm derives from it.
struct CommFacts {
  int rank = 0;
  int nranks = 0;
  Config cfg;
  int first_expert = 0;
  int num_local_experts = 0;
  Placement placement;  // experts over ranks, as the routing math takes it
  NodeMap nodes;
  std::vector<epPeerInfo_v1_t> peers;  // [R]
  std::vector<bool> pid_visible;       // [R]: peers[r].pid names that rank's process here (peerExited)
  Plan plan;  // path to every peer, rail peers, this rank's NIC (built before the backend)
};

// A backend's view of its communicator: a few pointers into it, copied
// freely (the backend, its engines and its helpers each hold one); valid
// while the communicator lives, which outlives its backend.
class BackendComm {
 public:
  // What the core lends: the communicator (where errors are kept), its facts,
  // its bootstrap, its abort flag and its failure word.
  BackendComm(epComm* comm, const CommFacts* facts, Bootstrap* bootstrap, const std::atomic<int>* abort_flag,
              std::atomic<int>* failed)
      : comm_(comm), facts_(facts), bootstrap_(bootstrap), abort_flag_(abort_flag), failed_(failed) {}
  // Shrink: the newest epoch a peer's recovery message carried, this rank's
  // current one (both the core's, for shrinkBegan), and where a failed call
  // leaves the rank it found gone (noteGone).
  void watchShrink(const recovery::ShrinkNotice* heard, const uint32_t* epoch, std::atomic<int>* gone) {
    shrink_heard_ = heard;
    shrink_epoch_ = epoch;
    gone_ = gone;
  }

  int rank() const { return facts_->rank; }
  int nranks() const { return facts_->nranks; }
  const Config& config() const { return facts_->cfg; }
  const Plan& plan() const { return facts_->plan; }
  int firstExpert() const { return facts_->first_expert; }
  int localExperts() const { return facts_->num_local_experts; }
  const Placement& placement() const { return facts_->placement; }
  const NodeMap& nodes() const { return facts_->nodes; }
  const std::vector<epPeerInfo_v1_t>& peers() const { return facts_->peers; }
  // Rank r's pid names its process here (same machine, same pid namespace).
  bool pidVisible(int r) const { return facts_->pid_visible[size_t(r)]; }
  // True once rank r's process exited, as far as this rank can tell: only a
  // peer whose pid means something here (pidVisible) can be seen to exit;
  // for any other peer, false.
  bool peerExited(int r) const;
  // The ranks' collectives over TCP (allgather, barrier): for init.
  Bootstrap* bootstrap() const { return bootstrap_; }
  // epCommAbort was called: every wait must leave.
  bool aborted() const { return abort_flag_->load(); }

  // The communicator failed for good (a wait timed out, a peer left, ranks
  // out of step): from now on its collective calls are refused, naming `why`.
  void markFailed(epResult_t why) { failed_->store(int(why)); }
  // Where setError keeps a backend's messages (the communicator's last error).
  epComm* errorTarget() const { return comm_; }
  // A peer began epCommShrink (a rank died): this rank's waits stop, so that
  // it joins the shrink instead of waiting out its timeout.
  bool shrinkBegan() const { return shrink_heard_ != nullptr && shrink_heard_->epoch() > *shrink_epoch_; }
  // shrinkBegan, and the call waits (waiting_on(r)) for a rank in that
  // shrink or counted dead by it: that rank (the lowest), else -1.
  template <typename Pred>
  int shrinkBlocks(Pred waiting_on) const {
    return shrinkBegan() ? shrink_heard_->blocks(waiting_on) : -1;
  }
  // A call failed because rank r exited or left its communicator: the next
  // epCommShrink suspects it, as if its caller had named it. (Not for a
  // broken connection: a link fault seen from both ends would make two live
  // ranks exclude each other.)
  void noteGone(int r) const {
    if (gone_ != nullptr) gone_->store(r);
  }
  // Who began it and whom it counts as dead, for the error (shrinkBegan).
  std::string shrinkNotice() const { return shrink_heard_ != nullptr ? shrink_heard_->describe() : std::string(); }

 private:
  epComm* comm_;
  const CommFacts* facts_;
  Bootstrap* bootstrap_;
  const std::atomic<int>* abort_flag_;
  std::atomic<int>* failed_;
  const recovery::ShrinkNotice* shrink_heard_ = nullptr;
  const uint32_t* shrink_epoch_ = nullptr;
  std::atomic<int>* gone_ = nullptr;
};

// setError (debug.h) for a backend: the message becomes its communicator's
// last error.
epResult_t setError(const BackendComm& comm, epResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Checks host-readable expert ids of a call: each -1 or an expert of the
// communicator, and no token on more than config.max_nodes_per_token nodes.
// epInvalidArgument naming the first bad entry and `fn`.
epResult_t checkTopkIds(const BackendComm& comm, const char* fn, const void* topk_idx, epDataType_t type,
                        int num_tokens, int num_topk);

}  // namespace ep
