// RC queue pairs, and their connection by endpoint exchange (the default).
//
// endpoint() makes the connection's completion queue, its QPs (moved to INIT)
// and a small registered buffer, and describes them in the endpoint blob: QP
// numbers and first PSNs, LID, GID, MTU, and where the peer's keepalive
// writes land. The core carries the blobs over its bootstrap; connect() moves
// each QP to RTR (the peer's QP, path and the class's SL / traffic class) and
// RTS (ib_timeout, ib_retry_cnt). Nothing is sent during setup: the core puts
// nothing before every rank's connects returned (the exchange of memory
// handles after them is collective), so a first write never reaches a QP that
// is not ready yet (it would be retransmitted after the ACK timeout).
#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "ib.h"
#include "wire.h"

namespace ibv {

namespace {

void gidText(const uint8_t* gid, char* out, size_t len) {
  char buf[INET6_ADDRSTRLEN] = "";
  inet_ntop(AF_INET6, gid, buf, sizeof(buf));
  snprintf(out, len, "GID %s", buf);
}

uint32_t randomPsn() {
  static std::mt19937 rng(std::random_device{}());
  return rng() & 0xffffffu;
}

}  // namespace

int retryCount(Comm* comm) {
  // Soft-RoCE (rxe) reads a retry count of 7 as "retry for ever", as the
  // spec has it for RNR retries only: a peer that died would never show up
  // as an error. There 7 becomes 6.
  if (comm->info.ib_retry_cnt == 7 && comm->port.device.compare(0, 3, "rxe") == 0) {
    static bool said = false;
    if (!said) logf(comm->ctx, epTransportLogInfo, "%s: retry count 6, not 7 (rxe retries for ever at 7)",
                    comm->port.device.c_str());
    said = true;
    return 6;
  }
  return comm->info.ib_retry_cnt;
}

struct ibv_qp_init_attr qpInitAttr(Conn* conn) {
  struct ibv_qp_init_attr a;
  memset(&a, 0, sizeof(a));
  a.send_cq = conn->cq;
  a.recv_cq = conn->cq;
  a.qp_type = IBV_QPT_RC;
  a.sq_sig_all = 0;  // selective signalling: each request says
  a.cap.max_send_wr = conn->depth;
  a.cap.max_recv_wr = 1;  // writes only: nothing is received
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = kInlineWanted;
  if (conn->comm->wake) {  // peers' signals (WRITE WITH IMMEDIATE) take the shared receives
    a.srq = conn->comm->srq;
    a.recv_cq = conn->comm->wake_cq;
    a.cap.max_recv_wr = 0;
    a.cap.max_recv_sge = 0;
  }
  return a;
}

epResult_t createConn(Comm* comm, int peer, epTrafficClass_t cls, Conn** out) {
  Context* c = comm->ctx;
  Port& p = comm->port;
  const int budget = comm->info.qp_budget;
  int made = 0;  // the QPs of this communicator's live connections (closed ones give theirs back)
  for (const auto& k : comm->conns)
    if (k) made += int(k->qps.size());
  const int nqps = comm->qpsOf(cls);
  if (budget > 0 && made + nqps > budget)
    return fail(comm, epInvalidUsage, peer, "rank %d (%s): %d more QPs would pass this rank's QP budget of %d "
                "(%d made; ib_qp_budget, EP_IB_QP_BUDGET)", peer, className(cls), nqps, budget,
                made);
  auto conn = std::make_unique<Conn>();
  conn->comm = comm;
  conn->peer = peer;
  conn->cls = cls;
  conn->depth = std::min<uint32_t>(kSendDepth, uint32_t(std::max(16, p.dev_attr.max_qp_wr)));
  const int cqe = std::min<int>(int(conn->depth) * nqps + 16, std::max(64, p.dev_attr.max_cqe));
  // With a channel, its completions can wake a rank asleep in wait.
  conn->cq = c->v.create_cq(p.ctx, cqe, conn.get(), comm->wake ? comm->comp_channel : nullptr, 0);
  if (conn->cq == nullptr)
    return fail(comm, epSystemError, peer, "rank %d (%s): ibv_create_cq of %d entries failed on %s: %s", peer,
                className(cls), cqe, p.device.c_str(), strerror(errno));
  g_live_objects++;
  conn->aux.assign(8 + conn->depth, 0);
  conn->aux_mr = c->v.reg_mr(p.pd, conn->aux.data(), conn->aux.size() * 8,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (conn->aux_mr == nullptr) {
    const int e = errno;
    const size_t aux_bytes = conn->aux.size() * 8;
    destroyConn(conn.release());
    return fail(comm, epSystemError, peer, "rank %d: cannot register %zu bytes on %s: %s", peer, aux_bytes,
                p.device.c_str(), strerror(e));
  }
  g_live_objects++;
  conn->qps.resize(size_t(nqps));
  if (!comm->use_cm) {  // rdma_cm makes its QPs on its ids, at connection
    for (Qp& q : conn->qps) {
      struct ibv_qp_init_attr a = qpInitAttr(conn.get());
      q.qp = c->v.create_qp(p.pd, &a);
      if (q.qp == nullptr) {  // a NIC without inline sends
        a = qpInitAttr(conn.get());
        a.cap.max_inline_data = 0;
        q.qp = c->v.create_qp(p.pd, &a);
      }
      if (q.qp == nullptr) {
        const int e = errno;
        const uint32_t depth = conn->depth;
        destroyConn(conn.release());
        return fail(comm, epSystemError, peer, "rank %d (%s): ibv_create_qp (RC, %u requests) failed on %s: %s",
                    peer, className(cls), depth, p.device.c_str(), strerror(e));
      }
      g_live_objects++;
      conn->max_inline = a.cap.max_inline_data;
      q.psn = randomPsn();
      struct ibv_qp_attr attr;
      memset(&attr, 0, sizeof(attr));
      attr.qp_state = IBV_QPS_INIT;
      attr.pkey_index = 0;
      attr.port_num = uint8_t(p.port);
      attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
      if (c->v.modify_qp(q.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        const int e = errno;
        destroyConn(conn.release());
        return fail(comm, epSystemError, peer, "rank %d: QP to INIT failed on %s: %s", peer, p.device.c_str(),
                    strerror(e));
      }
    }
  }
  *out = conn.release();
  return epSuccess;
}

void destroyConn(Conn* conn) {
  if (conn == nullptr) return;
  Context* c = conn->comm->ctx;
  for (Qp& q : conn->qps) {
    if (q.id) {  // rdma_cm: the id owns the QP
      if (q.established) c->cm.disconnect(q.id);
      if (q.qp) {
        c->cm.destroy_qp(q.id);
        g_live_objects--;
      }
      c->cm.destroy_id(q.id);
      g_live_objects--;
    } else if (q.qp) {
      c->v.destroy_qp(q.qp);
      g_live_objects--;
    }
    q = Qp();
  }
  if (conn->aux_mr) {
    c->v.dereg_mr(conn->aux_mr);
    g_live_objects--;
  }
  if (conn->cq) {
    c->v.destroy_cq(conn->cq);
    g_live_objects--;
  }
  delete conn;
}

epResult_t makeEndpoint(Conn* conn, void* buf, size_t* bytes) {
  Comm* comm = conn->comm;
  const Port& p = comm->port;
  if (*bytes < sizeof(WireEndpoint))
    return fail(comm, epInvalidArgument, conn->peer, "endpoint for rank %d: %zu bytes of room, %zu needed",
                conn->peer, *bytes, sizeof(WireEndpoint));
  WireEndpoint w;
  memset(&w, 0, sizeof(w));
  w.magic = kEndpointMagic;
  w.version = kEndpointVersion;
  w.mode = comm->use_cm ? 1 : 0;
  w.roce = p.roce ? 1 : 0;
  w.rank = comm->info.rank;
  w.peer = conn->peer;
  w.cls = int32_t(conn->cls);
  w.nqps = uint32_t(conn->qps.size());
  w.lid = p.attr.lid;
  w.port = uint8_t(p.port);
  w.mtu = uint8_t(p.attr.active_mtu);
  w.gid_index = p.gid_index;
  memcpy(w.gid, p.gid.raw, 16);
  w.ka_addr = reinterpret_cast<uint64_t>(conn->aux.data());
  w.ka_rkey = conn->aux_mr->rkey;
  w.ipv4 = p.ipv4;
  w.cm_port = comm->listen_port;
  w.flags = kEndpointSendsImm | (comm->wake ? kEndpointWakes : 0);
  for (size_t i = 0; i < conn->qps.size(); i++) {
    w.qpn[i] = conn->qps[i].qp ? conn->qps[i].qp->qp_num : 0;
    w.psn[i] = conn->qps[i].psn;
  }
  snprintf(w.device, sizeof(w.device), "%s", p.device.c_str());
  memcpy(buf, &w, sizeof(w));
  *bytes = sizeof(w);
  return epSuccess;
}

epResult_t checkEndpoint(Conn* conn, const void* blob, size_t bytes, WireEndpoint* w) {
  Comm* comm = conn->comm;
  const int peer = conn->peer;
  if (bytes < sizeof(WireEndpoint))
    return fail(comm, epInvalidArgument, peer, "rank %d's endpoint has %zu bytes, not %zu: not an ibverbs endpoint",
                peer, bytes, sizeof(WireEndpoint));
  memcpy(w, blob, sizeof(*w));
  if (w->magic != kEndpointMagic || w->version != kEndpointVersion)
    return fail(comm, epInvalidArgument, peer, "rank %d's endpoint is not an ibverbs endpoint of version %u", peer,
                unsigned(kEndpointVersion));
  if (w->rank != peer || w->peer != comm->info.rank || w->cls != int32_t(conn->cls))
    return fail(comm, epInvalidArgument, peer,
                "rank %d's endpoint was made by rank %d for rank %d (%s), not for this rank %d (%s)", peer, w->rank,
                w->peer, className(epTrafficClass_t(w->cls)), comm->info.rank, className(conn->cls));
  if (w->mode != (comm->use_cm ? 1 : 0))
    return fail(comm, epInvalidUsage, peer,
                "rank %d sets up connections %s, this rank %s: EP_IB_CM must be the same on every rank", peer,
                w->mode ? "through rdma_cm" : "by endpoint exchange",
                comm->use_cm ? "through rdma_cm" : "by endpoint exchange");
  if (w->nqps != conn->qps.size())
    return fail(comm, epInvalidUsage, peer, "rank %d opens %u QPs per connection, this rank %zu (ib_qps_per_peer)",
                peer, w->nqps, conn->qps.size());
  if ((w->roce != 0) != comm->port.roce)
    return fail(comm, epNotSupported, peer, "rank %d's port (%s) is %s, this rank's (%s) %s: they cannot connect",
                peer, w->device, w->roce ? "RoCE" : "InfiniBand", comm->port.device.c_str(),
                comm->port.roce ? "RoCE" : "InfiniBand");
  conn->peer_ka_addr = w->ka_addr;
  conn->peer_ka_rkey = w->ka_rkey;
  conn->peer_wakes = (w->flags & kEndpointWakes) != 0;
  conn->peer_sends_imm = (w->flags & kEndpointSendsImm) != 0;
  conn->peer_mtu = w->mtu;
  if (w->roce) gidText(w->gid, conn->remote_desc, sizeof(conn->remote_desc));
  else snprintf(conn->remote_desc, sizeof(conn->remote_desc), "LID %u", unsigned(w->lid));
  return epSuccess;
}

epResult_t connectExchange(Conn* conn, const void* blob, size_t bytes) {
  Comm* comm = conn->comm;
  Context* c = comm->ctx;
  const Port& p = comm->port;
  const int peer = conn->peer;
  WireEndpoint w;
  epResult_t res = checkEndpoint(conn, blob, bytes, &w);
  if (res != epSuccess) return res;
  const epTransportClass_v2_t& tc = comm->info.classes[conn->cls];
  for (size_t i = 0; i < conn->qps.size(); i++) {
    Qp& q = conn->qps[i];
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<enum ibv_mtu>(std::min<int>(p.attr.active_mtu, w.mtu));
    a.dest_qp_num = w.qpn[i];
    a.rq_psn = w.psn[i];
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = kMinRnrTimer;
    a.ah_attr.dlid = w.lid;
    a.ah_attr.sl = uint8_t(tc.service_level);
    a.ah_attr.port_num = uint8_t(p.port);
    if (p.roce) {  // RoCE routes by GID; the GRH carries the traffic class (DSCP << 2)
      a.ah_attr.is_global = 1;
      memcpy(a.ah_attr.grh.dgid.raw, w.gid, 16);
      a.ah_attr.grh.sgid_index = uint8_t(p.gid_index);
      a.ah_attr.grh.hop_limit = 64;
      a.ah_attr.grh.traffic_class = uint8_t(tc.traffic_class);
    }
    if (c->v.modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
      return fail(comm, epSystemError, peer, "rank %d (%s, QP %zu): QP to RTR failed on %s toward %s: %s", peer,
                  className(conn->cls), i, p.device.c_str(), conn->remote_desc, strerror(errno));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = uint8_t(comm->info.ib_timeout);
    a.retry_cnt = uint8_t(retryCount(comm));
    a.rnr_retry = 7;
    a.sq_psn = q.psn;
    a.max_rd_atomic = 1;
    if (c->v.modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                     IBV_QP_MAX_QP_RD_ATOMIC) != 0)
      return fail(comm, epSystemError, peer, "rank %d (%s, QP %zu): QP to RTS failed on %s: %s", peer,
                  className(conn->cls), i, p.device.c_str(), strerror(errno));
    q.remote_qpn = w.qpn[i];
  }
  conn->connected = true;
  conn->last_post_ms = nowMs();
  return epSuccess;
}

}  // namespace ibv
