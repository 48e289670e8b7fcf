// The same RC connections set up through rdma_cm (EP_IB_CM=rdma_cm).
//
// comm_open makes an event channel and a listener bound to the port's IPv4
// address (from its RoCE v2 GID) on a free port; the endpoint blob carries
// that address and port. Of each pair, the lower rank connects (resolve
// address, resolve route, QP on the id, rdma_connect with a hello naming
// rank, class and QP index), the higher accepts. Every wait pumps every event
// of the channel, so a rank accepts a request whichever connect it is in:
// the ascending order of the core's connects never deadlocks. rdma_cm moves
// the QPs through their states itself; the traffic class goes in as the id's
// ToS, the ACK timeout as RDMA_OPTION_ID_ACK_TIMEOUT, the retry count in the
// connection parameters. A service level cannot be asked of rdma_cm (on
// InfiniBand the path record decides it): it is recorded as requested only.
//
// While the communicator runs, a DISCONNECTED event is how a peer's end
// shows up at once: a peer that closed on purpose wrote its closing mark
// first (data_path.cc), anything else is an error naming it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ib.h"
#include "wire.h"

namespace ibv {

namespace {

constexpr uint32_t kHelloMagic = 0x6570434du;  // 'epCM'

struct Hello {
  uint32_t magic;
  int32_t from;
  int32_t to;
  int32_t cls;
  int32_t qp;
};

int resolveMs(const Comm* comm) { return std::max(500, std::min(comm->info.timeout_ms, 5000)); }

void setIdOptions(Comm* comm, struct rdma_cm_id* id, epTrafficClass_t cls) {
  Context* c = comm->ctx;
  uint8_t tos = uint8_t(comm->info.classes[cls].traffic_class);
  if (c->cm.set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) != 0)
    logf(c, epTransportLogWarn, "rdma_cm: cannot set ToS %u: %s", unsigned(tos), strerror(errno));
  uint8_t timeout = uint8_t(comm->info.ib_timeout);
  if (c->cm.set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof(timeout)) != 0)
    logf(c, epTransportLogInfo, "rdma_cm: cannot set the ACK timeout (%u): %s; the kernel's default applies",
         unsigned(timeout), strerror(errno));
}

// The QP on an id, with the connection's completion queue.
epResult_t createCmQp(Conn* conn, Qp* q) {
  Comm* comm = conn->comm;
  Context* c = comm->ctx;
  struct ibv_qp_init_attr a = qpInitAttr(conn);
  if (c->cm.create_qp(q->id, comm->port.pd, &a) != 0) {
    a = qpInitAttr(conn);
    a.cap.max_inline_data = 0;
    if (c->cm.create_qp(q->id, comm->port.pd, &a) != 0)
      return fail(comm, epSystemError, conn->peer, "rank %d (%s): rdma_create_qp failed on %s: %s", conn->peer,
                  className(conn->cls), comm->port.device.c_str(), strerror(errno));
  }
  g_live_objects++;
  q->qp = q->id->qp;
  conn->max_inline = a.cap.max_inline_data;
  return epSuccess;
}

void acceptRequest(Comm* comm, struct rdma_cm_id* id, const Hello& h) {
  Context* c = comm->ctx;
  Conn* conn = (h.magic == kHelloMagic && h.to == comm->info.rank && h.cls >= 0 && h.cls < EP_TRAFFIC_CLASSES)
                   ? comm->conn(h.from, epTrafficClass_t(h.cls))
                   : nullptr;
  if (conn == nullptr || h.qp < 0 || h.qp >= int(conn->qps.size()) || conn->qps[size_t(h.qp)].id != nullptr) {
    logf(c, epTransportLogWarn, "rdma_cm: connection request from rank %d (class %d, QP %d) matches no endpoint: "
         "refused", h.from, h.cls, h.qp);
    c->cm.reject(id, nullptr, 0);
    c->cm.destroy_id(id);
    return;
  }
  Qp& q = conn->qps[size_t(h.qp)];
  q.id = id;
  id->context = conn;
  g_live_objects++;
  setIdOptions(comm, id, conn->cls);
  if (createCmQp(conn, &q) != epSuccess) return;
  struct rdma_conn_param param;
  memset(&param, 0, sizeof(param));
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.rnr_retry_count = 7;
  if (c->cm.accept(id, &param) != 0)
    fail(comm, epRemoteError, conn->peer, "rank %d (%s, QP %d): rdma_accept failed on %s: %s", conn->peer,
         className(conn->cls), h.qp, comm->port.device.c_str(), strerror(errno));
}

int qpIndex(const Conn* conn, const struct rdma_cm_id* id) {
  for (size_t i = 0; i < conn->qps.size(); i++)
    if (conn->qps[i].id == id) return int(i);
  return -1;
}

