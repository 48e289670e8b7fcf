// The data path: a put is an RDMA WRITE of the data, then (EP_PUT_SIGNAL) a
// second 8-byte RDMA WRITE of the signal value on the same QP.
//
// Why the signal is a write of the word and not an immediate's value: the
// caller polls the signal word in its memory. An RC QP executes its writes
// in order, so once the signal's write has landed the data's has too; the
// reader sees the data after it sees the new signal (the caller loads it
// with acquire). With the immediate alone, the receiver would have to poll
// its completion queue and store the word itself. The signal's write does go
// WITH IMMEDIATE to a peer that posts receives, only to wake it (wake.cc).
//
// Requests ask for a completion selectively: every kSignalEvery-th, the one
// that fills the send queue, the last of a put whose caller wants to test it,
// and the striped parts a signal waits for. Completions arrive in order per
// QP, so one completion retires every request posted before it on its QP.
// Small puts from host memory are sent inline (the NIC copies them at the
// post, without reading the registered memory later).
//
// Several QPs per connection (ib_qps_per_peer): a put of at least kStripeMin
// bytes is cut into one part per QP. Its signal must not land before every
// part has, so it waits in `pending` until the parts on QPs 1.. completed
// (their writes are acknowledged, hence placed), then goes on QP 0 behind the
// part there; every later signal queues behind it, keeping signals in put
// order. Smaller puts use QP 0 alone.
//
// No thread of the module's own: completions, connection events and
// asynchronous device events are looked at when the caller calls progress
// or wait (or put finds its queue full), so an idle rank burns no core here.

#include <fcntl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ib.h"

namespace ibv {

namespace {

constexpr uint64_t kIndexMask = (uint64_t(1) << 56) - 1;
constexpr uint32_t kMaxWrBytes = 1u << 30;  // one write request moves at most this much

uint64_t wrId(int qi, uint64_t index) { return (uint64_t(qi) << 56) | (index & kIndexMask); }

uint32_t room(const Conn* conn, const Qp& q) { return conn->depth - uint32_t(q.posted - q.completed); }

// Why a completion failed, in words a user can act on.
const char* statusHint(enum ibv_wc_status s) {
  switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
      return ": the peer does not acknowledge (its process is gone, or the link is down) after ib_retry_cnt "
             "retries of the ACK timeout (4.096 us x 2^ib_timeout)";
    case IBV_WC_REM_ACCESS_ERR: return ": the peer refused the write (remote key or address out of its registration)";
    case IBV_WC_WR_FLUSH_ERR: return ": the QP is in the error state (an earlier failure, or it was closed)";
    case IBV_WC_RNR_RETRY_EXC_ERR: return ": the peer had no receive posted";
    case IBV_WC_LOC_PROT_ERR: return ": local memory not registered (or not with this PD)";
    default: return "";
  }
}

// Posts an RDMA WRITE of len bytes on QP qi. src == nullptr with len 8:
// the 8-byte value (a signal, a keepalive) goes inline, or from the aux slot
// of its send-queue position where the NIC cannot send 8 bytes inline.
// wake: as WRITE WITH IMMEDIATE, which takes one of the peer's receives and
// wakes it if it sleeps in wait (signals, to a peer that posts receives).
epResult_t postWrite(Conn* conn, int qi, uint64_t laddr, uint32_t lkey, uint32_t len, bool may_inline,
                     const uint64_t* value, uint64_t raddr, uint32_t rkey, bool want_completion,
                     bool wake = false) {
  Comm* comm = conn->comm;
  Qp& q = conn->qps[size_t(qi)];
  const uint64_t index = q.posted;
  uint64_t v = value ? *value : 0;
  struct ibv_sge sge;
  memset(&sge, 0, sizeof(sge));
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.opcode = wake ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.imm_data = 0;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  if (value) {
    if (conn->max_inline >= 8) {
      sge.addr = reinterpret_cast<uint64_t>(&v);
      wr.send_flags |= IBV_SEND_INLINE;
    } else {
      uint64_t* slot = &conn->aux[8 + index % conn->depth];
      *slot = v;
      sge.addr = reinterpret_cast<uint64_t>(slot);
      sge.lkey = conn->aux_mr->lkey;
    }
    sge.length = 8;
  } else {
    sge.addr = laddr;
    sge.length = len;
    sge.lkey = lkey;
    if (may_inline && len <= conn->max_inline) wr.send_flags |= IBV_SEND_INLINE;
  }
  if (sge.length > 0) {
    wr.sg_list = &sge;
    wr.num_sge = 1;
  }
  // A completion now and then retires the unsignalled ones before it; the
  // request that fills the queue always asks for one, or the queue could
  // never be seen to drain.
  q.unsignalled++;
  if (want_completion || q.unsignalled >= kSignalEvery || room(conn, q) == 1) {
    wr.send_flags |= IBV_SEND_SIGNALED;
    q.unsignalled = 0;
    q.signalled = index + 1;
  }
  wr.wr_id = wrId(qi, index);
  struct ibv_send_wr* bad = nullptr;
  const int rc = comm->ctx->v.post_send(q.qp, &wr, &bad);
  if (rc != 0)
    return fail(comm, epRemoteError, conn->peer, "rank %d (%s, QP %d): posting an RDMA WRITE on %s port %d failed: %s%s",
                conn->peer, className(conn->cls), qi, comm->port.device.c_str(), comm->port.port, strerror(rc),
                deviceLost() ? " (the device is lost)" : rc == EINVAL ? " (the QP is no longer ready to send)" : "");
  q.posted++;
  conn->last_post_ms = nowMs();
  return epSuccess;
}

// Posts the signals whose striped data has landed, in put order, on QP 0.
epResult_t flushPending(Conn* conn) {
  while (!conn->pending.empty()) {
    const PendingSignal& s = conn->pending.front();
    for (size_t qi = 1; qi < conn->qps.size(); qi++)
      if (conn->qps[qi].completed < s.need[qi]) return epSuccess;
    if (room(conn, conn->qps[0]) == 0) return epSuccess;
    const epResult_t res = postWrite(conn, 0, 0, 0, 8, true, &s.value, s.addr, s.rkey, false, conn->peer_wakes);
    if (res != epSuccess) return res;
    conn->pending.pop_front();
  }
  return epSuccess;
}

epResult_t keepalive(Conn* conn, int64_t now) {
  if (!conn->connected || conn->closing || conn->peer_closed || now - conn->last_post_ms < kKeepaliveMs)
    return epSuccess;
  if (peerMarkedClosed(conn)) {  // it said goodbye: nothing more to ask of it
    conn->peer_closed = true;
    return epSuccess;
  }
  if (!conn->pending.empty() || room(conn, conn->qps[0]) < 2) return epSuccess;
  const uint64_t beat = uint64_t(now);
  return postWrite(conn, 0, 0, 0, 8, true, &beat, conn->peer_ka_addr, conn->peer_ka_rkey, true);
}

}  // namespace

