#include "host_notices.h"

#include <chrono>
#include <cstdio>

#include "../checks.h"
#include "../debug.h"
#include "../transport.h"
#include "cuda_check.h"

namespace ep {
namespace cuda {

HostNotices::~HostNotices() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  calls_.reset();
  logs_.reset();
  if (stream_) cudaStreamDestroy(stream_);
  if (one_) cudaFreeHost(one_);
}

epResult_t HostNotices::init() {
  CUDACHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  void* p = nullptr;
  CUDACHECK(cudaHostAlloc(&p, sizeof(int), cudaHostAllocDefault));
  one_ = static_cast<int*>(p);
  *one_ = 1;  // little endian: the first byte is 1 as well
  return shareCallLog();
}

// This rank's call log in memory of the shm transport, and the peers' mapped
// here. Without the transport, or for a peer whose log cannot be mapped (no
// common shared-memory directory), calls out of order are found as before:
// by the kernels where they look, else at the timeout. Every rank takes part
// in the exchange either way.
epResult_t HostNotices::shareCallLog() {
  const int R = comm_.nranks(), me = comm_.rank();
  if (R < 2) return epSuccess;
  std::string why;
  const TransportEntry* shm = transportFind("shm", &why);
  logs_ = std::make_unique<PeerBuffers>(shm, me, R);
  LocalMemory log;
  log.bytes = callLogBytes();
  log.kind = EP_TRANSPORT_MEM_HOST;
  if (shm == nullptr)
    EP_INFO(kSubsysCuda, "calls out of order are not compared on the host: %s", why.c_str());
  else if (logs_->registerLocal(log) != epSuccess)
    EP_INFO(kSubsysCuda, "calls out of order are not compared on the host: no shared memory for the call log");
  if (logs_->registered()) callLogFormat(logs_->localPtr());
  EPCHECK(logs_->exchange(comm_.bootstrap()));
  if (logs_->registered()) {
    calls_ = std::make_unique<CallLog>(logs_->localPtr(), me, R);
    for (int r = 0; r < R; r++) {
      if (r == me || !logs_->offered(r)) continue;
      int ok = 0;
      logs_->canConnect(comm_.peers()[size_t(me)], comm_.peers()[size_t(r)], &ok);
      if (ok && logs_->connect(r, comm_.peers()[size_t(r)]) == epSuccess)
        calls_->setPeer(r, logs_->peerPtr(r));
      else
        EP_INFO(kSubsysCuda, "rank %d's call log cannot be mapped: calls out of order with it are not compared "
                "on the host", r);
    }
  }
  EPCHECK(logs_->finish(comm_.bootstrap()));  // every log mapped: the names can go
  return epSuccess;
}

void HostNotices::recordCall(CallKind kind, cudaStream_t stream, uint8_t note) {
  if (!calls_) return;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    cudaGetLastError();
    st = cudaStreamCaptureStatusActive;  // unknown: taken as captured (the logs are no longer compared)
  }
  calls_->record(kind, st != cudaStreamCaptureStatusNone, note);
}

bool HostNotices::llSendsFlagged(bool small, bool follow_peers, int num_tokens) {
  if (!calls_) return small;
  int peer = -1;
  const bool flagged = calls_->chooseLLRecords(small, follow_peers, &peer);
  if (small && !flagged && !told_plain_) {
    told_plain_ = true;
    EP_INFO(kSubsysCuda, "a low-latency dispatch sends plain records where its size (%d) would take flagged "
            "ones: rank %d sends plain records in it, or did in its latest when it has not made it yet (over "
            "its bound, flagged records off there, or following another peer), and a call of flagged and "
            "plain sources takes a slower receive (EP_CUDA_LL_FLAGGED_PEERS=0: flagged records whatever the "
            "peers send); logged once",
            num_tokens, peer);
  }
  return flagged;
}