// One event of the channel, acknowledged, then acted on.
void handleEvent(Comm* comm, struct rdma_cm_event* ev) {
  Context* c = comm->ctx;
  const enum rdma_cm_event_type type = ev->event;
  const int status = ev->status;
  struct rdma_cm_id* id = ev->id;
  Hello hello;
  memset(&hello, 0, sizeof(hello));
  if (type == RDMA_CM_EVENT_CONNECT_REQUEST && ev->param.conn.private_data &&
      ev->param.conn.private_data_len >= sizeof(hello))
    memcpy(&hello, ev->param.conn.private_data, sizeof(hello));
  c->cm.ack_cm_event(ev);

  if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
    acceptRequest(comm, id, hello);
    return;
  }
  if (type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
    fail(comm, epRemoteError, -1, "device %s was removed (rdma_cm DEVICE_REMOVAL)", comm->port.device.c_str());
    return;
  }
  Conn* conn = static_cast<Conn*>(id->context);
  const int qi = conn ? qpIndex(conn, id) : -1;
  if (qi < 0) return;  // the listener's, or a connection closed meanwhile
  Qp& q = conn->qps[size_t(qi)];
  const int peer = conn->peer;
  switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (c->cm.resolve_route(id, resolveMs(comm)) != 0)
        fail(comm, epRemoteError, peer, "rank %d (%s): rdma_resolve_route failed: %s", peer, className(conn->cls),
             strerror(errno));
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (createCmQp(conn, &q) != epSuccess) break;
      Hello h = {kHelloMagic, comm->info.rank, peer, int32_t(conn->cls), qi};
      struct rdma_conn_param param;
      memset(&param, 0, sizeof(param));
      param.private_data = &h;
      param.private_data_len = sizeof(h);
      param.responder_resources = 1;
      param.initiator_depth = 1;
      param.retry_count = uint8_t(retryCount(comm));
      param.rnr_retry_count = 7;
      if (c->cm.connect(id, &param) != 0)
        fail(comm, epRemoteError, peer, "rank %d (%s): rdma_connect failed: %s", peer, className(conn->cls),
             strerror(errno));
      break;
    }
    case RDMA_CM_EVENT_ESTABLISHED: {
      q.established = true;
      // The kernel's connection manager sets the RNR timer to 0, which
      // means 655 ms between a peer's retries when this side's shared
      // receives ran out (wake.cc); the exchange setup's 0.64 ms instead.
      struct ibv_qp_attr a;
      memset(&a, 0, sizeof(a));
      a.min_rnr_timer = kMinRnrTimer;
      if (comm->wake && q.qp && c->v.modify_qp(q.qp, &a, IBV_QP_MIN_RNR_TIMER) != 0)
        logf(c, epTransportLogInfo, "rank %d (%s, QP %d): setting the RNR timer failed: %s", peer,
             className(conn->cls), qi, strerror(errno));
      break;
    }
    case RDMA_CM_EVENT_DISCONNECTED:
      q.established = false;
      if (peerMarkedClosed(conn)) {
        conn->peer_closed = true;
        break;
      }
      fail(comm, epRemoteError, peer,
           "rank %d (%s, QP %d) disconnected without closing (its process ended, or its node went away): rdma_cm "
           "DISCONNECTED on %s",
           peer, className(conn->cls), qi, comm->port.device.c_str());
      break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      fail(comm, epRemoteError, peer, "rank %d (%s, QP %d): rdma_cm %s (status %d) on %s toward %s", peer,
           className(conn->cls), qi, c->cm.event_str(type), status, comm->port.device.c_str(), conn->remote_desc);
      break;
    default:
      break;
  }
}

// Handles the events that are there, waiting at most wait_ms for the first.
void pump(Comm* comm, int wait_ms) {
  Context* c = comm->ctx;
  struct pollfd pfd = {comm->channel->fd, POLLIN, 0};
  if (poll(&pfd, 1, wait_ms) <= 0) return;
  struct rdma_cm_event* ev = nullptr;
  while (c->cm.get_cm_event(comm->channel, &ev) == 0) handleEvent(comm, ev);
}

bool allEstablished(const Conn* conn) {
  for (const Qp& q : conn->qps)
    if (!q.established) return false;
  return true;
}

}  // namespace