// Asynchronous device events: a QP that went to the error state, a port that
// went down, a device that was lost. Read without blocking.
epResult_t asyncEvents(Comm* comm) {
  Context* c = comm->ctx;
  struct ibv_async_event ev;
  while (c->v.get_async_event(comm->port.ctx, &ev) == 0) {
    const enum ibv_event_type type = ev.event_type;
    int peer = -1;
    const char* cls = "";
    if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR) {
      for (const auto& conn : comm->conns)
        if (conn)
          for (const Qp& q : conn->qps)
            if (q.qp == ev.element.qp) peer = conn->peer, cls = className(conn->cls);
    }
    c->v.ack_async_event(&ev);
    switch (type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        if (peer < 0) break;  // a connection closed meanwhile
        return fail(comm, epRemoteError, peer, "rank %d (%s): its QP on %s port %d went to the error state (%s)", peer,
                    cls, comm->port.device.c_str(), comm->port.port, c->v.event_type_str(type));
      case IBV_EVENT_PORT_ERR: {
        if (int(ev.element.port_num) != comm->port.port) {  // another port of the device
          logf(c, epTransportLogInfo, "%s: port %d went down (not this communicator's)", comm->port.device.c_str(),
               int(ev.element.port_num));
          break;
        }
        // Every peer is reached through this port: the first one is named
        // (an error names one rank), the count says there are others.
        int first = -1, reached = 0;
        for (const auto& conn : comm->conns)
          if (conn && conn->connected) {
            if (first < 0 || conn->peer < first) first = conn->peer;
            reached++;
          }
        if (first < 0)
          return fail(comm, epRemoteError, -1, "port %d of %s went down (%s)", comm->port.port,
                      comm->port.device.c_str(), c->v.event_type_str(type));
        return fail(comm, epRemoteError, first, "port %d of %s went down (%s): rank %d and the others reached through "
                    "it (%d connections) are cut off", comm->port.port, comm->port.device.c_str(),
                    c->v.event_type_str(type), first, reached);
      }
      case IBV_EVENT_DEVICE_FATAL:
        return fail(comm, epRemoteError, -1, "device %s was lost (%s)", comm->port.device.c_str(),
                    c->v.event_type_str(type));
      case IBV_EVENT_SRQ_ERR:  // peers' signals would wait for receives for ever
      case IBV_EVENT_CQ_ERR:
        return fail(comm, epRemoteError, -1, "%s port %d: %s (a completion queue overran, or the shared receive "
                    "queue failed)", comm->port.device.c_str(), comm->port.port, c->v.event_type_str(type));
      case IBV_EVENT_SRQ_LIMIT_REACHED:  // this progress posts receives again (wake.cc), then re-arms it
        comm->srq_rearm = true;
        break;
      default:
        logf(c, epTransportLogInfo, "%s: event %s", comm->port.device.c_str(), c->v.event_type_str(type));
    }
  }
  return epSuccess;
}

