// Bootstrap collectives over the ranks' TCP ring (allgather, barrier) and the
// failure notices that travel it; the ring itself is formed in bootstrap.cc.
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "bootstrap.h"
#include "bootstrap_ring.h"
#include "checks.h"
#include "debug.h"

namespace ep {

using namespace ring;

namespace {

// ---- Failure notices ---------------------------------------------------------
// A rank whose init fails once the ring stands tells its successor before it
// leaves (bootstrapNotifyFailure), and a rank whose ring operation fails
// because of its predecessor (a notice, a closed connection, a timeout)
// passes a notice on to its own successor before it leaves. Every rank then
// names the rank where the failure began, not the neighbour that left after
// it. A notice travels in place of the message the successor expects next:
// an operation header (kind kOpNotice, then the Notice) or a step's frame.

struct Notice {
  int32_t origin;  // the rank where the failure began
  int32_t result;  // its epResult_t
  char text[248];  // what it said (NUL-terminated)
};

// Every step of an operation moves one frame: this head, then the slot,
// padded to at least a Notice (so that a notice fits in any frame).
struct StepHead {
  uint32_t magic;
  uint32_t notice;  // 1: a Notice follows instead of the slot
};
constexpr uint32_t kStepMagic = 0x65705374u;  // 'epSt'
constexpr int kNoticeWaitMs = 1000;           // a successor that does not take a notice is gone

size_t framePayload(size_t bytes_per_rank) { return std::max(bytes_per_rank, sizeof(Notice)); }

Notice makeNotice(int origin, epResult_t result, const std::string& text) {
  Notice n;
  memset(&n, 0, sizeof(n));
  n.origin = origin;
  n.result = int32_t(result);
  snprintf(n.text, sizeof(n.text), "%s", text.c_str());
  return n;
}

// What this rank still owes its successor when an operation fails: the rest
// of a message whose send a failed receive cut short. The successor reads
// that first, so the notice goes after it (header_next: it expects a header then).
struct Owed {
  const char* data = nullptr;
  size_t len = 0;
  bool header_next = false;
};

// The message buf[0, len) was being sent and `sent` bytes of it went out.
// Nothing sent: the notice replaces it (the successor still expects what it
// was, a header when is_header). Else the rest is owed, and the successor
// expects a header after it when header_after.
Owed owedOf(const void* buf, size_t len, size_t sent, bool is_header, bool header_after) {
  Owed o;
  if (sent == 0) {
    o.header_next = is_header;
    return o;
  }
  o.data = static_cast<const char*>(buf) + std::min(sent, len);
  o.len = len - std::min(sent, len);
  o.header_next = header_after;
  return o;
}

// Passes n on to the successor, best effort (it may be gone). header_next:
// the successor expects an operation header next, else a step frame of an
// operation of bytes_per_rank. owed (may be NULL): bytes sent before the
// notice (its header_next then replaces the argument).
void forwardNotice(Bootstrap* b, const Notice& n, bool header_next, size_t bytes_per_rank,
                   const Owed* owed = nullptr) {
  if (b->nranks < 2 || !b->next_fd.valid()) return;
  if (owed != nullptr) header_next = owed->header_next;
  std::vector<char> msg;
  try {
    if (owed != nullptr && owed->len != 0) msg.assign(owed->data, owed->data + owed->len);
    const size_t at = msg.size();
    if (header_next) {
      const OpHeader h = {kOpMagic, kOpNotice, b->op_seq, sizeof(Notice)};
      msg.resize(at + sizeof(h) + sizeof(n));
      memcpy(msg.data() + at, &h, sizeof(h));
      memcpy(msg.data() + at + sizeof(h), &n, sizeof(n));
    } else {
      const StepHead h = {kStepMagic, 1};
      msg.resize(at + sizeof(h) + framePayload(bytes_per_rank), 0);
      memcpy(msg.data() + at, &h, sizeof(h));
      memcpy(msg.data() + at + sizeof(h), &n, sizeof(n));
    }
  } catch (const std::bad_alloc&) {
    return;
  }
  (void)sendExact(b->next_fd.get(), msg.data(), msg.size(), Wait::afterMs(kNoticeWaitMs));
}

// The error of a rank that received notice n in an operation of `kind`.
epResult_t noticeFailure(Bootstrap* b, const Notice& n, uint32_t kind) {
  b->broken = true;
  char text[sizeof(n.text) + 1];
  memcpy(text, n.text, sizeof(n.text));
  text[sizeof(n.text)] = '\0';
  return setError(b->comm, epRemoteError, "bootstrap: rank %d failed (%s): %s [rank %d heard it during its %s]",
                  n.origin, epGetErrorString(epResult_t(n.result)), text, b->rank, opName(kind));
}

// Ring failure with the neighbour named; the ring is unusable afterwards. A
// failure on the predecessor's side is passed on to the successor (see
// forwardNotice for header_next and bytes_per_rank).
epResult_t ringFailure(Bootstrap* b, const IoResult& r, bool send_side, uint32_t kind, bool header_next,
                       size_t bytes_per_rank, const Owed* owed = nullptr) {
  b->broken = true;
  const char* op = opName(kind);
  int peer = send_side ? b->next() : b->prev();
  char text[512];
  epResult_t res = epInternalError;
  switch (r.status) {
    case IoStatus::kOk: return epSuccess;
    case IoStatus::kTimeout:
      res = epTimeout;
      if (send_side)
        snprintf(text, sizeof(text), "bootstrap: rank %d did not take the %s data of rank %d within %d ms", peer, op,
                 b->rank, b->timeout_ms);
      else
        snprintf(text, sizeof(text), "bootstrap: rank %d did not answer the %s of rank %d within %d ms", peer, op,
                 b->rank, b->timeout_ms);
      break;
    case IoStatus::kAborted:
      return setError(b->comm, epAborted, "bootstrap: rank %d: %s aborted", b->rank, op);
    case IoStatus::kClosed:
      // A rank that fails with a message, or hears of a failure, sends a
      // notice to its successor before it leaves: a predecessor that closed
      // without one exited, crashed or was aborted. A successor's notice
      // goes the other way round the ring (successorGone listens for it).
      res = epRemoteError;
      if (send_side)
        snprintf(text, sizeof(text),
                 "bootstrap: rank %d left during the %s of rank %d (%s): it failed, exited, crashed or was "
                 "aborted, and no reason came round the ring",
                 peer, op, b->rank, r.describe().c_str());
      else
        snprintf(text, sizeof(text),
                 "bootstrap: rank %d left during the %s of rank %d (%s) without saying why: it exited, crashed "
                 "or was aborted (a rank that fails, or hears of a failure, says so before it leaves)",
                 peer, op, b->rank, r.describe().c_str());
      break;
    case IoStatus::kError:
      res = epSystemError;
      snprintf(text, sizeof(text), "bootstrap: rank %d: %s with rank %d failed: %s", b->rank, op, peer,
               r.describe().c_str());
      break;
  }
  if (!send_side) forwardNotice(b, makeNotice(peer, res, text), header_next, bytes_per_rank, owed);
  return setError(b->comm, res, "%s", text);
}

// True when a step frame (its head first) carries a notice, copied to *n.
bool frameNotice(const char* frame, Notice* n) {
  StepHead head;
  memcpy(&head, frame, sizeof(head));
  if (head.magic != kStepMagic || head.notice == 0) return false;
  memcpy(n, frame + sizeof(StepHead), sizeof(*n));
  return true;
}

// An operation header that announces a notice (which follows it).
bool noticeHeader(const OpHeader& h) { return h.magic == kOpMagic && h.kind == kOpNotice; }

// The successor closed its connection (r, send side) after this rank had
// received `frame` (step `step`'s, or -1: the header, which was this
// operation's). Its reason, if it gave one, comes round the ring from the
// other side: listen to the predecessor, sending nothing, for the rest of
// this operation, then (briefly) for the next one's header and first frame,
// until a notice arrives. Without one, the successor left unexplained.
epResult_t successorGone(Bootstrap* b, const IoResult& r, uint32_t kind, size_t bytes_per_rank, int step,
                         std::vector<char>& frame) {
  b->broken = true;
  Notice n;
  if (step >= 0 && frameNotice(frame.data(), &n)) return noticeFailure(b, n, kind);
  const Wait wait = b->opWait();
  bool heard_all = true;
  for (int s = step + 1; s < b->nranks - 1 && heard_all; s++) {
    heard_all = recvExact(b->prev_fd.get(), frame.data(), frame.size(), wait).ok();
    if (heard_all && frameNotice(frame.data(), &n)) return noticeFailure(b, n, kind);
  }
  if (heard_all) {  // a predecessor that finished this operation may hear of the failure in the next
    const Wait brief = Wait::afterMs(kNoticeWaitMs, b->user_abort, &b->internal_abort);
    OpHeader h;
    // A notice there comes in place of the header, or of the first frame:
    // its head and the Notice are all this rank reads of that frame.
    char first[sizeof(StepHead) + sizeof(Notice)];
    bool noticed = false;
    if (recvExact(b->prev_fd.get(), &h, sizeof(h), brief).ok()) {
      if (noticeHeader(h)) noticed = recvExact(b->prev_fd.get(), &n, sizeof(n), brief).ok();
      else if (h.magic == kOpMagic)
        noticed = recvExact(b->prev_fd.get(), first, sizeof(first), brief).ok() && frameNotice(first, &n);
    }
    if (noticed) return noticeFailure(b, n, kind);
  }
  return ringFailure(b, r, true, kind, false, bytes_per_rank);
}

epResult_t ringAllGather(Bootstrap* b, void* data, size_t bytes_per_rank, uint32_t kind) {
  if (b == nullptr) return setError(nullptr, epInvalidArgument, "bootstrap: NULL bootstrap");
  if (b->aborted())
    return setError(b->comm, epAborted, "bootstrap: rank %d: %s after abort", b->rank, opName(kind));
  if (b->broken)
    return setError(b->comm, epRemoteError,
                    "bootstrap: rank %d: %s on a ring broken by an earlier failure", b->rank, opName(kind));
  if (data == nullptr && bytes_per_rank != 0)
    return setError(b->comm, epInvalidArgument, "bootstrap: %s data is NULL", opName(kind));
  if (b->nranks == 1) return epSuccess;
  const Wait wait = b->opWait();
  std::vector<char> out, in;  // a step's frames
  try {
    out.assign(sizeof(StepHead) + framePayload(bytes_per_rank), 0);
    in.assign(out.size(), 0);
  } catch (const std::bad_alloc&) {
    return setError(b->comm, epOutOfMemory, "bootstrap: %s frames of %zu bytes", opName(kind), out.size());
  }

  // The header exchange proves both neighbours run the same collective with
  // the same size before any payload moves.
  OpHeader mine = {kOpMagic, kind, b->op_seq, bytes_per_rank};
  OpHeader theirs;
  bool send_side = false;
  size_t sent = 0;
  IoResult r = sendRecvExact(b->next_fd.get(), &mine, sizeof(mine), b->prev_fd.get(), &theirs,
                             sizeof(theirs), wait, &send_side, &sent);
  // The successor gone: theirs came in all the same (sendRecvExact).
  const bool successor_gone = !r.ok() && send_side && r.status == IoStatus::kClosed;
  if (!r.ok() && !successor_gone) {
    const Owed owed = owedOf(&mine, sizeof(mine), sent, true, false);
    return ringFailure(b, r, send_side, kind, false, bytes_per_rank, &owed);
  }
  if (noticeHeader(theirs)) {  // the predecessor failed or heard of a failure
    Notice n;
    IoResult rn = recvExact(b->prev_fd.get(), &n, sizeof(n), wait);
    if (!rn.ok()) return ringFailure(b, rn, false, kind, false, bytes_per_rank);
    if (!successor_gone) forwardNotice(b, n, false, bytes_per_rank);
    return noticeFailure(b, n, kind);
  }
  if (successor_gone) return successorGone(b, r, kind, bytes_per_rank, -1, in);
  if (theirs.magic != kOpMagic || theirs.kind != kind || theirs.seq != b->op_seq ||
      theirs.bytes_per_rank != bytes_per_rank) {
    b->broken = true;
    char text[512];
    snprintf(text, sizeof(text),
             "bootstrap: rank %d called %s #%llu with %llu bytes per rank, but rank %d called %s #%llu with %llu",
             b->rank, opName(kind), (unsigned long long)b->op_seq, (unsigned long long)bytes_per_rank, b->prev(),
             theirs.magic == kOpMagic ? opName(theirs.kind) : "something else", (unsigned long long)theirs.seq,
             (unsigned long long)theirs.bytes_per_rank);
    // The successor took this header and waits for the first frame: say why none comes.
    forwardNotice(b, makeNotice(b->rank, epInvalidUsage, text), false, bytes_per_rank);
    return setError(b->comm, epInvalidUsage, "%s", text);
  }
  b->op_seq++;

  // Classic ring: at step s pass on the slot that arrived at step s-1 (our own at s=0).
  char* base = static_cast<char*>(data);
  const int n = b->nranks;
  const StepHead data_head = {kStepMagic, 0};
  memcpy(out.data(), &data_head, sizeof(data_head));
  for (int step = 0; step < n - 1; step++) {
    int send_slot = ((b->rank - step) % n + n) % n;
    int recv_slot = ((b->rank - step - 1) % n + n) % n;
    const bool last = step == n - 2;  // after it the successor expects the next operation's header
    if (bytes_per_rank != 0)
      memcpy(out.data() + sizeof(StepHead), base + size_t(send_slot) * bytes_per_rank, bytes_per_rank);
    r = sendRecvExact(b->next_fd.get(), out.data(), out.size(), b->prev_fd.get(), in.data(), in.size(), wait,
                      &send_side, &sent);
    if (!r.ok() && send_side && r.status == IoStatus::kClosed)  // in holds this step's frame
      return successorGone(b, r, kind, bytes_per_rank, step, in);
    if (!r.ok()) {
      const Owed owed = owedOf(out.data(), out.size(), sent, false, last);
      return ringFailure(b, r, send_side, kind, last, bytes_per_rank, &owed);
    }
    StepHead head;
    memcpy(&head, in.data(), sizeof(head));
    if (head.magic != kStepMagic) {
      b->broken = true;
      char text[256];
      snprintf(text, sizeof(text), "bootstrap: rank %d: step %d of the %s from rank %d is not a frame", b->rank,
               step, opName(kind), b->prev());
      forwardNotice(b, makeNotice(b->rank, epInternalError, text), last, bytes_per_rank);
      return setError(b->comm, epInternalError, "%s", text);
    }
    Notice nt;
    if (frameNotice(in.data(), &nt)) {
      forwardNotice(b, nt, last, bytes_per_rank);
      return noticeFailure(b, nt, kind);
    }
    if (bytes_per_rank != 0)
      memcpy(base + size_t(recv_slot) * bytes_per_rank, in.data() + sizeof(StepHead), bytes_per_rank);
  }
  EP_TRACE(kSubsysBootstrap, "bootstrap: rank %d %s of %zu bytes per rank done", b->rank, opName(kind),
           bytes_per_rank);
  return epSuccess;
}

}  // namespace

epResult_t bootstrapAllGather(Bootstrap* b, void* data, size_t bytes_per_rank) {
  return ringAllGather(b, data, bytes_per_rank, kOpAllGather);
}

epResult_t bootstrapBarrier(Bootstrap* b) {
  if (b == nullptr) return setError(nullptr, epInvalidArgument, "bootstrap: NULL bootstrap");
  std::vector<char> bytes;
  try {
    bytes.assign(size_t(b->nranks), 0);
  } catch (const std::bad_alloc&) {
    return setError(b->comm, epOutOfMemory, "bootstrap: barrier buffer");
  }
  return ringAllGather(b, bytes.data(), 1, kOpBarrier);
}

void bootstrapNotifyFailure(Bootstrap* b, epResult_t result, const char* text) {
  // A ring already broken passed its notice on (or its successor is gone).
  if (b == nullptr || b->broken || b->nranks < 2) return;
  b->broken = true;
  forwardNotice(b, makeNotice(b->rank, result, text != nullptr ? text : ""), true, 0);
}

void bootstrapAbort(Bootstrap* b) {
  if (b == nullptr) return;
  b->internal_abort.store(1, std::memory_order_release);
  // The poll loops see the flag within kPollSliceMs; shutting the connections
  // down as well tells the neighbours right away instead of at their timeout.
  if (b->next_fd.valid()) ::shutdown(b->next_fd.get(), SHUT_RDWR);
  if (b->prev_fd.valid()) ::shutdown(b->prev_fd.get(), SHUT_RDWR);
}

epResult_t bootstrapClose(Bootstrap* b) {
  delete b;  // the Fd members close the ring sockets
  return epSuccess;
}

}  // namespace ep