const char* HostNotices::outOfStep() const {
  return out_of_step_.load(std::memory_order_acquire) ? out_of_step_what_.c_str() : nullptr;
}

// Peers in another process (one in this process cannot exit alone).
bool HostNotices::watched(int r) const {
  const int me = comm_.rank();
  return r != me && comm_.peers()[r].pid != comm_.peers()[me].pid;
}

void HostNotices::watch() {
  bool any = false;
  for (int r = 0; r < comm_.nranks(); r++) {
    any |= watched(r) && comm_.pidVisible(r);
    if (watched(r) && !comm_.pidVisible(r))
      EP_INFO(kSubsysCuda, "rank %d runs in another pid namespace: its exit is noticed at the timeout", r);
  }
  if (any || (calls_ && calls_->comparesAny())) watcher_ = std::thread([this] { run(); });
}

namespace {
enum GoneWhy : uint8_t { kNotGone = 0, kGoneExited, kGoneDestroyed, kGoneAborted };
}  // namespace

void HostNotices::run() {
  cudaSetDevice(dev_);
  const int R = comm_.nranks();
  std::vector<bool> marked(size_t(R), false);
  int looks_pending = 0;
  bool settled = !calls_;
  CallMismatch seen;
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
    for (int r = 0; r < R && r < kMaxRanks; r++) {
      if (r == comm_.rank() || marked[r] || removed_[r]) continue;
      const CloseKind closed = calls_ != nullptr ? calls_->peerClosed(r) : kOpen;
      GoneWhy why = kNotGone;
      if (watched(r) && comm_.peerExited(r)) why = kGoneExited;
      else if (closed != kOpen) why = closed == kClosedAborted ? kGoneAborted : kGoneDestroyed;
      if (why == kNotGone) continue;
      marked[r] = true;
      gone_why_[r].store(why, std::memory_order_release);
      if (why == kGoneExited) {
        EP_WARN(kSubsysCuda, "rank %d (pid %d) exited: this rank's waits for it end with epRemoteError", r,
                comm_.peers()[r].pid);
      } else {
        // At the end of a job every rank sees its peers leave: not a warning.
        EP_INFO(kSubsysCuda, "%s: this rank's waits for it end with epRemoteError, its further collective calls "
                "are refused", goneWhat(r).c_str());
        int none = -1;
        first_closed_.compare_exchange_strong(none, r, std::memory_order_acq_rel);
      }
      markGone(r);
    }
    if (!settled && !shrunk_) settled = lookAtCalls(&looks_pending, &seen);
  }
}

std::string HostNotices::progressNote(int r) const {
  uint64_t mine = 0, theirs = 0;
  if (!calls_ || !calls_->progress(r, &mine, &theirs)) return "";
  std::string note = "; rank " + std::to_string(r) + "'s host has issued " + std::to_string(theirs) +
                     " collective calls on this communicator";
  if (theirs == mine) return note + ", as this rank: its GPU has not run the one awaited";
  note += " and this rank's " + std::to_string(mine);
  return theirs < mine ? note + ": it has not made the later ones" : note;
}

namespace {
std::string goneText(const BackendComm& comm, int r, int why) {
  char what[96];
  switch (why) {
    case kGoneExited: snprintf(what, sizeof(what), "rank %d (pid %d) exited", r, comm.peers()[size_t(r)].pid); break;
    case kGoneDestroyed: snprintf(what, sizeof(what), "rank %d destroyed its communicator", r); break;
    case kGoneAborted: snprintf(what, sizeof(what), "rank %d aborted its communicator", r); break;
    default: return "";
  }
  return what;
}
}  // namespace

std::string HostNotices::goneWhat(int r) const {
  if (r < 0 || r >= comm_.nranks() || r >= kMaxRanks) return "";
  return goneText(comm_, r, gone_why_[r].load(std::memory_order_acquire));
}