bool peerMarkedClosed(const Conn* conn) { return __atomic_load_n(&conn->aux[0], __ATOMIC_ACQUIRE) == kClosedMark; }

int64_t nowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

epResult_t pollConn(Conn* conn) {
  Comm* comm = conn->comm;
  Context* c = comm->ctx;
  struct ibv_wc wc[16];
  for (;;) {
    const int n = c->v.poll_cq(conn->cq, 16, wc);
    if (n < 0)
      return fail(comm, epRemoteError, conn->peer, "rank %d (%s): polling the completion queue on %s port %d failed%s",
                  conn->peer, className(conn->cls), comm->port.device.c_str(), comm->port.port,
                  deviceLost() ? ": the device is lost" : "");
    for (int i = 0; i < n; i++) {
      const int qi = int(wc[i].wr_id >> 56);
      const uint64_t index = wc[i].wr_id & kIndexMask;
      if (qi >= int(conn->qps.size())) continue;
      Qp& q = conn->qps[size_t(qi)];
      enum ibv_wc_status status = wc[i].status;
      bool injected = false;
      if (q.fault_cqe && index >= q.fault_wr && status == IBV_WC_SUCCESS) {
        status = IBV_WC_GENERAL_ERR;
        injected = true;
        q.fault_cqe = false;
      }
      if (status != IBV_WC_SUCCESS && !injected && peerMarkedClosed(conn)) {
        // The peer closed on purpose: what was still in flight to it fails.
        conn->peer_closed = true;
        conn->connected = false;
        return epSuccess;
      }
      if (status != IBV_WC_SUCCESS)
        return fail(comm, epRemoteError, conn->peer,
                    "rank %d (%s, QP %d): an RDMA WRITE failed on %s port %d toward %s: %s (status %d, vendor error "
                    "0x%x)%s%s",
                    conn->peer, className(conn->cls), qi, comm->port.device.c_str(), comm->port.port,
                    conn->remote_desc, c->v.wc_status_str(status), int(status), wc[i].vendor_err, statusHint(status),
                    injected ? " [made by EP_IB_FAULT=cqe_error]" : "");
      q.completed = std::max(q.completed, index + 1);
    }
    comm->activity += uint64_t(n);
    if (n < 16) break;
  }
  return flushPending(conn);
}

