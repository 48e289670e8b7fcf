// The order of a rank's collective kernels, in memory its node peers map, so
// that ranks which issue them in different orders are told so instead of
// waiting for their timeout.
//
// Collective calls must match one to one, in order, on every rank. Each
// rank's host appends the kind of every collective kernel it enqueues (a
// dispatch's routing, a dispatch, a combine, a low-latency dispatch or
// combine) to its own log; a watcher compares the logs call by call. Two
// kinds at the same position are ranks out of step, whatever their kernels
// do: wait for each other forever, or finish with rows of another call.
// Checking costs the kernels nothing (the logs are host memory, written at
// enqueue time), so it also finds what the kernels cannot see cheaply:
// low-latency calls out of order among themselves, a combine that sends a
// rank no rows.
//
// Calls captured into a CUDA graph are logged once, at capture, but run at
// every launch: from the first call either rank captured, the two logs no
// longer line up with what runs, and are not compared any more.
//
// A low-latency dispatch's entry also says whether it was small (within the
// rank's bound for flagged records) and what it sent, for the peers' choice
// of records (chooseLLRecords).
//
// A log also says when its rank destroyed or aborted its communicator
// (announceClosed), so that the peers' waits for it end at once instead of
// at their timeout: the logs outlive their owner's communicator in the
// peers' mappings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ep {

// A collective kernel, as the call that enqueues it (0: none).
enum CallKind : uint8_t {
  kCallNone = 0,
  kCallRouting = 1,     // epDispatchPrepare, or epDispatch with new ids (before its dispatch)
  kCallDispatch = 2,    // epDispatch
  kCallCombine = 3,     // epCombine
  kCallLLDispatch = 4,  // epLowLatencyDispatch
  kCallLLCombine = 5,   // epLowLatencyCombine
};
const char* callKindName(int kind);
// What a low-latency dispatch's entry adds to its kind: it was not small (over
// the rank's bound for flagged records, or flagged records off there), it
// sent plain records.
constexpr uint8_t kCallLLLarge = 0x40, kCallLLPlain = 0x80;
inline uint8_t llDispatchNote(bool small, bool flagged) {
  return uint8_t((small ? 0 : kCallLLLarge) | (flagged ? 0 : kCallLLPlain));
}

// How a rank left its communicator (0: it has not).
enum CloseKind : uint8_t {
  kOpen = 0,
  kClosedDestroyed = 1,  // epCommDestroy, once its kernels had finished
  kClosedAborted = 2,    // epCommAbort (its kernels told to stop waiting)
};

// Bytes of one rank's log (its shared memory).
size_t callLogBytes();
// Makes zeroed memory of callLogBytes() an empty log (its owner, before
// any peer maps it).
void callLogFormat(void* mem);

// Where two logs first differ: this rank's collective call `call` (from 0)
// was of kind `mine`, rank `peer`'s of kind `theirs`.
struct CallMismatch {
  int peer = -1;
  uint64_t call = 0;
  int mine = kCallNone, theirs = kCallNone;
};

class CallLog {
 public:
  // Log slots: the calls a look can still compare when both ranks ran this
  // far past its last look (older ones are skipped, not misread). A host
  // issues a collective call every few microseconds at most (a kernel launch
  // takes 3 us), so 65536 hold more than the 100 ms between looks.
  static constexpr int kSlots = 65536;
  struct Shared;  // the layout of a log (call_log.cc)

  // own: this rank's formatted log; peers are added with setPeer.
  CallLog(void* own, int rank, int nranks);
  // Rank r's log as mapped here (nullptr: not compared).
  void setPeer(int r, const void* log);
  bool comparesAny() const;

  // Appends a kernel this rank enqueued (`capturing`: into a graph; `note`: a
  // low-latency dispatch's llDispatchNote). Called by the thread in the
  // communicator's call (one at a time).
  void record(CallKind kind, bool capturing, uint8_t note = 0);
  // Compares every peer's calls with this rank's, from where the last look
  // ended up to the calls both have made: true at the first that differs.
  // One caller at a time (the watcher).
  bool findMismatch(CallMismatch* out);

  // The records of the low-latency dispatch this rank logs next (its next
  // call: the same call on every rank), `small` when within its own bound
  // for flagged records (EP_CUDA_LL_FLAGGED). A call that mixes flagged and
  // plain sources takes a slower receive, so with `follow_peers` a small call
  //   - does what the small peers that already logged this call chose;
  //   - else sends plain records when a peer that logged it was not small;
  //   - else when a peer's latest low-latency dispatch (a prediction: that
  //     peer is behind) was not small;
  //   - else flagged ones.
  // Without `follow_peers`, or not small: flagged when small. Returns
  // whether to send flagged records; *peer: the peer that made the call
  // plain (-1: none). The call is then logged with record(kCallLLDispatch,
  // ..., llDispatchNote(small, flagged)).
  bool chooseLLRecords(bool small, bool follow_peers, int* peer) const;

  // The collective calls this rank logged and those rank r logged (false
  // when r's log is not mapped here, or either rank captured calls into a
  // graph: the counts are then not what ran).
  bool progress(int r, uint64_t* mine, uint64_t* theirs) const;

  // This rank left its communicator: `how` (the first announcement stays:
  // an abort is not turned into a destroy by the free that follows it).
  void announceClosed(CloseKind how);
  // How rank r left its communicator, as its log says (kOpen: it has not,
  // or its log is not mapped here).
  CloseKind peerClosed(int r) const;

 private:
  Shared* own_;
  int rank_;
  std::vector<const Shared*> peers_;
  std::vector<uint64_t> checked_;  // [rank]: calls compared so far
};

}  // namespace ep