std::string HostNotices::describeGone(int r) const {
  std::string what = goneWhat(r);
  if (!what.empty()) return what;
  if (r >= 0 && r < comm_.nranks() && comm_.peerExited(r)) return goneText(comm_, r, kGoneExited);
  return "rank " + std::to_string(r) + " left";
}

// One look at the call logs; true once nothing is left to do. A difference
// is acted on kActAfterLooks looks after the one that found it, unless a
// kernel of this rank reported a failed wait by then: the kernels' own
// checks, where they have one, name the waits and take milliseconds. The
// wait also spares the kernels of earlier calls that the GPU has not run yet
// (their waits would end too), unless it runs more than that behind the host.
bool HostNotices::lookAtCalls(int* looks_pending, CallMismatch* seen) {
  if (*looks_pending == 0) {
    if (calls_->findMismatch(seen)) *looks_pending = 1;
    return false;
  }
  if (kernelsReportedFailure()) {
    abort();  // the communicator is broken: the other family's waits leave too
    return true;
  }
  if ((*looks_pending)++ < kActAfterLooks) return false;
  char what[640];
  snprintf(what, sizeof(what),
           "rank %d's collective call %llu on this communicator is %s while rank %d's is %s: ranks must issue the "
           "same collective calls in the same order; the communicator cannot be used any more",
           seen->peer, (unsigned long long)seen->call + 1, callKindName(seen->theirs), comm_.rank(),
           callKindName(seen->mine));
  out_of_step_what_ = what;
  out_of_step_.store(true, std::memory_order_release);
  EP_WARN(kSubsysCuda, "%s", what);
  abort();  // every wait of this rank leaves
  return true;
}

epResult_t HostNotices::forgetAfterShrink(const std::vector<bool>& dead,
                                          const std::function<epResult_t()>& reset) {
  std::lock_guard<std::mutex> lock(stop_mu_);
  shrunk_ = true;
  for (int r = 0; r < comm_.nranks() && r < kMaxRanks; r++) {
    if (!dead[size_t(r)]) continue;
    removed_[r] = true;
    if (calls_) calls_->setPeer(r, nullptr);
  }
  // The rank found closed is a removed one, unless a survivor closed its
  // communicator after it decided (which fails the next calls as before).
  const int closed = first_closed_.load(std::memory_order_acquire);
  if (closed >= 0 && closed < comm_.nranks() && dead[size_t(closed)])
    first_closed_.store(-1, std::memory_order_release);
  out_of_step_.store(false, std::memory_order_release);
  const epResult_t rc = reset();
  for (int r = 0; r < comm_.nranks() && r < kMaxRanks; r++) {
    if (removed_[r]) continue;
    const uint8_t why = gone_why_[r].load(std::memory_order_acquire);
    if (why == kNotGone) continue;
    markGone(r);
    // A survivor that closed while a removed rank was the one recorded
    // (the watcher records only the first).
    int none = -1;
    if (why != kGoneExited) first_closed_.compare_exchange_strong(none, r, std::memory_order_acq_rel);
  }
  return rc;
}

bool HostNotices::kernelsReportedFailure() const {
  for (const Target& t : targets_)
    if (t.slots[kFailSlot].code != 0) return true;
  return false;
}

void HostNotices::markGone(int rank) {
  for (const Target& t : targets_) write(t.gone + rank, 1);
}

void HostNotices::abort() {
  for (const Target& t : targets_) write(t.timed_out, sizeof(int));
}

// A copy of 1 into dst on the notice stream, waited for. A failure is only
// logged: the waits then end at their timeout, as without the notice.
void HostNotices::write(void* dst, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(dev_);
  cudaError_t e = cudaMemcpyAsync(dst, one_, bytes, cudaMemcpyHostToDevice, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    EP_WARN(kSubsysCuda, "cannot tell the kernels of device %d (%s): they wait until their timeout", dev_,
            cudaGetErrorString(e));
  }
  if (prev >= 0 && prev != dev_) cudaSetDevice(prev);
}

}  // namespace cuda
}  // namespace ep