epResult_t put(Conn* conn, Mem* mem, size_t offset, const void* remote_handle, size_t remote_offset, size_t bytes,
               size_t signal_offset, uint64_t signal_value, unsigned flags, uint64_t* request) {
  Comm* comm = conn->comm;
  if (comm->failed()) return failedResult(comm);
  const int peer = conn->peer;
  if (conn->peer_closed || peerMarkedClosed(conn)) {  // it closed on purpose and wants nothing more: dropped
    conn->peer_closed = true;
    if (request) *request = 0;
    return epSuccess;
  }
  if (!conn->connected) return fail(comm, epInvalidUsage, peer, "put to rank %d before its connection", peer);
  WireMem rm;
  memcpy(&rm, remote_handle, sizeof(rm));
  if (rm.magic != kMemMagic)
    return fail(comm, epInvalidArgument, peer, "put to rank %d: the remote handle is not an ibverbs memory handle", peer);
  const bool signal = (flags & EP_PUT_SIGNAL) != 0;
  if (remote_offset > rm.bytes || bytes > rm.bytes - remote_offset || (signal && (signal_offset > rm.bytes ||
                                                                                 rm.bytes - signal_offset < 8)))
    return fail(comm, epInvalidArgument, peer,
                "put to rank %d: %zu bytes at %zu (signal at %zu) do not fit its %llu-byte registration", peer, bytes,
                remote_offset, signal_offset, (unsigned long long)rm.bytes);
  if (bytes > 0 && (mem == nullptr || offset > mem->bytes || bytes > mem->bytes - offset))
    return fail(comm, epInvalidArgument, peer, "put to rank %d: %zu bytes at %zu are not inside the local registration",
                peer, bytes, offset);
  if (bytes == 0 && !signal) {
    if (request) *request = 0;
    return epSuccess;
  }

  const int nqps = int(conn->qps.size());
  const int parts = (nqps > 1 && bytes >= kStripeMin) ? nqps : 1;
  // Each QP's share, 4 KiB-aligned, and the requests it takes.
  size_t share[kMaxQpsPerConn] = {}, start[kMaxQpsPerConn] = {};
  uint32_t need_wrs[kMaxQpsPerConn] = {};
  const size_t unit = ((bytes / size_t(parts)) + 4095) & ~size_t(4095);
  size_t at = 0;
  for (int qi = 0; qi < parts; qi++) {
    start[qi] = at;
    share[qi] = std::min(bytes - at, qi == parts - 1 ? bytes - at : unit);
    at += share[qi];
    need_wrs[qi] = uint32_t((share[qi] + kMaxWrBytes - 1) / kMaxWrBytes);
  }
  const bool signal_now = signal && parts == 1 && conn->pending.empty();
  if (signal_now) need_wrs[0]++;
  auto fits = [&] {
    for (int qi = 0; qi < parts; qi++)
      if (room(conn, conn->qps[size_t(qi)]) < need_wrs[qi]) return false;
    return conn->pending.size() < conn->depth;
  };
  if (!fits()) {
    const epResult_t res = pollConn(conn);
    if (res != epSuccess) return res;
    if (!fits()) return epInProgress;
  }

  uint32_t rkey = rm.rkey;
  bool force_completion = false;
  comm->puts++;
  faultAtPut(conn, &rkey, &force_completion);

  const bool may_inline = mem && (mem->kind == EP_TRANSPORT_MEM_HOST || (flags & EP_PUT_INLINE_OK));
  for (int qi = 0; qi < parts; qi++) {
    size_t done = 0;
    while (done < share[qi]) {
      const uint32_t len = uint32_t(std::min<size_t>(share[qi] - done, kMaxWrBytes));
      const bool last = done + len == share[qi];
      // The parts a signal waits for, a tested put's last, and a faulted put's.
      const bool want = last && ((qi > 0) || (request != nullptr) || (force_completion && !signal_now));
      const epResult_t res =
          postWrite(conn, qi, reinterpret_cast<uint64_t>(mem->ptr) + offset + start[qi] + done, mem->mr->lkey, len,
                    may_inline, nullptr, rm.addr + remote_offset + start[qi] + done, rkey, want);
      if (res != epSuccess) return res;
      done += len;
    }
  }
  if (signal_now) {
    const epResult_t res =
        postWrite(conn, 0, 0, 0, 8, true, &signal_value, rm.addr + signal_offset, rkey, request || force_completion,
                  conn->peer_wakes);
    if (res != epSuccess) return res;
  } else if (signal) {
    PendingSignal s;
    for (int qi = 1; qi < parts; qi++) s.need[qi] = conn->qps[size_t(qi)].posted;
    s.addr = rm.addr + signal_offset;
    s.rkey = rkey;
    s.value = signal_value;
    conn->pending.push_back(s);
    const epResult_t res = flushPending(conn);
    if (res != epSuccess) return res;
  }
  if (request) {
    Request r;
    r.id = conn->next_request++;
    for (int qi = 0; qi < parts; qi++) r.need[qi] = conn->qps[size_t(qi)].posted;
    conn->requests.push_back(r);
    *request = r.id;
  }
  return epSuccess;
}

