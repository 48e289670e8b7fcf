// The completion channel: a rank that waits for its peers sleeps instead of
// polling.
//
// The host backend waits for signal words that peers write with RDMA WRITE,
// which raises no completion on the side written to: nothing could wake it.
// So a signal to a peer that asks for it (kEndpointWakes in its endpoint) goes
// as RDMA WRITE WITH IMMEDIATE: the word still lands in memory as before, and
// the write also takes one receive of the peer's shared receive queue (srq),
// whose completion goes to wake_cq. wake_cq and every connection's CQ report
// to one completion channel.
//
// wait(): progress; if that took nothing, arm wake_cq and the CQs of the
// connections whose completions the caller may be waiting for, look once more (a completion that came before the arming raises no event), then
// sleep in ppoll on the channel and the device's asynchronous events until
// one comes or the timeout. The caller looks at its signal words after each
// return, so an early return costs a look, never a lost signal: whatever
// landed before this progress, the caller's last look saw.
//
// Receives are posted without a buffer (the immediate carries nothing the
// core reads) and posted again as their completions are taken, in progress.
// The queue is deep (kSrqDepth) so that peers' signals never find it empty
// while this rank is between calls; if they did, the peers' QPs would wait
// for a receive (RNR, retried without limit: rnr_retry 7), not fail.
#include <fcntl.h>
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <strings.h>

#include "ib.h"

