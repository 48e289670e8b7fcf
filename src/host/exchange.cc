#include "exchange.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <cstddef>

#include "../checks.h"
#include "../debug.h"
#include "../params.h"

namespace ep {
namespace host {

namespace {

// Idle rounds (a yield each for the first 64, then 2 us naps, which the
// kernel's timer slack makes some 60 us) before a waiting rank naps longer.
constexpr unsigned kIdleRoundsBeforeSleep = 4096;
// How long a rank that waits only for network peers looks before it sleeps
// in the transport's wait: the calls' own waits, mostly shorter, never pay
// for a wake-up.
constexpr auto kNetIdleBeforeSleep = std::chrono::milliseconds(1);
// Sleeps in the transport's wait: the first 10 ms, each later one twice the
// last, up to 80 ms. Abort, peers that exited and the timeout are looked at
// between sleeps, so they are seen within 80 ms; fewer wake-ups cost less
// where each one is dear (an emulated machine: some 1 ms each).
constexpr int kNetWaitFirstUs = 10000;
constexpr int kNetWaitMostUs = 80000;
using Clock = std::chrono::steady_clock;
// Once a peer began epCommShrink, a call stalled this long fails: soon where
// it waits for a rank in that shrink (its last chunks may still be on their
// way: a rank leaves a call once its puts are posted, and its first shrink
// message may overtake them), later where it waits only for ranks still in
// their calls (one of them may be waiting for a dead rank nobody named).
constexpr auto kShrinkInvolvedStall = std::chrono::milliseconds(500);
constexpr auto kShrinkAnyStall = std::chrono::milliseconds(2000);

bool lowLatencyKind(ChunkKind kind) {
  return kind == kChunkLLCounts || kind == kChunkLLDispatch || kind == kChunkLLCombine;
}

const char* kindName(uint32_t kind) {
  switch (kind) {
    case kChunkCounts: return "counts";
    case kChunkDispatch: return "dispatch";
    case kChunkCombine: return "combine";
    case kChunkLLCounts: return "low-latency counts";
    case kChunkLLDispatch: return "low-latency dispatch";
    case kChunkLLCombine: return "low-latency combine";
    case kChunkLLConnect: return "first low-latency call's";
    case kChunkForwardCounts: return "forward counts";
    case kChunkForward: return "forwarded dispatch";
    case kChunkPartials: return "combine partial sums";
    default: return "unknown";
  }
}
}  // namespace

Exchanger::Exchanger(const BackendComm& comm, std::vector<void*> segments, const RingGeometry& geometry,
                     NetLinks* net, std::vector<int> staging)
    : comm_(comm), segments_(std::move(segments)), geo_(geometry),
      scratch_(size_t(geometry.chunk_records) * geometry.record_bytes), net_(net), staging_(std::move(staging)),
      credited_(size_t(comm.nranks()), 0), ring_cls_(size_t(comm.nranks()), -1) {
  staging_.resize(size_t(comm.nranks()), -1);
}

epTrafficClass_t Exchanger::classFor(ChunkKind kind, int d) const {
  if (lowLatencyKind(kind)) return epTrafficLowLatency;
  return net_->connected(d, epTrafficThroughput) ? epTrafficThroughput : epTrafficControl;
}

bool Exchanger::peerClosed(int rank) const {
  const int me = comm_.rank();
  if (remote(rank))  // both flags were put into this rank's segment by rank
    return loadAcquire(&geo_.ctrl(segments_[me], rank)->source_closed) != 0 ||
           loadAcquire(&geo_.shadow(segments_[me], rank)->owner_closed) != 0;
  return loadAcquire(&geo_.ctrl(segments_[me], rank)->source_closed) != 0 ||
         loadAcquire(&geo_.ctrl(segments_[rank], me)->owner_closed) != 0;
}

void Exchanger::announceClose() {
  const int me = comm_.rank();
  for (int r = 0; r < comm_.nranks(); r++) {
    if (r == me || dead(r)) continue;
    if (remote(r)) {  // best effort: a peer that misses it still sees the connection close
      // Both flags on the connection of the last chunk this rank put into r's
      // ring, so that they land after it: r, still waiting for that chunk,
      // would otherwise take this rank for gone with its data on the way.
      const epTrafficClass_t last =
          ring_cls_[size_t(r)] >= 0 ? epTrafficClass_t(ring_cls_[size_t(r)]) : epTrafficControl;
      net_->signal(r, geo_.ctrlOffset(me) + offsetof(RingCtrl, source_closed), 1, last);
      net_->signal(r, geo_.shadowOffset(me) + offsetof(RingCtrl, owner_closed), 1, last);
      continue;
    }
    storeRelease(&geo_.ctrl(segments_[r], me)->source_closed, 1);  // the ring this rank writes, in r's segment
    storeRelease(&geo_.ctrl(segments_[me], r)->owner_closed, 1);   // the ring r writes, in this rank's
  }
  if (net_) {  // let the signals leave before the links close
    int peer = -1;
    std::string why;
    for (int i = 0; i < 16; i++) net_->progress(&peer, &why);
  }
}

epResult_t Exchanger::netFailed(epResult_t res, int peer, const std::string& why, const char* what,
                                uint64_t call_seq) {
  comm_.markFailed(epRemoteError);
  (void)res;
  if (peer >= 0)
    return setError(comm_, epRemoteError, "%s (call %llu): rank %d (node %d) over %s: %s", what,
                    (unsigned long long)call_seq, peer, comm_.nodes().node_of_rank[size_t(peer)],
                    net_->transportName(), why.c_str());
  return setError(comm_, epRemoteError, "%s (call %llu): transport %s: %s", what, (unsigned long long)call_seq,
                  net_->transportName(), why.c_str());
}

epResult_t Exchanger::sendRemote(int d, ChunkKind kind, uint64_t call_seq, StreamSpec& spec, int* sent,
                                 bool* moved, const char* what) {
  const int me = comm_.rank();
  void* mine = segments_[me];
  RingCtrl* sh = geo_.shadow(mine, d);
  const epTrafficClass_t cls = classFor(kind, d);
  while (*sent < spec.records) {
    const uint64_t head = sh->head;  // only this rank writes it
    const uint64_t tail = loadAcquire(&sh->tail);
    if (head - tail >= uint64_t(geo_.slots)) break;
    // Connections do not keep order between them: a ring moves to another
    // class's connection only once d took every chunk sent on the old one,
    // so that no older head (or chunk) can land after a newer one.
    if (ring_cls_[size_t(d)] != int(cls) && ring_cls_[size_t(d)] >= 0 && head != tail) break;
    const int n = std::min(geo_.chunk_records, spec.records - *sent);
    ChunkHeader* slot = geo_.staging(mine, staging_[size_t(d)], head);
    slot->call_seq = call_seq;
    slot->kind = kind;
    slot->first = uint32_t(*sent);
    slot->count = uint32_t(n);
    spec.pack(*sent, n, reinterpret_cast<uint8_t*>(slot + 1));
    const epResult_t res =
        net_->put(d, cls, geo_.stagingOffset(staging_[size_t(d)], head), geo_.slotOffset(me, head),
                  sizeof(ChunkHeader) + size_t(n) * geo_.record_bytes, geo_.ctrlOffset(me) + offsetof(RingCtrl, head),
                  head + 1);
    if (res == epInProgress) break;  // the connection's queue is full: packed again next round
    if (res != epSuccess) {
      int peer = d;
      std::string why;
      net_->progress(&peer, &why);
      return netFailed(res, d, why.empty() ? epGetErrorString(res) : why, what, call_seq);
    }
    sh->head = head + 1;
    ring_cls_[size_t(d)] = int(cls);
    *sent += n;
    *moved = true;
  }
  return epSuccess;
}

bool Exchanger::returnCredits() {
  if (net_ == nullptr) return true;
  const int me = comm_.rank();
  bool all = true;
  for (int s = 0; s < comm_.nranks(); s++) {
    if (!remote(s) || dead(s)) continue;
    const uint64_t tail = geo_.ctrl(segments_[me], s)->tail;
    if (tail == credited_[size_t(s)]) continue;
    if (net_->signal(s, geo_.shadowOffset(me) + offsetof(RingCtrl, tail), tail) == epSuccess)
      credited_[size_t(s)] = tail;
    else
      all = false;  // queue full (or failed: progress reports it)
  }
  return all;
}

// Rank `gone` stopped taking part: its process exited, or (closed) it
// destroyed or aborted its communicator, most likely after an error of its
// own, so an exited rank, if any, is named too.
epResult_t Exchanger::failPeerGone(int gone, bool closed, const char* what, uint64_t call_seq) {
  comm_.markFailed(epRemoteError);
  comm_.noteGone(gone);
  const unsigned long long seq = call_seq;
  if (!closed)
    return setError(comm_, epRemoteError, "%s (call %llu): rank %d (pid %d) exited", what, seq, gone,
                    comm_.peers()[gone].pid);
  for (int r = 0; r < comm_.nranks(); r++)
    if (r != comm_.rank() && !dead(r) && comm_.peerExited(r))
      return setError(comm_, epRemoteError,
                      "%s (call %llu): rank %d left the call (destroyed or aborted its communicator); "
                      "rank %d (pid %d) exited",
                      what, seq, gone, r, comm_.peers()[r].pid);
  return setError(comm_, epRemoteError,
                  "%s (call %llu): rank %d left the call (destroyed or aborted its communicator)", what, seq, gone);
}

epResult_t Exchanger::failTimeout(const std::vector<StreamSpec>& sends,
                                  const std::vector<StreamSpec>& recvs, const std::vector<int>& sent,
                                  int recv_cursor, const std::vector<int>& received, const char* what,
                                  uint64_t call_seq) {
  // Where the peer is: the latest call it entered, as it wrote beside its
  // ring's head in this rank's segment.
  auto whereIs = [&](int r) {
    const uint64_t theirs = loadAcquire(&geo_.ctrl(segments_[comm_.rank()], r)->source_call);
    std::string at = " (its latest call on this communicator is " + std::to_string(theirs);
    return at + (theirs < call_seq ? ": it has not made this one)" : theirs == call_seq ? ", this one)" : ")");
  };
  std::string who;
  if (recv_cursor < comm_.nranks() && recv_cursor != comm_.rank() &&
      received[recv_cursor] < recvs[recv_cursor].records)
    who = "rank " + std::to_string(recv_cursor) + " has not sent its data" + whereIs(recv_cursor);
  for (int d = 0; d < comm_.nranks(); d++) {
    if (d == comm_.rank() || sent[d] >= sends[d].records) continue;
    if (!who.empty()) who += "; ";
    who += "rank " + std::to_string(d) + " has not taken this rank's data" + whereIs(d);
  }
  comm_.markFailed(epTimeout);
  return setError(comm_, epTimeout, "%s (call %llu): %s within %d ms", what,
                  (unsigned long long)call_seq, who.empty() ? "no progress" : who.c_str(),
                  comm_.config().timeout_ms);
}

epResult_t Exchanger::run(ChunkKind kind, std::vector<StreamSpec>& sends, std::vector<StreamSpec>& recvs,
                          const char* what, const std::vector<int>* order) {
  if (net_ != nullptr && lowLatencyKind(kind) && !net_->classConnected(epTrafficLowLatency)) {
    if (std::find(dead_.begin(), dead_.end(), true) != dead_.end())  // connected at init where shrink is allowed
      return setError(comm_, epInternalError,
                      "%s: the low-latency connections across nodes were not made at init, and a shrink broke the "
                      "bootstrap they would be made over", what);
    EPCHECK(connectLowLatency(what));
  }
  return runCall(kind, ++calls_, sends, recvs, what, order);
}

// The first low-latency call of every rank: its connections are made now
// (collective), so a job that never makes one opens none. First a step of
// its own on the connections there are (one 8-byte record to every rank):
// a peer in another call meets it at its first chunk and both say that the
// calls are out of step, where the connect's collective would only time
// out. Then peers may still be in that step, waiting for this rank's last
// chunks, whose signals a transport may post only at a later progress
// (ibverbs: a striped put's): those are taken first, or the connect's
// collective and the peer's wait would hold each other up.
epResult_t Exchanger::connectLowLatency(const char* what) {
  const int R = comm_.nranks();
  std::vector<StreamSpec> sends(R), recvs(R);
  const uint64_t seq = ++calls_;
  for (int r = 0; r < R; r++) {
    sends[r].records = 1;
    sends[r].pack = [seq](int, int, uint8_t* out) { memcpy(out, &seq, 8); };
    recvs[r].records = 1;
    recvs[r].unpack = [](int, int, const uint8_t*) {};
  }
  EPCHECK(runCall(kChunkLLConnect, seq, sends, recvs, what, nullptr));
  EPCHECK(drainRemote(what, seq));
  const epResult_t res = net_->connectClass(epTrafficLowLatency);
  if (res != epSuccess) comm_.markFailed(res);
  return res;
}

epResult_t Exchanger::runCall(ChunkKind kind, uint64_t call_seq, std::vector<StreamSpec>& sends,
                              std::vector<StreamSpec>& recvs, const char* what, const std::vector<int>* order) {
  const int R = comm_.nranks(), me = comm_.rank(), per_chunk = geo_.chunk_records;
  std::vector<int> sent(R, 0), received(R, 0);
  void* my_segment = segments_[me];
  for (int d = 0; d < R; d++) {
    if (!dead(d)) continue;
    // Masked: nothing to or from it. Counts go to every rank by design; data
    // for a dead rank means its experts were not masked in the routing.
    const bool counts = kind == kChunkCounts || kind == kChunkLLCounts || kind == kChunkForwardCounts ||
                        kind == kChunkLLConnect;
    if (!counts && sends[d].records > 0) {
      comm_.markFailed(epInternalError);
      return setError(comm_, epInternalError, "%s (call %llu): %d records for rank %d, which a shrink removed",
                      what, (unsigned long long)call_seq, sends[d].records, d);
    }
    sends[d].records = recvs[d].records = 0;
  }
  for (int d = 0; d < R; d++) {  // where this rank is, for a peer's timeout report (failTimeout)
    if (d == me || dead(d)) continue;
    if (remote(d))
      net_->signal(d, geo_.ctrlOffset(me) + offsetof(RingCtrl, source_call), call_seq);  // best effort
    else
      storeRelease(&geo_.ctrl(segments_[d], me)->source_call, call_seq);
  }
  int recv_cursor = 0;
  auto last_progress = Clock::now();
  const auto timeout = std::chrono::milliseconds(comm_.config().timeout_ms);
  unsigned idle_rounds = 0;
  int sleep_us = kNetWaitFirstUs;  // the next sleep in the transport's wait
  auto last_liveness_check = Clock::now();
  // A peer found exited is only declared gone after one more pass finds
  // nothing new: it may have published its last chunks just before exiting,
  // between our last look at its ring and the liveness check.
  int exited_suspect = -1;

  auto sendsPending = [&] {
    for (int d = 0; d < R; d++)
      if (d != me && sent[d] < sends[d].records) return true;
    return false;
  };

  bool credits_owed = false;
  while (recv_cursor < R || sendsPending() || credits_owed) {
    bool progress = false;
    if (net_) {
      int peer = -1;
      std::string why;
      const epResult_t res = net_->progress(&peer, &why);
      if (res != epSuccess) return netFailed(res, peer, why, what, call_seq);
    }

    // Send: fill every ring that has room.
    for (int d = 0; d < R; d++) {
      if (d == me) continue;
      if (remote(d)) {
        EPCHECK(sendRemote(d, kind, call_seq, sends[d], &sent[d], &progress, what));
        continue;
      }
      RingCtrl* ctrl = geo_.ctrl(segments_[d], me);
      while (sent[d] < sends[d].records) {
        uint64_t head = ctrl->head;  // only this rank writes it
        if (head - loadAcquire(&ctrl->tail) >= uint64_t(geo_.slots)) break;
        int n = std::min(per_chunk, sends[d].records - sent[d]);
        ChunkHeader* slot = geo_.slot(segments_[d], me, head);
        slot->call_seq = call_seq;
        slot->kind = kind;
        slot->first = uint32_t(sent[d]);
        slot->count = uint32_t(n);
        sends[d].pack(sent[d], n, reinterpret_cast<uint8_t*>(slot + 1));
        storeRelease(&ctrl->head, head + 1);
        sent[d] += n;
        progress = true;
      }
    }

    // Receive, in ascending source order (or the order given).
    while (recv_cursor < R) {
      const int s = order ? (*order)[size_t(recv_cursor)] : recv_cursor;
      if (received[s] >= recvs[s].records) {
        recv_cursor++;
        continue;
      }
      if (s == me) {  // own stream: straight from pack to unpack
        while (received[s] < recvs[s].records) {
          int n = std::min(per_chunk, recvs[s].records - received[s]);
          sends[me].pack(received[s], n, scratch_.data());
          recvs[me].unpack(received[s], n, scratch_.data());
          received[s] += n;
        }
        progress = true;
        continue;
      }
      RingCtrl* ctrl = geo_.ctrl(my_segment, s);
      uint64_t tail = ctrl->tail;  // only this rank writes it
      if (loadAcquire(&ctrl->head) == tail) break;  // nothing yet from s
      const ChunkHeader* slot = geo_.slot(my_segment, s, tail);
      if (slot->call_seq < stale_before_) {  // the failed call's, before a shrink: dropped
        storeRelease(&ctrl->tail, tail + 1);
        progress = true;
        continue;
      }
      if (slot->call_seq != call_seq || slot->kind != kind || slot->first != uint32_t(received[s]) ||
          slot->count == 0 || int(slot->count) > recvs[s].records - received[s]) {
        comm_.markFailed(epInvalidUsage);
        return setError(comm_, epInvalidUsage,
                        "%s (call %llu): rank %d sent %s data of its call %llu: ranks must issue "
                        "the same collective calls in the same order",
                        what, (unsigned long long)call_seq, s, kindName(slot->kind),
                        (unsigned long long)slot->call_seq);
      }
      recvs[s].unpack(received[s], int(slot->count), reinterpret_cast<const uint8_t*>(slot + 1));
      received[s] += int(slot->count);
      storeRelease(&ctrl->tail, tail + 1);
      progress = true;
    }
    credits_owed = !returnCredits();

    if (progress) {
      last_progress = Clock::now();
      idle_rounds = 0;
      sleep_us = kNetWaitFirstUs;
      exited_suspect = -1;
      continue;
    }
    // Idle: give the core away (ranks often outnumber cores), watch for abort,
    // dead peers and the timeout.
    if (comm_.aborted())
      return setError(comm_, epAborted, "%s: communicator aborted", what);
    idle_rounds++;
    if (idle_rounds < 64) {
      sched_yield();
      continue;
    }
    const int waited = recv_cursor < R ? (order ? (*order)[size_t(recv_cursor)] : recv_cursor) : -1;
    auto waitingOn = [&](int r) { return r != me && ((r == waited) || (sent[r] < sends[r].records)); };
    // Idle for a while: where everything awaited comes over the network and
    // the transport can block, sleep until it wakes this rank (a peer's
    // signal, a completion) instead of napping between looks: a rank waiting
    // for a late peer then burns no core. A peer on this node writes shared
    // memory, which wakes nobody: there, naps.
    bool slept = false;
    if (net_ != nullptr && net_->canWait() && param::NET_WAIT() != 0 &&
        Clock::now() - last_progress > kNetIdleBeforeSleep) {
      bool all_remote = true;
      for (int r = 0; r < R && all_remote; r++)
        if (waitingOn(r) && !remote(r)) all_remote = false;
      if (all_remote) {
        int peer = -1;
        std::string why;
        const epResult_t res = net_->wait(sleep_us, &peer, &why);
        sleep_us = std::min(2 * sleep_us, kNetWaitMostUs);
        if (res != epSuccess) return netFailed(res, peer, why, what, call_seq);
        slept = true;
      }
    }
    if (!slept) {
      struct timespec nap = {0, idle_rounds < kIdleRoundsBeforeSleep ? 2000L : 200000L};
      nanosleep(&nap, nullptr);
    }
    // Between sleeps; never more often than every ms (a transport's wait
    // may return early, often: a peer whose signals wake nobody).
    if ((idle_rounds & 63) == 0 || (slept && Clock::now() - last_liveness_check > std::chrono::milliseconds(1))) {
      last_liveness_check = Clock::now();
      if (comm_.shrinkBegan()) {
        const auto stalled = Clock::now() - last_progress;
        int awaited = stalled > kShrinkInvolvedStall ? comm_.shrinkBlocks(waitingOn) : -1;
        if (awaited < 0 && stalled > kShrinkAnyStall)
          for (int r = 0; r < R && awaited < 0; r++)
            if (waitingOn(r)) awaited = r;
        if (awaited >= 0) {
          comm_.markFailed(epRemoteError);
          return setError(comm_, epRemoteError,
                          "%s (call %llu): %s; this call waits for rank %d and cannot complete: call epCommShrink",
                          what, (unsigned long long)call_seq, comm_.shrinkNotice().c_str(), awaited);
        }
      }
      // A waited-on peer that exited, else one that closed its communicator.
      int gone = -1;
      bool closed = false;
      for (int r = 0; r < R && gone < 0; r++)
        if (waitingOn(r) && comm_.peerExited(r)) gone = r;  // it will never make progress again
      for (int r = 0; r < R && gone < 0; r++)
        if (waitingOn(r) && peerClosed(r)) gone = r, closed = true;
      if (gone >= 0 && exited_suspect != gone) {  // look at the rings once more first
        exited_suspect = gone;
        idle_rounds = 63;  // the next idle round checks again
      } else if (gone >= 0) {
        return failPeerGone(gone, closed, what, call_seq);
      }
      if (Clock::now() - last_progress > timeout)
        return failTimeout(sends, recvs, sent, waited < 0 ? R : waited, received, what, call_seq);
    }
  }
  // Several QPs per connection: the signal of a put striped over them is
  // posted only once its parts completed, which this rank's progress sees.
  // A rank that left its call and then waited elsewhere (an NCCL collective
  // with the peer) would hold the peer in this call: it leaves only once its
  // peers took its last chunks.
  if (net_ != nullptr && comm_.config().ib.qps_per_peer > 1) return drainRemote(what, call_seq);
  return epSuccess;
}

epResult_t Exchanger::drainRemote(const char* what, uint64_t call_seq) {
  const int R = comm_.nranks(), me = comm_.rank();
  const auto start = Clock::now();
  const auto timeout = std::chrono::milliseconds(comm_.config().timeout_ms);
  for (unsigned idle = 0;; idle++) {
    int waited = -1;
    for (int d = 0; d < R && waited < 0; d++) {
      if (!remote(d) || dead(d)) continue;
      const RingCtrl* sh = geo_.shadow(segments_[me], d);
      if (sh->head != loadAcquire(&sh->tail)) waited = d;
    }
    if (waited < 0) return epSuccess;
    int peer = -1;
    std::string why;
    const epResult_t res = net_->progress(&peer, &why);
    if (res != epSuccess) return netFailed(res, peer, why, what, call_seq);
    if (comm_.aborted()) return setError(comm_, epAborted, "%s: communicator aborted", what);
    if ((idle & 255) == 255) {
      if (comm_.peerExited(waited)) return failPeerGone(waited, false, what, call_seq);
      if (peerClosed(waited)) return failPeerGone(waited, true, what, call_seq);
      if (Clock::now() - start > timeout) {
        comm_.markFailed(epTimeout);
        return setError(comm_, epTimeout, "%s (call %llu): rank %d has not taken this rank's last chunks within %d ms",
                        what, (unsigned long long)call_seq, waited, comm_.config().timeout_ms);
      }
    }
    if (idle < 64) {
      sched_yield();
    } else {
      struct timespec nap = {0, 2000L};
      nanosleep(&nap, nullptr);
    }
  }
}

void Exchanger::shrink(const std::vector<bool>& dead, uint64_t steps) {
  dead_ = dead;
  calls_ = steps;
  stale_before_ = steps + 1;
}

epResult_t Exchanger::exchangeCounts(ChunkKind kind, Routing* routing, const char* what) {
  const int R = comm_.nranks();
  std::vector<int> recv_count(R, 0);
  std::vector<StreamSpec> sends(R), recvs(R);
  for (int r = 0; r < R; r++) {  // one 8-byte record to every rank, one from every rank
    sends[r].records = 1;
    sends[r].pack = [routing, r](int, int, uint8_t* out) {
      int64_t n = routing->sendCount(r);
      memcpy(out, &n, 8);
    };
    recvs[r].records = 1;
    recvs[r].unpack = [&recv_count, r](int, int, const uint8_t* in) {
      int64_t n;
      memcpy(&n, in, 8);
      recv_count[r] = int(n);
    };
  }
  epResult_t res = run(kind, sends, recvs, what);
  if (res == epSuccess) buildRecvSide(recv_count, routing);
  return res;
}

}  // namespace host
}  // namespace ep