epResult_t test(Conn* conn, uint64_t request, int* done) {
  Comm* comm = conn->comm;
  *done = 0;
  if (comm->failed()) return failedResult(comm);
  const epResult_t res = pollConn(conn);
  if (res != epSuccess) return res;
  // A peer that closed on purpose takes nothing more: what was in flight to
  // it is done (its completions flushed with an error, or never come).
  if (request == 0 || conn->peer_closed) {
    *done = 1;
    return epSuccess;
  }
  auto complete = [conn](const Request& r) {
    for (size_t qi = 0; qi < conn->qps.size(); qi++)
      if (conn->qps[qi].completed < r.need[qi]) return false;
    return true;
  };
  // Retired requests leave the front: completions come in order per QP.
  while (!conn->requests.empty() && complete(conn->requests.front())) conn->requests.pop_front();
  if (request >= conn->next_request) return fail(comm, epInvalidArgument, conn->peer, "test: unknown request %llu",
                                                 (unsigned long long)request);
  *done = 1;
  for (const Request& r : conn->requests)
    if (r.id == request) *done = complete(r) ? 1 : 0;
  return epSuccess;
}

epResult_t progress(Comm* comm) {
  if (comm->failed()) return failedResult(comm);
  // The connections first: a failed poll there names its peer.
  for (const auto& conn : comm->conns) {
    if (!conn || !conn->connected) continue;
    const epResult_t res = pollConn(conn.get());
    if (res != epSuccess) return res;
  }
  if (comm->wake) {
    const epResult_t res = drainWake(comm);
    if (res != epSuccess) return res;
  }
  // Events and keepalives need no haste: one look in 64 calls, at least one
  // every kHousekeepingMs (a rank asleep in wait calls seldom), and at once
  // when wait saw an event come.
  static thread_local unsigned calls = 0;
  const int64_t now_ms = nowMs();
  if ((++calls & 63) != 0 && now_ms - comm->housekeeping_ms < kHousekeepingMs && !comm->events_pending)
    return epSuccess;
  comm->housekeeping_ms = now_ms;
  comm->events_pending = false;
  epResult_t res = asyncEvents(comm);
  if (res == epSuccess && comm->use_cm) res = cmPoll(comm);
  if (res != epSuccess) return res;
  for (const auto& conn : comm->conns) {
    if (!conn) continue;
    res = keepalive(conn.get(), now_ms);
    if (res != epSuccess) return res;
  }
  return epSuccess;
}

int drainBoundMs(const Comm* comm) {
  const double ack_ms = 4.096e-3 * double(uint64_t(1) << std::min(comm->info.ib_timeout, 31));
  const double window = ack_ms * double(comm->info.ib_retry_cnt + 1) + 200.0;
  return int(std::min<double>(window, double(std::max(comm->info.timeout_ms, 200))));
}

void drainConn(Conn* conn, int ms) {
  Comm* comm = conn->comm;
  if (!conn->connected || comm->failed()) return;
  // A last write on each QP that asks for a completion: once it completes,
  // every write before it on its QP was acknowledged by the peer. QP 0's is
  // the closing mark, after the pending signals.
  // A peer that closed first wants nothing more (its closing mark came after
  // everything it sent), and its QP may be gone: nothing to wait for.
  if (conn->peer_closed || peerMarkedClosed(conn)) return;
  const int64_t flush_end = nowMs() + ms;
  while (!conn->pending.empty() && nowMs() < flush_end) {
    if (pollConn(conn) != epSuccess) return;
    if (peerMarkedClosed(conn)) return;
  }
  for (size_t qi = conn->qps.size(); qi-- > 0;) {
    Qp& q = conn->qps[qi];
    if (room(conn, q) == 0) continue;
    const uint64_t word = qi == 0 ? kClosedMark : 0;
    const uint64_t addr = conn->peer_ka_addr + (qi == 0 ? 0 : 8);
    if (postWrite(conn, int(qi), 0, 0, 8, true, &word, addr, conn->peer_ka_rkey, true) != epSuccess) return;
  }
  const int64_t end = nowMs() + ms;
  while (nowMs() < end) {
    if (pollConn(conn) != epSuccess) return;
    if (peerMarkedClosed(conn)) return;
    bool idle = conn->pending.empty();
    for (const Qp& q : conn->qps) idle = idle && q.posted == q.completed;
    if (idle) return;
  }
}

}  // namespace ibv
