// What the host learns while kernels spin, written into the device words
// their waits read in their slow path (every 64 spins):
//   - a peer process of this node that exited: a watcher thread polls the
//     peers' pids every 100 ms and sets gone[rank] (the waits for that rank
//     then end with epRemoteError, reported at the next call, instead of at
//     the timeout);
//   - a peer that destroyed or aborted its communicator (its call log says
//     so, announceClosed): gone[rank] as for an exit, and this rank's further
//     collective calls are refused on the host (closedPeer), before any
//     kernel could write into the peer's freed buffers. A destroy announces
//     once its kernels have finished (what they sent has landed: a wait for
//     it sees it when it loads once more), an abort at once (its kernels
//     stop waiting, so what they have not sent never comes);
//   - ranks out of step: the same watcher compares the ranks' call logs
//     (src/call_log.h, in host shared memory). A difference that no kernel
//     of this rank has reported within half a second (the kernels' own
//     checks take a few milliseconds where they have one) sets timed_out:
//     every wait leaves, and the next call reports the two calls
//     (outOfStep);
//   - epCommAbort of this communicator: timed_out = 1 (every wait leaves, so
//     the kernels end and the communicator can be freed at once).
// The words are this rank's own device memory, written by copies on a stream
// of their own, which run beside kernels that spin on the caller's stream.
// Peers in this process are not watched for exits (they cannot exit alone),
// nor peers in another pid namespace (their pids mean nothing here); their
// destroy or abort is seen wherever the call logs are mapped.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../backend_comm.h"
#include "../call_log.h"
#include "../peer_buffers.h"
#include "cuda_common.h"

namespace ep {
namespace cuda {

class HostNotices {
 public:
  HostNotices(const BackendComm& comm, int device) : comm_(comm), dev_(device) {}
  ~HostNotices();
  // Collective (bootstrap): also maps the peers' call logs.
  epResult_t init();
  // The timed_out word and the gone[kMaxRanks] bytes of one kernel family,
  // and its host-mapped error slots (kErrorSlots), whose failure slot says
  // that a kernel reported a failed wait.
  void addTarget(int* timed_out, uint8_t* gone, const ErrorInfo* slots) {
    targets_.push_back({timed_out, gone, slots});
  }
  // Starts the watcher when a peer runs in another process, or a peer's
  // call log is mapped (after every addTarget).
  void watch();
  // epCommAbort: every wait of this rank leaves.
  void abort();
  // This rank leaves its communicator (its call log says so to the peers'
  // watchers): kClosedAborted from epCommAbort, kClosedDestroyed once the
  // GPU finished this rank's kernels.
  void announceClosed(CloseKind how) {
    if (calls_) calls_->announceClosed(how);
  }
  // A peer that destroyed or aborted its communicator, as the watcher saw
  // it (-1: none); goneWhat(r) says how.
  int closedPeer() const { return first_closed_.load(std::memory_order_acquire); }
  // "rank R (pid P) exited", "rank R destroyed its communicator" or "rank R
  // aborted its communicator" once the watcher marked rank r gone for that
  // reason; else "".
  std::string goneWhat(int r) const;
  // goneWhat(r) for the report of a wait that found rank r gone, where the
  // watcher's reason may be missing: "rank R (pid P) exited" if its process
  // did, else "rank R left".
  std::string describeGone(int r) const;
  // For a wait for rank r that timed out, a clause to append ("; rank R's
  // host has issued ..."): how many collective calls r's host has issued
  // beside this rank's (has it made the call at all?), as their call logs
  // say; "" where they cannot tell (not mapped, graphs captured).
  std::string progressNote(int r) const;
  // A collective kernel this rank enqueued on `stream` (its call log; `note`:
  // a low-latency dispatch's llDispatchNote).
  void recordCall(CallKind kind, cudaStream_t stream, uint8_t note = 0);
  // The low-latency dispatch this rank records next, `small` when within its
  // bound for flagged records: whether it sends flagged records (with
  // `follow_peers`, as the peers' call logs say: CallLog::chooseLLRecords;
  // without mapped call logs, when small). Logs at INFO the first call made
  // plain.
  bool llSendsFlagged(bool small, bool follow_peers, int num_tokens);
  // Once the watcher found the ranks out of step (and ended the kernels'
  // waits): the two calls; else null.
  const char* outOfStep() const;
  // A kernel of either family reported a failed wait (its failure slot).
  bool kernelsReportedFailure() const;
  // epCommShrink decided (CudaBackend::resetForShrink): the removed ranks
  // are watched no more, the call logs compared no more (the survivors'
  // logs differ by the failed call and cannot be lined up again), and the
  // calls found out of step are forgotten. `reset` (the zeroing of the
  // buffers that hold the gone bytes) runs meanwhile, with the watcher held
  // off; after it, the survivors the watcher found gone (one that exited or
  // closed its communicator after it decided) are marked gone again, and a
  // survivor that closed stays the closed peer. The failure slots are the
  // caller's to clear.
  epResult_t forgetAfterShrink(const std::vector<bool>& dead, const std::function<epResult_t()>& reset);

 private:
  // Looks (100 ms apart) between finding calls out of step and ending the
  // kernels' waits (lookAtCalls).
  static constexpr int kActAfterLooks = 5;
  struct Target {
    int* timed_out;
    uint8_t* gone;
    const ErrorInfo* slots;
  };
  epResult_t shareCallLog();
  bool watched(int rank) const;
  void run();
  bool lookAtCalls(int* looks_pending, CallMismatch* seen);
  void markGone(int rank);
  void write(void* dst, size_t bytes);

  BackendComm comm_;
  int dev_;
  cudaStream_t stream_ = nullptr;
  int* one_ = nullptr;  // pinned source of the copies: 1 (int) / 1 (byte)
  std::vector<Target> targets_;
  // The call logs: this rank's, registered with the shm transport, and the
  // peers' as mapped here.
  std::unique_ptr<PeerBuffers> logs_;
  std::unique_ptr<CallLog> calls_;
  bool told_plain_ = false;  // llSendsFlagged's INFO line was logged
  // Why the watcher marked each rank gone (a GoneWhy, host_notices.cc), set
  // before its gone bytes; the first rank that closed its communicator.
  std::atomic<uint8_t> gone_why_[kMaxRanks] = {};
  std::atomic<int> first_closed_{-1};
  std::atomic<bool> out_of_step_{false};
  std::string out_of_step_what_;  // written before out_of_step_ is set
  std::mutex mu_;  // the stream and one_ (the watcher and abort may both write)
  std::mutex stop_mu_;  // also held by the watcher's loop body: forgetAfterShrink waits for a look to end
  bool shrunk_ = false;                 // under stop_mu_
  bool removed_[kMaxRanks] = {};        // under stop_mu_: ranks a shrink removed
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace cuda
}  // namespace ep