epResult_t cmOpen(Comm* comm) {
  Context* c = comm->ctx;
  if (!c->have_cm) return fail(comm, epNotSupported, -1, "EP_IB_CM=rdma_cm: %s", c->cm_why.c_str());
  if (comm->port.ipv4 == 0)
    return fail(comm, epNotSupported, -1,
                "EP_IB_CM=rdma_cm needs an IPv4 address on device %s port %d (a RoCE v2 GID that maps one); it has %s",
                comm->port.device.c_str(), comm->port.port, comm->port.roce ? "none" : "InfiniBand (use IPoIB)");
  comm->channel = c->cm.create_event_channel();
  if (comm->channel == nullptr) return fail(comm, epSystemError, -1, "rdma_create_event_channel: %s", strerror(errno));
  g_live_objects++;
  fcntl(comm->channel->fd, F_SETFL, fcntl(comm->channel->fd, F_GETFL) | O_NONBLOCK);
  if (c->cm.create_id(comm->channel, &comm->listener, nullptr, RDMA_PS_TCP) != 0)
    return fail(comm, epSystemError, -1, "rdma_create_id: %s", strerror(errno));
  g_live_objects++;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = comm->port.ipv4;
  char ip[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
  if (c->cm.bind_addr(comm->listener, reinterpret_cast<struct sockaddr*>(&addr)) != 0 ||
      c->cm.listen(comm->listener, 64) != 0)
    return fail(comm, epSystemError, -1, "rdma_cm cannot listen on %s (device %s): %s", ip, comm->port.device.c_str(),
                strerror(errno));
  comm->listen_port = c->cm.get_src_port(comm->listener);
  logf(c, epTransportLogInfo, "rank %d: rdma_cm listens on %s:%u (%s)", comm->info.rank, ip,
       unsigned(ntohs(comm->listen_port)), comm->port.device.c_str());
  return epSuccess;
}

void cmClose(Comm* comm) {
  Context* c = comm->ctx;
  if (comm->listener) {
    c->cm.destroy_id(comm->listener);
    g_live_objects--;
    comm->listener = nullptr;
  }
  if (comm->channel) {
    c->cm.destroy_event_channel(comm->channel);
    g_live_objects--;
    comm->channel = nullptr;
  }
}

epResult_t cmConnect(Conn* conn, const void* blob, size_t bytes) {
  Comm* comm = conn->comm;
  Context* c = comm->ctx;
  const int peer = conn->peer;
  WireEndpoint w;
  epResult_t res = checkEndpoint(conn, blob, bytes, &w);
  if (res != epSuccess) return res;
  struct sockaddr_in dst, src;
  memset(&dst, 0, sizeof(dst));
  dst.sin_family = AF_INET;
  dst.sin_addr.s_addr = w.ipv4;
  dst.sin_port = w.cm_port;
  char ip[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &dst.sin_addr, ip, sizeof(ip));
  snprintf(conn->remote_desc, sizeof(conn->remote_desc), "%s:%u (rdma_cm)", ip, unsigned(ntohs(w.cm_port)));
  if (comm->info.rank < peer) {  // the lower rank connects
    src = dst;
    src.sin_addr.s_addr = comm->port.ipv4;
    src.sin_port = 0;
    for (Qp& q : conn->qps) {
      if (c->cm.create_id(comm->channel, &q.id, conn, RDMA_PS_TCP) != 0)
        return fail(comm, epSystemError, peer, "rank %d: rdma_create_id: %s", peer, strerror(errno));
      g_live_objects++;
      setIdOptions(comm, q.id, conn->cls);
      if (c->cm.resolve_addr(q.id, reinterpret_cast<struct sockaddr*>(&src), reinterpret_cast<struct sockaddr*>(&dst),
                             resolveMs(comm)) != 0)
        return fail(comm, epRemoteError, peer, "rank %d (%s): rdma_resolve_addr %s failed: %s", peer,
                    className(conn->cls), ip, strerror(errno));
    }
  }
  const int64_t deadline = nowMs() + comm->info.timeout_ms;
  while (!allEstablished(conn)) {
    if (comm->failed()) return failedResult(comm);
    if (comm->info.aborted != nullptr && comm->info.aborted(comm->info.aborted_arg) != 0)
      return fail(comm, epAborted, peer, "rank %d (%s): the communicator was aborted (epCommAbort) while connecting",
                  peer, className(conn->cls));
    if (nowMs() > deadline)
      return fail(comm, epTimeout, peer, "rank %d (%s): no rdma_cm connection with %s within %d ms (%s)", peer,
                  className(conn->cls), conn->remote_desc, comm->info.timeout_ms,
                  comm->info.rank < peer ? "it did not accept" : "it did not connect");
    pump(comm, 50);
  }
  conn->connected = true;
  conn->last_post_ms = nowMs();
  return epSuccess;
}

epResult_t cmPoll(Comm* comm) {
  pump(comm, 0);
  return comm->failed() ? failedResult(comm) : epSuccess;
}

}  // namespace ibv
