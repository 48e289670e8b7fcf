// epCommShrink (docs/SHRINK.md): the survivors of a death agree on the dead
// set over their recovery links, then the backend drops the failed call's
// state and masks the dead ranks from the next call on.
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "api_guard.h"
#include "backend.h"
#include "checks.h"
#include "comm.h"
#include "debug.h"
#include "recovery/recovery_link.h"

using namespace ep;

namespace {

// How long a member may stay silent before it counts as dead: longer than
// the communicator's timeout, so that a survivor still waiting inside the
// failed call (it sees the death only at its timeout) joins in time.
int silenceMs(const epComm* comm) { return comm->cfg.timeout_ms + 2000; }

}  // namespace

EP_API epResult_t epCommShrink(epComm_t comm, const int* suspects, int nsuspects, int* dead, int* ndead) {
  CallGuard g(comm);
  try {
    const char* fn = "epCommShrink";
    EPCHECK(g.enter(fn));
    if (!comm->cfg.enable_shrink || !comm->recovery)
      return setError(comm, epInvalidUsage, "%s: the communicator was made without config.enable_shrink", fn);
    if (dead == nullptr || ndead == nullptr) return setError(comm, epInvalidArgument, "%s: dead or ndead is NULL", fn);
    if (nsuspects < 0 || (nsuspects > 0 && suspects == nullptr))
      return setError(comm, epInvalidArgument, "%s: %d suspects at %p", fn, nsuspects, static_cast<const void*>(suspects));
    const int R = comm->nranks;
    std::vector<int> known;
    for (int i = 0; i < nsuspects; i++) {
      if (suspects[i] < 0 || suspects[i] >= R)
        return setError(comm, epInvalidArgument, "%s: suspects[%d] = %d is not a rank of 0..%d", fn, i, suspects[i],
                        R - 1);
      if (suspects[i] == comm->rank)
        return setError(comm, epInvalidArgument, "%s: suspects[%d] is this rank (%d)", fn, i, comm->rank);
      known.push_back(suspects[i]);
    }
    // The collective: no other call may run meanwhile.
    if (comm->collective_busy.exchange(1) != 0)
      return setError(comm, epInvalidUsage, "%s: another call is in progress on this communicator", fn);
    struct Release {
      epComm* c;
      ~Release() { c->collective_busy.store(0); }
    } release{comm};

    // This rank's device work ends and is waited for before it says anything
    // in the agreement (Backend::quiesceForShrink).
    const epResult_t qr = comm->backend->quiesceForShrink();
    if (qr != epSuccess) {
      comm->broken.store(qr);
      return qr;
    }
    // Ranks this process can see exited are dead for sure.
    const BackendComm view(comm, comm, comm->bootstrap, &comm->abort_flag, &comm->broken);
    for (int r = 0; r < R; r++)
      if (r != comm->rank && !comm->dead[size_t(r)] && view.peerExited(r)) known.push_back(r);
    // The rank a failed call found exited or gone from its communicator.
    const int gone = comm->gone.load();  // kept for a retry until a shrink decides
    if (gone >= 0 && gone < R && gone != comm->rank && !comm->dead[size_t(gone)]) known.push_back(gone);
    std::vector<bool> members(static_cast<size_t>(R));
    for (int r = 0; r < R; r++) members[size_t(r)] = !comm->dead[size_t(r)];

    recovery::AgreeOptions o;
    o.silence_ms = silenceMs(comm);
    o.abort = &comm->abort_flag;
    epResult_t reset_rc = epSuccess;  // this rank's own reset failed: its error, not the agreement's
    o.on_decided = [comm, &reset_rc](const std::vector<bool>& decided, std::string* why) {
      reset_rc = comm->backend->resetForShrink(decided);
      if (reset_rc != epSuccess) *why = epGetLastError(comm);
      return reset_rc;
    };
    recovery::AgreeResult res;
    // A new epoch for each attempt (one that failed in its final barrier may
    // have succeeded elsewhere), or the newer one a peer began.
    const uint32_t epoch =
        std::max({comm->shrink_attempts + 1, comm->shrink_epoch + 1, comm->recovery->newestEpoch()});
    comm->shrink_attempts = epoch;
    const epResult_t rc =
        recovery::runAgreement(*comm->recovery, members, epoch, known, comm->backend->steps(), o, &res);
    if (rc == epAborted) return setError(comm, epAborted, "%s: communicator aborted", fn);
    using State = recovery::Agreement::State;
    if (reset_rc != epSuccess) {
      comm->broken.store(reset_rc);
      return setError(comm, reset_rc, "%s (epoch %u): %s", fn, epoch, res.why.c_str());
    }
    if (rc != epSuccess) {
      comm->broken.store(epRemoteError);
      return setError(comm, epRemoteError, "%s (epoch %u): %s; call it again", fn, epoch, res.why.c_str());
    }
    if (res.state != State::kDecided) {
      comm->broken.store(epRemoteError);
      const char* what = res.state == State::kExcluded ? "the other ranks declared this rank dead: it cannot rejoin"
                         : res.state == State::kMinority
                             ? "the survivors this rank reaches are no majority of the ranks before"
                             : "a newer shrink began";
      return setError(comm, epRemoteError, "%s (epoch %u): %s", fn, epoch, what);
    }
    // Decided: the backend continues from the agreed step, without the dead.
    epResult_t br = comm->backend->shrink(res.dead, res.counter);
    if (br != epSuccess) {
      comm->broken.store(br);
      return br;
    }
    {
      std::lock_guard<std::mutex> lock(comm->dead_mu);
      comm->dead = res.dead;
      comm->shrink_epoch = epoch;
    }
    comm->gone.store(-1);
    comm->shrink_heard.removed(res.dead);  // a removed rank's messages fail no call
    comm->broken.store(epSuccess);
    comm->ll_dispatches = 0;  // the survivors pair their low-latency calls from here, alike
    for (int s = 0; s < 2; s++) {
      comm->ll_uncombined[s].store(epComm::kLLFree);
      comm->ll_receive_owed[s].store(epComm::kLLFree);
    }
    int n = 0;
    std::string list;
    for (int r = 0; r < R; r++)
      if (res.dead[size_t(r)]) {
        dead[n++] = r;
        list += (list.empty() ? "" : ", ") + std::to_string(r);
      }
    *ndead = n;
    EP_INFO(kSubsysInit, "rank %d: shrink %u: dead ranks {%s}, calls go on from step %llu", comm->rank, epoch,
            list.c_str(), (unsigned long long)res.counter);
    return epSuccess;
  } catch (...) {
    return g.exception("epCommShrink");
  }
}

EP_API epResult_t epCommDeadRanks(epComm_t comm, int* dead, int capacity, int* ndead, unsigned int* epoch) try {
  CallGuard g(comm);
  EPCHECK(g.enter("epCommDeadRanks"));
  if (ndead == nullptr) return setError(comm, epInvalidArgument, "epCommDeadRanks: ndead is NULL");
  if (capacity < 0 || (capacity > 0 && dead == nullptr))
    return setError(comm, epInvalidArgument, "epCommDeadRanks: capacity %d with dead at %p", capacity,
                    static_cast<void*>(dead));
  std::lock_guard<std::mutex> lock(comm->dead_mu);
  int n = 0;
  for (int r = 0; r < int(comm->dead.size()); r++)  // empty without enable_shrink
    if (comm->dead[size_t(r)]) {
      if (n < capacity) dead[n] = r;
      n++;
    }
  *ndead = n;
  if (epoch != nullptr) *epoch = comm->shrink_epoch;
  return epSuccess;
} catch (...) {
  return apiException("epCommDeadRanks", nullptr);
}