namespace ibv {

namespace {

// Shared receives posted: room for kSrqPerPeer signals from every other rank
// between two of this rank's looks (a ring's heads and credits, call
// numbers, closing flags: some 2 x slots + 3 per peer and class), at least
// kSrqMin, at most kSrqMax, the device's max_srq_wr and the CQ's size.
constexpr uint32_t kSrqMin = 4096, kSrqMax = 65536, kSrqPerPeer = 96;
constexpr int kRepostBatch = 32;
// A rank that waits for a peer whose signals wake nobody (its module is older)
// sleeps at most this long at a time.
constexpr int kUnwokenSleepUs = 200;

bool wantWake(const Context* c) {
  const char* v = c->env->get_param("IB_COMPLETION_CHANNEL");
  if (v == nullptr || v[0] == '\0') return true;
  return !(strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 || strcasecmp(v, "false") == 0 ||
           strcasecmp(v, "no") == 0);
}

// Posts n receives without a buffer, in batches.
int postReceives(Comm* comm, uint32_t n) {
  struct ibv_recv_wr wrs[kRepostBatch];
  while (n > 0) {
    const uint32_t k = std::min<uint32_t>(n, kRepostBatch);
    memset(wrs, 0, sizeof(wrs[0]) * k);
    for (uint32_t i = 0; i < k; i++) {
      wrs[i].wr_id = 0;
      wrs[i].num_sge = 0;
      wrs[i].next = i + 1 < k ? &wrs[i + 1] : nullptr;
    }
    struct ibv_recv_wr* bad = nullptr;
    const int rc = ibv_post_srq_recv(comm->srq, wrs, &bad);
    if (rc != 0) return rc;
    n -= k;
  }
  return 0;
}

// Asks for IBV_EVENT_SRQ_LIMIT_REACHED once fewer than a quarter of the
// receives are left: the event wakes a rank asleep in wait, whose progress
// posts them again before peers find none (best effort: not every device
// has the limit).
void armLimit(Comm* comm) {
  struct ibv_srq_attr a;
  memset(&a, 0, sizeof(a));
  a.srq_limit = comm->srq_depth / 4;
  if (comm->ctx->v.modify_srq(comm->srq, &a, IBV_SRQ_LIMIT) != 0) {
    static bool said = false;
    if (!said)
      logf(comm->ctx, epTransportLogInfo, "%s: no limit event on the shared receive queue (%s)",
           comm->port.device.c_str(), strerror(errno));
    said = true;
  }
}

// The peer of a QP number (a receive's completion names its QP), or -1.
int peerOfQp(const Comm* comm, uint32_t qp_num) {
  for (const auto& conn : comm->conns)
    if (conn)
      for (const Qp& q : conn->qps)
        if (q.qp && q.qp->qp_num == qp_num) return conn->peer;
  return -1;
}

// A connection whose next completion the caller may be waiting for: a
// signal that waits for its striped parts, a put the caller tests, a send
// queue nearly full (put said epInProgress). Keepalives' completions wake
// nobody: a rank asleep for its peers' signals stays asleep.
bool awaitsCompletion(const Conn* conn) {
  if (!conn->pending.empty() || !conn->requests.empty()) return true;
  for (const Qp& q : conn->qps)
    if (q.completed < q.signalled && conn->depth - uint32_t(q.posted - q.completed) < 2 * kSignalEvery) return true;
  return false;
}

}  // namespace

void openWake(Comm* comm) {
  Context* c = comm->ctx;
  Port& p = comm->port;
  std::string why;
  auto failed = [&why](const char* what) {
    why = std::string(what) + " failed: " + strerror(errno);
    return false;
  };
  auto make = [&]() -> bool {
    if (!wantWake(c)) {
      why = "EP_IB_COMPLETION_CHANNEL=0";
      return false;
    }
    if (p.ctx->device->transport_type != IBV_TRANSPORT_IB) {  // iWARP has no immediates
      why = "not an InfiniBand or RoCE device";
      return false;
    }
    if (p.dev_attr.max_srq == 0 || p.dev_attr.max_srq_wr <= 0 || p.dev_attr.max_cqe <= 64) {
      why = "the device has no shared receive queue";
      return false;
    }
    const uint64_t wanted = uint64_t(kSrqPerPeer) * uint64_t(std::max(1, comm->info.nranks - 1));
    comm->srq_depth = uint32_t(std::min<uint64_t>(std::max<uint64_t>(wanted, kSrqMin), kSrqMax));
    comm->srq_depth = std::min(comm->srq_depth, uint32_t(p.dev_attr.max_srq_wr));
    comm->srq_depth = std::min(comm->srq_depth, uint32_t(p.dev_attr.max_cqe - 16));
    comm->comp_channel = c->v.create_comp_channel(p.ctx);
    if (comm->comp_channel == nullptr) return failed("ibv_create_comp_channel");
    g_live_objects++;
    const int fd = comm->comp_channel->fd;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    const int cqe = int(comm->srq_depth) + 16;  // every receive's completion fits
    comm->wake_cq = c->v.create_cq(p.ctx, cqe, nullptr, comm->comp_channel, 0);
    if (comm->wake_cq == nullptr) return failed("ibv_create_cq (receives)");
    g_live_objects++;
    struct ibv_srq_init_attr a;
    memset(&a, 0, sizeof(a));
    a.attr.max_wr = comm->srq_depth;
    a.attr.max_sge = 1;
    comm->srq = c->v.create_srq(p.pd, &a);
    if (comm->srq == nullptr) return failed("ibv_create_srq");
    g_live_objects++;
    const int rc = postReceives(comm, comm->srq_depth);
    if (rc != 0) {
      errno = rc;
      return failed("posting the shared receives");
    }
    armLimit(comm);
    return true;
  };
  if (!make()) {
    logf(c, epTransportLogInfo, "rank %d: no completion channel (%s): a waiting rank naps between looks",
         comm->info.rank, why.c_str());
    closeWake(comm);
    return;
  }
  comm->wake = true;
  logf(c, epTransportLogInfo, "rank %d: completion channel: peers' signals as WRITE WITH IMMEDIATE, %u shared "
       "receives; a waiting rank sleeps on the channel", comm->info.rank, comm->srq_depth);
}

void closeWake(Comm* comm) {
  Context* c = comm->ctx;
  if (comm->wake)
    logf(c, epTransportLogInfo, "rank %d: waits: %llu returned at once, %llu slept and were woken by a completion, "
         "%llu by a device or connection event, %llu by their timeout", comm->info.rank, (unsigned long long)comm->waits_at_once,
         (unsigned long long)comm->waits_woken, (unsigned long long)comm->waits_event,
         (unsigned long long)comm->waits_timed_out);
  comm->wake = false;
  if (comm->srq) {
    c->v.destroy_srq(comm->srq);
    comm->srq = nullptr;
    g_live_objects--;
  }
  if (comm->wake_cq) {
    c->v.destroy_cq(comm->wake_cq);
    comm->wake_cq = nullptr;
    g_live_objects--;
  }
  if (comm->comp_channel) {
    c->v.destroy_comp_channel(comm->comp_channel);
    comm->comp_channel = nullptr;
    g_live_objects--;
  }
}

epResult_t drainWake(Comm* comm) {
  Context* c = comm->ctx;
  struct ibv_wc wc[kRepostBatch];
  for (;;) {
    const int n = c->v.poll_cq(comm->wake_cq, kRepostBatch, wc);
    if (n < 0)
      return fail(comm, epRemoteError, -1, "polling the receive completion queue on %s port %d failed%s",
                  comm->port.device.c_str(), comm->port.port, deviceLost() ? ": the device is lost" : "");
    if (n == 0) break;
    // A receive flushed because its QP went to the error state is the
    // sending side's to report: the receive is only given back.
    for (int i = 0; i < n; i++)
      if (wc[i].status != IBV_WC_SUCCESS && wc[i].status != IBV_WC_WR_FLUSH_ERR) {
        const int peer = peerOfQp(comm, wc[i].qp_num);
        return fail(comm, epRemoteError, peer, "rank %d: a signal's receive failed on %s port %d: %s (status %d)",
                    peer, comm->port.device.c_str(), comm->port.port, c->v.wc_status_str(wc[i].status),
                    int(wc[i].status));
      }
    comm->activity += uint64_t(n);
    const int rc = postReceives(comm, uint32_t(n));
    if (rc != 0)
      return fail(comm, epRemoteError, -1, "posting receives again on %s port %d failed: %s%s",
                  comm->port.device.c_str(), comm->port.port, strerror(rc),
                  deviceLost() ? " (the device is lost)" : "");
    if (n < kRepostBatch) break;
  }
  if (comm->srq_rearm) {
    comm->srq_rearm = false;
    armLimit(comm);
  }
  return epSuccess;
}

epResult_t waitComm(Comm* comm, int timeout_us) {
  Context* c = comm->ctx;
  timeout_us = std::max(timeout_us, 0);
  if (!comm->wake) {
    struct timespec nap = {0, 1000L * std::min(timeout_us, 200)};
    nanosleep(&nap, nullptr);
    return progress(comm);
  }
  const uint64_t before = comm->activity;
  epResult_t res = progress(comm);
  if (res != epSuccess) return res;
  if (comm->activity != before) {
    comm->waits_at_once++;
    return res;
  }
  // Arm, then look again: what came between the two looks raised no event.
  int rc = ibv_req_notify_cq(comm->wake_cq, 0);
  if (rc != 0)
    return fail(comm, epRemoteError, -1, "arming the receive completion queue on %s failed: %s",
                comm->port.device.c_str(), strerror(rc));
  for (const auto& conn : comm->conns) {
    if (!conn || !conn->connected) continue;
    if (!conn->peer_sends_imm) timeout_us = std::min(timeout_us, kUnwokenSleepUs);
    if (awaitsCompletion(conn.get()) && (rc = ibv_req_notify_cq(conn->cq, 0)) != 0)
      return fail(comm, epRemoteError, conn->peer, "rank %d (%s): arming its completion queue on %s failed: %s",
                  conn->peer, className(conn->cls), comm->port.device.c_str(), strerror(rc));
  }
  res = drainWake(comm);
  for (const auto& conn : comm->conns)
    if (res == epSuccess && conn && conn->connected) res = pollConn(conn.get());
  if (res != epSuccess) return res;
  if (comm->activity != before) {
    comm->waits_at_once++;
    return res;
  }

  // The device's asynchronous events and rdma_cm's (a peer's disconnect)
  // wake it too: progress then reads them at once.
  struct pollfd fds[3] = {{comm->comp_channel->fd, POLLIN, 0},
                          {comm->port.ctx->async_fd, POLLIN, 0},
                          {comm->use_cm && comm->channel ? comm->channel->fd : -1, POLLIN, 0}};
  struct timespec ts = {timeout_us / 1000000, long(timeout_us % 1000000) * 1000L};
  if (ppoll(fds, 3, &ts, nullptr) < 0 && errno != EINTR)
    return fail(comm, epSystemError, -1, "waiting on the completion channel of %s: %s", comm->port.device.c_str(),
                strerror(errno));
  if (fds[0].revents & POLLIN) {
    comm->waits_woken++;
  } else if ((fds[1].revents | fds[2].revents) & POLLIN) {
    comm->waits_event++;
    comm->events_pending = true;
  } else {
    comm->waits_timed_out++;
  }
  if (fds[0].revents & POLLIN) {  // each event taken and acknowledged (destroy_cq waits for the acks)
    struct ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (c->v.get_cq_event(comm->comp_channel, &cq, &cq_ctx) == 0) c->v.ack_cq_events(cq, 1);
  }
  return epSuccess;
}

}  // namespace ibv
